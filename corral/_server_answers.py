"""Reading an omnigent server's answers: a body read within a cap, the typed error of a
refusal with its short human message, and ``Retry-After``. The runner's server client
(:mod:`corral.server_client`) reads every answer through these."""

from __future__ import annotations

import httpx
import msgspec

from ._exceptions import ServerProtocolError, ServerRejected


async def read_capped(response: httpx.Response, limit: int, method: str, path: str) -> bytes:
    declared = response.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise ServerProtocolError(
            f"{method} {path}: answer of {declared} bytes is over the {limit}-byte limit",
            method=method,
            path=path,
            status=response.status_code,
        )
    chunks = bytearray()
    async for chunk in response.aiter_bytes():
        chunks += chunk
        if len(chunks) > limit:
            raise ServerProtocolError(
                f"{method} {path}: answer is over the {limit}-byte limit",
                method=method,
                path=path,
                status=response.status_code,
            )
    return bytes(chunks)


def rejected(method: str, path: str, status: int, body: bytes) -> ServerRejected:
    code = None
    try:
        decoded = msgspec.json.decode(body)
    except msgspec.DecodeError:
        decoded = None
    if isinstance(decoded, dict):
        error = decoded.get("error")
        if isinstance(error, dict) and error.get("code") is not None:
            code = str(error["code"])
        elif isinstance(error, str):  # the runner-side shape {"error": "not_found", "detail"}
            code = error
    return ServerRejected(
        f"{method} {path} -> {status}: {detail(body)}",
        status=status,
        body=body,
        method=method,
        path=path,
        code=code,
    )


def detail(body: bytes) -> str:
    """A short human message from an error body.

    Both shapes are read: the 0.19 server's and runner's ``{"error": {"code", "message"}}``
    (PROTOCOL_0_19 §H.2) and the older ``{"error": "<code>", "detail": "<text>"}``, as well
    as a framework's bare ``{"detail": ...}``. The message is preferred, then the code.
    """
    try:
        decoded = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return clip(body.decode("utf-8", "replace")) or "(empty body)"
    if isinstance(decoded, dict):
        error = decoded.get("error")
        detail = decoded.get("detail")
        if isinstance(error, dict):
            text = error.get("message") or error.get("detail") or error.get("code")
            if text:
                return clip(str(text))
        if detail:
            text = detail if isinstance(detail, str) else msgspec.json.encode(detail).decode()
            return clip(text)
        if isinstance(error, str) and error:
            return clip(error)
    return clip(body.decode("utf-8", "replace")) or "(empty body)"


def clip(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def retry_after_s(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None
