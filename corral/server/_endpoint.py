"""What every route of the control plane shares: who may call it, how its body is read, and
how a refusal is answered.

A route is a function ``async (api, request) -> Response`` wrapped in :func:`endpoint`, which
names who may call it (:data:`Access`). The wrapper checks the browser origin, the credential
and a session id in the path before the handler runs, turns a :class:`Refused` into the one
error shape (``{"error": <slug>, "detail": <text>}``) and anything else into a generic 500
whose cause is logged, not shown. :class:`Api` is the state the handlers share: the plane, its
options, the credential checks and the size-limited body reads.

Credentials: the runner sends its tunnel token in ``X-Omnigent-Runner-Tunnel-Token``, a client
``Authorization: Bearer <client token>``. Each opens only its own side: the client token never
passes as the runner, nor the runner token as a client. A refusal is 401 ``unauthorized`` with
a fixed detail that never holds what was presented.

Bodies are read with a size limit before they are parsed, so an oversized request costs at
most the limit in memory. A request with a browser ``Origin`` other than a loopback page is
refused (403), so a web page the user happens to visit cannot drive the agents through the
user's browser.
"""

from __future__ import annotations

import functools
import hmac
import json
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any, Literal, NoReturn
from urllib.parse import urlsplit

import msgspec
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .._exceptions import BadInput
from .._input import check_session_id, load_json
from ._plane import ControlPlane, Refused

__all__ = [
    "TOKEN_HEADER",
    "Access",
    "Api",
    "Caller",
    "Handler",
    "SpacedJSON",
    "check_origin",
    "convert",
    "endpoint",
    "error",
    "http_exception",
    "idempotency_key",
    "int_param",
]

log = logging.getLogger("corral.server.http")

TOKEN_HEADER = "x-omnigent-runner-tunnel-token"
RUNNER_ORIGIN = "omnigent://internal"
_LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]"}
GENERIC_500 = "The server could not answer this request; the cause is in its log."
NO_CREDENTIAL = (
    "This call needs Authorization: Bearer <client token> (`corral token` prints it; "
    "docs/security.md)."
)

#: Who may call a route: ``open`` anyone, ``any`` the runner or a client, ``runner`` only the
#: runner (its tunnel token header), ``client`` only a client (the bearer client token).
Access = Literal["open", "any", "runner", "client"]
#: The one who made a request, once its credential is checked.
Caller = Literal["runner", "client"]


def error(status: int, slug: str, detail: str) -> JSONResponse:
    """The one error shape: ``{"error": slug, "detail": text}``."""
    return JSONResponse({"error": slug, "detail": detail}, status_code=status)


