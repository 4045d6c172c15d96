"""The HTTP and WebSocket surface of the control plane, as a Starlette app.

Three kinds of callers share it:

* the runner's tunnel, ``GET /v1/runners/{runner_id}/tunnel`` (WebSocket, PROTOCOL_FACTS §i);
* the runner's own HTTP calls (§iii), authenticated by ``X-Omnigent-Runner-Tunnel-Token``;
* clients (``corral chat/send/agents``): agents, sessions, events, approvals, the event stream
  (``docs/control-plane.md``).

``GET /v1/sessions/{id}`` and ``POST /v1/sessions/{id}/events`` serve both the runner and
clients: one snapshot answers both, and the runner's ``external_conversation_item`` needs the
token while the client event types do not.

Every error is JSON ``{"error": <slug>, "detail": <text>}``. Bodies are read with a size limit
before they are parsed, so an oversized request costs at most the limit in memory. An
unexpected exception is logged with its cause and answered with a generic 500 that does not
show it. A request with a browser ``Origin`` other than a loopback page is refused (403), so a
web page the user happens to visit cannot drive the agents through the user's browser.
"""

from __future__ import annotations

import contextlib
import functools
import hmac
import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import msgspec
import trio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from .. import __version__
from .._exceptions import BadInput
from .._input import check_session_id, load_json
from .._jsonlines import JsonObject
from ..server_client import runner_id_for_token
from ._plane import SERVER_VERSION, ControlPlane, Refused
from ._store import UnknownCursor
from ._tunnel import FRAME_PROTOCOL_VERSION, RunnerLink

__all__ = ["build_app"]

log = logging.getLogger("corral.server.http")

TOKEN_HEADER = "x-omnigent-runner-tunnel-token"
RUNNER_ORIGIN = "omnigent://internal"
_LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]"}
GENERIC_500 = "The server could not answer this request; the cause is in its log."
_SSE_HEADERS = {
    "cache-control": "no-cache",
    "x-accel-buffering": "no",
}
_CONTROL_EVENTS = ("interrupt", "stop_session", "compact")


# --- request bodies --------------------------------------------------------------------------


class CreateSession(msgspec.Struct, kw_only=True):
    """``POST /v1/sessions``."""

    agent: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    title: Annotated[str, msgspec.Meta(max_length=1000)] | None = None


class MessageData(msgspec.Struct, kw_only=True):
    """``data`` of a ``message`` event."""

    content: Annotated[str, msgspec.Meta(min_length=1)] | list[JsonObject]
    role: Literal["user"] = "user"


class Verdict(msgspec.Struct, kw_only=True):
    """``POST .../elicitations/{eid}/resolve``."""

    action: Literal["accept", "decline", "cancel"]
    content: JsonObject | None = None


class ApprovalData(Verdict, kw_only=True):
    """``data`` of an ``approval`` event."""

    elicitation_id: Annotated[str, msgspec.Meta(min_length=1)]


class SessionPatch(msgspec.Struct, kw_only=True):
    """``PATCH /v1/sessions/{id}`` (the runner's labels)."""

    labels: dict[str, str] | None = None
    title: Annotated[str, msgspec.Meta(max_length=1000)] | None = None


class Evaluation(msgspec.Struct, kw_only=True):
    """``event`` of a policy evaluation: the phase, the harness's data and, for a tool
    result, the call it answers (``request_data``, or the tool name as ``target``, §F.2)."""

    type: str
    data: JsonObject | None = None
    request_data: JsonObject | None = None
    target: str | None = None


class EvaluateRequest(msgspec.Struct, kw_only=True):
    """``POST .../policies/evaluate`` (§iii.8)."""

    event: Evaluation


# --- helpers ---------------------------------------------------------------------------------


def error(status: int, slug: str, detail: str) -> JSONResponse:
    """The one error shape: ``{"error": slug, "detail": text}``."""
    return JSONResponse({"error": slug, "detail": detail}, status_code=status)


class _SpacedJSON(JSONResponse):
    """JSON with ``", "``/``": "`` separators, as the real server answers policy and MCP
    calls (§iii.8-9)."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=False).encode()


def _convert(value: Any, kind: type[Any]) -> Any:
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as exc:
        raise Refused(422, "invalid_request", str(exc).replace("`", "")) from None


def _check_origin(headers: Any) -> None:
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


Handler = Callable[["_Api", Request], Awaitable[Response]]


def endpoint(fn: Handler) -> Callable[[_Api, Request], Awaitable[Response]]:
    """Wrap a handler: origin check, :class:`Refused` → its JSON error, anything else → 500."""

    @functools.wraps(fn)
    async def wrapper(self: _Api, request: Request) -> Response:
        try:
            _check_origin(request.headers)
            self._check_access(request)
            _check_session_id(request)
            return await fn(self, request)
        except Refused as exc:
            # Once per refusal, without a traceback: the client's mistake, not the plane's.
            log.info(
                "%s %s refused: %d %s: %s",
                request.method,
                request.url.path,
                exc.status,
                exc.slug,
                exc.detail,
            )
            return error(exc.status, exc.slug, exc.detail)
        except Exception:
            log.exception("%s %s failed", request.method, request.url.path)
            return error(500, "internal_error", GENERIC_500)

    return wrapper


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    slug = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    detail = (
        f"No route {request.method} {request.url.path}."
        if exc.status_code in (404, 405)
        else str(exc.detail)
    )
    return error(exc.status_code, slug, detail)


# --- the API ---------------------------------------------------------------------------------


class _Api:
    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        self.options = plane.options

    # -- plumbing ----------------------------------------------------------------------------

    def _is_runner(self, request: Request) -> bool:
        token = request.headers.get(TOKEN_HEADER)
        if token is None:
            return False
        if not hmac.compare_digest(token.encode(), self.plane.runner_token.encode()):
            raise Refused(401, "unauthorized", "The runner tunnel token is not valid.")
        return True

    def _check_access(self, request: Request) -> None:
        """On a non-loopback listener every caller must present the token (clients as
        ``Authorization: Bearer``): the agents run commands on this machine."""
        if not self.plane.public or self._is_runner(request):
            return
        scheme, _, credential = request.headers.get("authorization", "").partition(" ")
        token = self.plane.runner_token.encode()
        if scheme.lower() == "bearer" and hmac.compare_digest(credential.strip().encode(), token):
            return
        raise Refused(401, "unauthorized", "This server is not on loopback; send the token.")

    def _require_runner(self, request: Request) -> None:
        if not self._is_runner(request):
            raise Refused(401, "unauthorized", f"This call needs the {TOKEN_HEADER} header.")

    async def _body(self, request: Request, limit: int | None = None) -> bytes:
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

    async def _json(self, request: Request, limit: int | None = None) -> Any:
        raw = await self._body(request, limit)
        try:
            return load_json(raw)
        except BadInput as exc:
            raise Refused(exc.status, exc.code, str(exc)) from None

    # -- general -----------------------------------------------------------------------------

    @endpoint
    async def version(self, request: Request) -> Response:
        """``GET /api/version`` (§iii.2)."""
        return JSONResponse({"version": SERVER_VERSION, "corral_version": __version__})

    @endpoint
    async def health(self, request: Request) -> Response:
        """``GET /healthz``: is the runner connected, and how the tunnel fares."""
        return JSONResponse(self.plane.health())

    @endpoint
    async def agents(self, request: Request) -> Response:
        """``GET /v1/agents``, sorted by name."""
        agents = await self.plane.agents()
        listing = [agents[name].listing() for name in sorted(agents)]
        return JSONResponse({"agents": listing})

    @endpoint
    async def runner_token(self, request: Request) -> Response:
        """``POST /v1/runners/{id}/token`` (§iii.1)."""
        # As the capture (§iii.1): a header-token server does not mint runner JWTs.
        message = "runner token minting is unsupported in this auth mode"
        return JSONResponse({"error": {"code": "invalid_input", "message": message}}, 400)

    # -- sessions ----------------------------------------------------------------------------

    @endpoint
    async def sessions(self, request: Request) -> Response:
        """``GET /v1/sessions`` (newest first) and ``POST /v1/sessions``."""
        if request.method == "GET":
            limit = _int_param(request, "limit", 100, 1, 1000)
            rows = await self.plane.store.list_sessions(limit)
            return JSONResponse(
                {"object": "list", "data": [self.plane.session_object(r) for r in rows]}
            )
        body = _convert(await self._json(request), CreateSession)
        key = _idempotency_key(request)
        row = await self.plane.create_session(body.agent, body.title, key)
        return JSONResponse(self.plane.session_object(row), status_code=201)

    @endpoint
    async def session(self, request: Request) -> Response:
        """``GET /v1/sessions/{id}`` (client and runner), the runner's ``PATCH``, and the
        client's ``DELETE`` (PROTOCOL_0_19 §I.1)."""
        if request.method == "DELETE":
            row = await self.plane.session(request.path_params["session_id"])
            return JSONResponse(await self.plane.delete_session(row))
        if request.method == "PATCH":
            self._require_runner(request)
            raw = await self._json(request, self.options.runner_max_body_bytes)
            await self.plane.session(request.path_params["session_id"])
            patch = _convert(raw, SessionPatch)
            patched = await self.plane.store.patch_session(
                request.path_params["session_id"], patch.labels, patch.title
            )
            if patched is None:
                raise Refused(404, "not_found", "The session is gone.")
            return JSONResponse(await self.plane.snapshot(patched))
        self._is_runner(request)  # a wrong token is refused even where none is needed
        row = await self.plane.session(request.path_params["session_id"])
        return JSONResponse(await self.plane.snapshot(row), headers={"cache-control": "no-store"})

    @endpoint
    async def agent_contents(self, request: Request) -> Response:
        """``GET .../agent/contents`` (§iii.3): the bundle."""
        self._require_runner(request)
        row = await self.plane.session(request.path_params["session_id"])
        bundle, headers = await self.plane.agent_bundle(row)
        return Response(bundle, media_type="application/gzip", headers=headers)

    @endpoint
    async def items(self, request: Request) -> Response:
        """``GET .../items?limit&order&after`` (§iii.6)."""
        self._is_runner(request)
        row = await self.plane.session(request.path_params["session_id"])
        limit = _int_param(request, "limit", 20, 1, 100)
        order = request.query_params.get("order", "desc")
        if order not in ("asc", "desc"):
            raise Refused(422, "invalid_request", "order must be 'asc' or 'desc'.")
        after = request.query_params.get("after")
        try:
            page = await self.plane.store.list_items(row.id, limit=limit, order=order, after=after)
        except UnknownCursor:
            raise Refused(400, "invalid_cursor", f"No item {after!r} in this session.") from None
        return JSONResponse(page)

    @endpoint
    async def labels(self, request: Request) -> Response:
        """``GET .../labels`` (§iii.7)."""
        self._is_runner(request)
        row = await self.plane.session(request.path_params["session_id"])
        return JSONResponse(
            {"id": row.id, "labels": row.labels}, headers={"cache-control": "no-store"}
        )

    # -- the runner's calls ------------------------------------------------------------------

    @endpoint
    async def evaluate(self, request: Request) -> Response:
        """``POST .../policies/evaluate`` (§iii.8)."""
        self._require_runner(request)
        raw = await self._json(request, self.options.runner_max_body_bytes)
        row = await self.plane.session(request.path_params["session_id"])
        body = _convert(raw, EvaluateRequest)
        event = body.event
        decision = await self.plane.evaluate(
            row, event.type, event.data or {}, event.request_data, event.target
        )
        reason = decision.prompt or decision.reason
        return _SpacedJSON({"result": decision.result, "reason": reason})

    @endpoint
    async def mcp(self, request: Request) -> Response:
        """``POST .../mcp`` (§iii.9): JSON-RPC ``tools/call``."""
        self._require_runner(request)
        raw = await self._json(request, self.options.runner_max_body_bytes)
        row = await self.plane.session(request.path_params["session_id"])
        return _SpacedJSON(await self.plane.mcp(row, raw))

    # -- events ------------------------------------------------------------------------------

    @endpoint
    async def events(self, request: Request) -> Response:
        """``POST .../events``: client events, and the runner's ``external_conversation_item``."""
        is_runner = self._is_runner(request)
        limit = self.options.runner_max_body_bytes if is_runner else None
        raw = await self._json(request, limit)
        if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
            raise Refused(422, "invalid_request", "An event is an object with a string 'type'.")
        kind = raw["type"]
        if kind == "external_conversation_item" and not is_runner:
            raise Refused(401, "unauthorized", f"{kind} is a runner event; it needs the token.")
        row = await self.plane.session(request.path_params["session_id"])
        data = raw.get("data", {})
        answer: Mapping[str, object]
        if kind == "external_conversation_item":
            answer = await self.plane.add_runner_item(row, data)
        elif kind == "message":
            message = _convert(data, MessageData)
            key = _idempotency_key(request)
            answer = await self.plane.post_message(row, _content_blocks(message.content), key)
        elif kind == "approval":
            approval = _convert(data, ApprovalData)
            answer = await self.plane.resolve(
                row, approval.elicitation_id, approval.action, approval.content
            )
        elif kind in _CONTROL_EVENTS:
            answer = await self.plane.control(row, kind)
        else:
            known = ", ".join(("message", "approval", *_CONTROL_EVENTS))
            raise Refused(
                422, "unknown_event_type", f"Unknown event type {kind!r} (known: {known})."
            )
        return JSONResponse(answer, status_code=202)

    @endpoint
    async def resolve(self, request: Request) -> Response:
        """``POST .../elicitations/{eid}/resolve``."""
        raw = await self._json(request)
        row = await self.plane.session(request.path_params["session_id"])
        verdict = _convert(raw, Verdict)
        answer = await self.plane.resolve(
            row, request.path_params["elicitation_id"], verdict.action, verdict.content
        )
        return JSONResponse(answer, status_code=202)

    @endpoint
    async def stream(self, request: Request) -> Response:
        """``GET .../stream``: the session's events as SSE, resumable by event id."""
        row = await self.plane.session(request.path_params["session_id"])
        cursor_text = request.headers.get("last-event-id") or request.query_params.get("after")
        if cursor_text is None:
            cursor = row.last_event_id  # only new events
        elif re.fullmatch(r"\d{1,18}", cursor_text.strip()):
            cursor = int(cursor_text)
        else:
            raise Refused(
                400, "invalid_cursor", "Last-Event-ID / after must be an event id (an integer)."
            )
        return StreamingResponse(
            self._sse(row.id, cursor),
            media_type="text/event-stream; charset=utf-8",
            headers=_SSE_HEADERS,
        )

    async def _sse(self, session_id: str, cursor: int) -> AsyncIterator[str]:
        """Stored events after ``cursor`` in order, then live ones; keepalives in silences."""
        plane = self.plane
        while not plane.closing.is_set() and session_id not in plane.deleted:
            changed = plane.changed(session_id)  # before reading: no append slips between
            rows = await plane.store.events_after(session_id, cursor, 500)
            if rows:
                frames = []
                for seq, kind, data in rows:
                    frames.append(f"id: {seq}\nevent: {kind}\ndata: {data}\n\n")
                    cursor = seq
                yield "".join(frames)
                continue
            with trio.move_on_after(self.options.keepalive_s) as waited:
                await changed.wait()
            if waited.cancelled_caught:
                yield ": keepalive\n\n"

    # -- the tunnel --------------------------------------------------------------------------

    async def tunnel(self, ws: WebSocket) -> None:
        """``/v1/runners/{runner_id}/tunnel``: handshake checks of §i.3, then serve the link."""
        try:
            _check_origin(ws.headers)
        except Refused:
            log.warning("refused a tunnel from origin %r", ws.headers.get("origin"))
            await ws.close(code=1008)  # before accept: the upgrade is answered 403
            return
        await ws.accept()
        runner_id = ws.path_params["runner_id"]
        token = ws.headers.get(TOKEN_HEADER)
        refusal = None
        if not token:
            refusal = "runner tunnel token is required"
        elif not hmac.compare_digest(token.encode(), self.plane.runner_token.encode()):
            refusal = "unauthenticated"
        elif runner_id != runner_id_for_token(token):
            refusal = "runner_id does not match tunnel token"
        if refusal is not None:
            log.warning("refused a tunnel for %r: %s", runner_id, refusal)
            await _close(ws, 4004, refusal)
            return
        hello = await self._hello(ws)
        if hello is None:
            return
        link = RunnerLink(
            ws,
            runner_id,
            hello,
            ping_interval_s=self.options.ping_interval_s,
            ping_timeout_s=self.options.ping_timeout_s,
            on_batch=self.plane.ingest_batch,
        )
        await self.plane.run_link(link)
        await _close(ws, 1000, "")  # a no-op when the tunnel is already closed

    async def _hello(self, ws: WebSocket) -> JsonObject | None:
        """The first frame, if it is a valid ``hello``; else the tunnel is closed (4001/4002)."""
        message: Mapping[str, Any] | None = None
        with trio.move_on_after(self.options.hello_timeout_s):
            try:
                message = await ws.receive()
            except WebSocketDisconnect:
                return None
        if message is None:
            await _close(ws, 4001, "expected hello frame")
            return None
        if message["type"] == "websocket.disconnect":
            return None
        try:
            frame = load_json((message.get("text") or "").encode(), "the hello frame")
        except BadInput:
            frame = None
        if not isinstance(frame, dict) or frame.get("kind") != "hello":
            await _close(ws, 4001, "expected hello frame")
            return None
        capabilities = frame.get("capabilities", [])
        if not isinstance(capabilities, list) or not all(isinstance(c, str) for c in capabilities):
            # The real server cannot decode such a hello either (§A.2).
            await _close(ws, 4001, "expected hello frame")
            return None
        version = frame.get("frame_protocol_version")
        if version != FRAME_PROTOCOL_VERSION:
            reason = (
                f"frame_protocol_version mismatch: server supports {FRAME_PROTOCOL_VERSION}, "
                f"runner sent {version}"
            )
            await _close(ws, 4002, reason)
            return None
        return frame