class SpacedJSON(JSONResponse):
    """JSON with ``", "``/``": "`` separators, as the real server answers policy and MCP
    calls (§iii.8-9)."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=False).encode()


def convert(value: Any, kind: type[Any]) -> Any:
    """``value`` as the request body ``kind``.

    Raises:
        Refused: 422 ``invalid_request`` naming the field that does not fit.
    """
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as exc:
        raise Refused(422, "invalid_request", str(exc).replace("`", "")) from None


def check_origin(headers: Any) -> None:
    """Let in no browser origin but a loopback page (and the runner's own).

    Raises:
        Refused: 403 ``forbidden_origin``.
    """
    origin = headers.get("origin")
    if origin is None or origin == RUNNER_ORIGIN:
        return
    parts = urlsplit(origin)
    if parts.scheme in ("http", "https") and parts.hostname in _LOOPBACK_HOSTS:
        return
    raise Refused(403, "forbidden_origin", f"Requests from origin {origin!r} are not accepted.")


def _check_session_id(request: Request) -> None:
    """A session id in the path keeps the rule (:data:`corral._input.SESSION_ID_RULE`)."""
    session_id = request.path_params.get("session_id")
    if session_id is None:
        return
    try:
        check_session_id(session_id)
    except BadInput as exc:
        raise Refused(exc.status, exc.code, str(exc)) from None


class Api:
    """What the route handlers share: the plane, its options, credentials and bodies."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        self.options = plane.options

    def caller(self, request: Request) -> Caller:
        """Who presented a valid credential: the runner (its tunnel token header, which wins
        when both are sent) or a client (the bearer client token).

        Raises:
            Refused: 401 for no credential or a wrong one.
        """
        token = request.headers.get(TOKEN_HEADER)
        if token is not None:
            if self.is_runner_token(token):
                return "runner"
            raise Refused(401, "unauthorized", "The runner tunnel token is not valid.")
        scheme, _, credential = request.headers.get("authorization", "").partition(" ")
        credential = credential.strip()
        if scheme.lower() == "bearer" and credential:
            if self.plane.client_token.matches(credential):
                return "client"
            raise Refused(401, "unauthorized", "The client token is not valid.")
        raise Refused(401, "unauthorized", NO_CREDENTIAL)

    def is_runner_token(self, token: str) -> bool:
        """Whether ``token`` is the runner's, compared in constant time."""
        return hmac.compare_digest(token.encode(), self.plane.runner_token.encode())

    def authenticate(self, request: Request, access: Access) -> Caller:
        """The caller, if ``access`` lets it in.

        Raises:
            Refused: 401 for no credential, a wrong one, or the other side's.
        """
        caller = self.caller(request)
        if access in ("runner", "client") and caller != access:
            _refuse_side(access)
        return caller

    def require(self, request: Request, side: Caller) -> None:
        """Narrow an ``any`` route to one side (a method or an event type of its own).

        Raises:
            Refused: 401 when the caller is the other side.
        """
        if request.state.caller != side:
            _refuse_side(side)

    async def body(self, request: Request, limit: int | None = None) -> bytes:
        """The request body, at most ``limit`` bytes (``[server].max_body_bytes`` by default).

        Raises:
            Refused: 413 ``payload_too_large``.
        """
        limit = limit or self.plane.settings.max_body_bytes
        declared = request.headers.get("content-length")
        oversized = declared is not None and declared.isdigit() and int(declared) > limit
        body = bytearray()
        seen = 0
        async for chunk in request.stream():
            seen += len(chunk)
            if seen > limit:
                oversized = True
            if oversized:
                # Read and drop the rest (up to a bound), so the client reads the 413
                # instead of a connection reset while it is still sending.
                if seen > 8 * limit:
                    break
                continue
            body += chunk
        if oversized:
            raise Refused(413, "payload_too_large", f"The request body is over {limit} bytes.")
        return bytes(body)

    async def json(self, request: Request, limit: int | None = None) -> Any:
        """The request body parsed as JSON (see :meth:`body` for ``limit``).

        Raises:
            Refused: 413 for a body over the limit, 400 for one that is not JSON.
        """
        raw = await self.body(request, limit)
        try:
            return load_json(raw)
        except BadInput as exc:
            raise Refused(exc.status, exc.code, str(exc)) from None


def _refuse_side(side: Caller) -> NoReturn:
    if side == "runner":
        detail = f"This call is the runner's: it needs {TOKEN_HEADER}."
        raise Refused(401, "unauthorized", detail)
    raise Refused(401, "unauthorized", f"This call is a client's: {NO_CREDENTIAL}")


Handler = Callable[[Api, Request], Awaitable[Response]]


def endpoint(access: Access) -> Callable[[Handler], Handler]:
    """Wrap a handler: origin and credential checks, :class:`Refused` → its JSON error,
    anything else → 500."""

    def decorate(fn: Handler) -> Handler:
        @functools.wraps(fn)
        async def wrapper(api: Api, request: Request) -> Response:
            try:
                check_origin(request.headers)
                if access != "open":
                    request.state.caller = api.authenticate(request, access)
                _check_session_id(request)
                return await fn(api, request)
            except Refused as exc:
                # Once per refusal, without a traceback: the client's mistake, not the
                # plane's. The detail is a fixed text: never a credential.
                log.info(
                    "%s %s refused: %d %s: %s",
                    request.method,
                    request.url.path,
                    exc.status,
                    exc.slug,
                    exc.detail,
                )
                response = error(exc.status, exc.slug, exc.detail)
                if exc.status == 401:
                    response.headers["www-authenticate"] = 'Bearer realm="corral"'
                return response
            except Exception:
                log.exception("%s %s failed", request.method, request.url.path)
                return error(500, "internal_error", GENERIC_500)

        return wrapper

    return decorate


async def http_exception(request: Request, exc: Exception) -> Response:
    """Starlette's own 404/405 (no route, or not this method) in the one error shape."""
    assert isinstance(exc, HTTPException)
    slug = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    detail = (
        f"No route {request.method} {request.url.path}."
        if exc.status_code in (404, 405)
        else str(exc.detail)
    )
    return error(exc.status_code, slug, detail)


#: What an ``Idempotency-Key`` may be: 1 to 128 visible ASCII characters (a uuid fits).
_IDEMPOTENCY_KEY = re.compile(r"[!-~]{1,128}")


def idempotency_key(request: Request) -> str | None:
    """The request's ``Idempotency-Key`` header, if any: a client that retries a message
    or session POST whose answer it never got sends the same key, and it is stored once.

    Raises:
        Refused: 400 ``invalid_idempotency_key`` for one that breaks the rule.
    """
    key = request.headers.get("idempotency-key")
    if key is None:
        return None
    if not _IDEMPOTENCY_KEY.fullmatch(key):
        raise Refused(
            400,
            "invalid_idempotency_key",
            f"Idempotency-Key {key[:40]!r} breaks the rule: 1 to 128 visible ASCII characters.",
        )
    return key


def int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    """The integer query parameter ``name``, clamped to ``low..high``.

    Raises:
        Refused: 422 ``invalid_request`` for one that is not a number.
    """
    text = request.query_params.get(name)
    if text is None:
        return default
    if not re.fullmatch(r"\d{1,9}", text):
        raise Refused(422, "invalid_request", f"{name} must be an integer.")
    return max(low, min(int(text), high))