async def _close(ws: WebSocket, code: int, reason: str) -> None:
    with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
        await ws.close(code=code, reason=reason)


#: What an ``Idempotency-Key`` may be: 1 to 128 visible ASCII characters (a uuid fits).
_IDEMPOTENCY_KEY = re.compile(r"[!-~]{1,128}")


def _idempotency_key(request: Request) -> str | None:
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


def _int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    text = request.query_params.get(name)
    if text is None:
        return default
    if not re.fullmatch(r"\d{1,9}", text):
        raise Refused(422, "invalid_request", f"{name} must be an integer.")
    return max(low, min(int(text), high))


def _content_blocks(content: str | list[JsonObject]) -> list[JsonObject]:
    """A message's content as a list of blocks (a plain string is one ``input_text``)."""
    if isinstance(content, str):
        return [{"type": "input_text", "text": content}]
    if not content:
        raise Refused(422, "invalid_request", "content must not be empty.")
    for i, block in enumerate(content):
        if not isinstance(block.get("type"), str):
            raise Refused(422, "invalid_request", f"content[{i}] needs a string 'type'.")
    return content


def build_app(plane: ControlPlane) -> Starlette:
    """The Starlette app serving ``plane``."""
    api = _Api(plane)
    s = "/v1/sessions/{session_id}"
    table = [
        ("/api/version", api.version, ["GET"]),
        ("/healthz", api.health, ["GET"]),
        ("/v1/agents", api.agents, ["GET"]),
        ("/v1/runners/{runner_id}/token", api.runner_token, ["POST"]),
        ("/v1/sessions", api.sessions, ["GET", "POST"]),
        (s, api.session, ["GET", "PATCH", "DELETE"]),
        (f"{s}/agent/contents", api.agent_contents, ["GET"]),
        (f"{s}/items", api.items, ["GET"]),
        (f"{s}/labels", api.labels, ["GET"]),
        (f"{s}/policies/evaluate", api.evaluate, ["POST"]),
        (f"{s}/mcp", api.mcp, ["POST"]),
        (f"{s}/events", api.events, ["POST"]),
        (f"{s}/elicitations/{{elicitation_id}}/resolve", api.resolve, ["POST"]),
        (f"{s}/stream", api.stream, ["GET"]),
    ]
    routes: list[Route | WebSocketRoute] = [
        Route(path, handler, methods=methods) for path, handler, methods in table
    ]
    routes.append(WebSocketRoute("/v1/runners/{runner_id}/tunnel", api.tunnel))
    return Starlette(routes=routes, exception_handlers={HTTPException: _http_exception})
