"""The HTTP and WebSocket surface of the control plane, as a Starlette app.

Three kinds of callers share it:

* the runner's tunnel, ``GET /v1/runners/{runner_id}/tunnel`` (WebSocket, PROTOCOL_FACTS §i);
* the runner's own HTTP calls (§iii), authenticated by ``X-Omnigent-Runner-Tunnel-Token``;
* clients (``corral chat/send/agents``): agents, sessions, events, approvals, the event stream
  (``docs/control-plane.md``), authenticated by ``Authorization: Bearer <client token>``.

Every route but ``GET /api/version`` (a liveness probe that shows the protocol version only)
needs a credential, on loopback too: a loopback port is open to every user of the machine,
and the agents run commands as the user who runs corral. Each credential opens only its own
side (:data:`Access`, the credential's reasons in ``_plane/_credential.py``): the client token
never passes as the runner, nor the runner token as a client. ``GET /v1/sessions/{id}``,
``.../items`` and ``.../labels`` serve both, and so do the reads of a runner's session tools
(``GET /v1/agents``, ``GET /v1/sessions``, ``.../agent``, ``.../child_sessions``,
``/v1/runners/{id}/status``: ``_discovery.py``); on ``POST /v1/sessions/{id}/events`` the runner
posts ``external_conversation_item``, clients the other types, and either a ``message``; on
``POST /v1/sessions`` a client creates a session and the runner a child one (``_children.py``,
PROTOCOL_0_19.md §J). A refusal is 401
``unauthorized`` with a fixed detail that never holds what was presented.

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
from typing import Annotated, Any, Literal, NoReturn
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
from ._children import child_page, create_child
from ._discovery import agent_object, list_page
from ._plane import SERVER_VERSION, ControlPlane, Refused
from ._store import UnknownCursor
from ._tunnel import FRAME_PROTOCOL_VERSION, RunnerLink

__all__ = ["build_app"]

log = logging.getLogger("corral.server.http")

TOKEN_HEADER = "x-omnigent-runner-tunnel-token"
RUNNER_ORIGIN = "omnigent://internal"
_LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]"}
GENERIC_500 = "The server could not answer this request; the cause is in its log."
NO_CREDENTIAL = (
    "This call needs Authorization: Bearer <client token> (`corral token` prints it; "
    "docs/security.md)."
)
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

#: Who may call a route: ``open`` anyone, ``any`` the runner or a client, ``runner`` only the
#: runner (its tunnel token header), ``client`` only a client (the bearer client token).
Access = Literal["open", "any", "runner", "client"]
#: The one who made a request, once its credential is checked.
Caller = Literal["runner", "client"]


def endpoint(access: Access) -> Callable[[Handler], Handler]:
    """Wrap a handler: origin and credential checks, :class:`Refused` → its JSON error,
    anything else → 500."""

    def decorate(fn: Handler) -> Handler:
        @functools.wraps(fn)
        async def wrapper(self: _Api, request: Request) -> Response:
            try:
                _check_origin(request.headers)
                if access != "open":
                    request.state.caller = self._authenticate(request, access)
                _check_session_id(request)
                return await fn(self, request)
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

    def _caller(self, request: Request) -> Caller:
        """Who presented a valid credential: the runner (its tunnel token header, which wins
        when both are sent) or a client (the bearer client token).

        Raises:
            Refused: 401 for no credential or a wrong one.
        """
        token = request.headers.get(TOKEN_HEADER)
        if token is not None:
            if hmac.compare_digest(token.encode(), self.plane.runner_token.encode()):
                return "runner"
            raise Refused(401, "unauthorized", "The runner tunnel token is not valid.")
        scheme, _, credential = request.headers.get("authorization", "").partition(" ")
        credential = credential.strip()
        if scheme.lower() == "bearer" and credential:
            if self.plane.client_token.matches(credential):
                return "client"
            raise Refused(401, "unauthorized", "The client token is not valid.")
        raise Refused(401, "unauthorized", NO_CREDENTIAL)

    def _authenticate(self, request: Request, access: Access) -> Caller:
        """The caller, if ``access`` lets it in.

        Raises:
            Refused: 401 for no credential, a wrong one, or the other side's.
        """
        caller = self._caller(request)
        if access in ("runner", "client") and caller != access:
            self._refuse_side(access)
        return caller

    def _require(self, request: Request, side: Caller) -> None:
        """Narrow an ``any`` route to one side (a method or an event type of its own)."""
        if request.state.caller != side:
            self._refuse_side(side)

    @staticmethod
    def _refuse_side(side: Caller) -> NoReturn:
        if side == "runner":
            detail = f"This call is the runner's: it needs {TOKEN_HEADER}."
            raise Refused(401, "unauthorized", detail)
        raise Refused(401, "unauthorized", f"This call is a client's: {NO_CREDENTIAL}")

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

    @endpoint("open")
    async def version(self, request: Request) -> Response:
        """``GET /api/version`` (§iii.2)."""
        return JSONResponse({"version": SERVER_VERSION, "corral_version": __version__})

    @endpoint("any")
    async def health(self, request: Request) -> Response:
        """``GET /healthz``: is the runner connected, and how the tunnel fares."""
        return JSONResponse(self.plane.health())

    @endpoint("any")
    async def agents(self, request: Request) -> Response:
        """``GET /v1/agents``, sorted by name: the real server's list page (a runner's
        ``sys_agent_list`` reads it) with the ``agents`` of ``corral agents``."""
        agents = await self.plane.agents()
        names = sorted(agents)
        listing = [agents[name].listing() for name in names]
        objects = [agent_object(agents[name]) for name in names]
        return JSONResponse(list_page(objects, agents=listing))

    @endpoint("any")
    async def runner_status(self, request: Request) -> Response:
        """``GET /v1/runners/{id}/status``: whether that runner's tunnel is open."""
        runner_id = request.path_params["runner_id"]
        online = runner_id == self.plane.runner_id and self.plane.link is not None
        return JSONResponse({"runner_id": runner_id, "online": online})

    @endpoint("runner")
    async def runner_token(self, request: Request) -> Response:
        """``POST /v1/runners/{id}/token`` (§iii.1)."""
        # As the capture (§iii.1): a header-token server does not mint runner JWTs.
        message = "runner token minting is unsupported in this auth mode"
        return JSONResponse({"error": {"code": "invalid_input", "message": message}}, 400)

    # -- sessions ----------------------------------------------------------------------------

    @endpoint("any")
    async def sessions(self, request: Request) -> Response:
        """``GET /v1/sessions`` (newest first; ``agent_name`` filters) and the client's
        ``POST /v1/sessions``."""
        if request.method == "GET":
            limit = _int_param(request, "limit", 100, 1, 1000)
            wanted = request.query_params.get("agent_name")
            rows = await self.plane.store.list_sessions(limit)
            data = [
                {
                    **self.plane.session_object(r),
                    "agent_name": r.agent,
                    "parent_session_id": r.parent_session_id,
                }
                for r in rows
                if not wanted or r.agent == wanted
            ]
            return JSONResponse(list_page(data))
        if request.state.caller == "runner":  # a sub-agent's child session (§J)
            raw = await self._json(request, self.options.runner_max_body_bytes)
            child = await create_child(self.plane, raw)
            return JSONResponse(await self.plane.snapshot(child), status_code=201)
        self._require(request, "client")
        body = _convert(await self._json(request), CreateSession)
        key = _idempotency_key(request)
        row = await self.plane.create_session(body.agent, body.title, key)
        return JSONResponse(self.plane.session_object(row), status_code=201)

    @endpoint("any")
    async def session(self, request: Request) -> Response:
        """``GET /v1/sessions/{id}`` (client and runner), the runner's ``PATCH``, and the
        client's ``DELETE`` (PROTOCOL_0_19 §I.1)."""
        if request.method == "DELETE":
            self._require(request, "client")
            row = await self.plane.session(request.path_params["session_id"])
            return JSONResponse(await self.plane.delete_session(row))
        if request.method == "PATCH":
            self._require(request, "runner")
            raw = await self._json(request, self.options.runner_max_body_bytes)
            await self.plane.session(request.path_params["session_id"])
            patch = _convert(raw, SessionPatch)
            patched = await self.plane.store.patch_session(
                request.path_params["session_id"], patch.labels, patch.title
            )
            if patched is None:
                raise Refused(404, "not_found", "The session is gone.")
            return JSONResponse(await self.plane.snapshot(patched))
        row = await self.plane.session(request.path_params["session_id"])
        return JSONResponse(await self.plane.snapshot(row), headers={"cache-control": "no-store"})

    @endpoint("any")
    async def session_agent(self, request: Request) -> Response:
        """``GET .../agent``: the session's agent object."""
        row = await self.plane.session(request.path_params["session_id"])
        agent = (await self.plane.agents()).get(row.agent)
        if agent is None:
            raise Refused(404, "not_found", f"The agent {row.agent!r} is not loaded.")
        return JSONResponse(agent_object(agent))

    @endpoint("any")
    async def child_sessions(self, request: Request) -> Response:
        """``GET .../child_sessions`` (``_children.py``)."""
        page = await child_page(self.plane, request.path_params["session_id"], request.query_params)
        return JSONResponse(page)

    @endpoint("runner")
    async def agent_contents(self, request: Request) -> Response:
        """``GET .../agent/contents`` (§iii.3): the bundle."""
        row = await self.plane.session(request.path_params["session_id"])
        bundle, headers = await self.plane.agent_bundle(row)
        return Response(bundle, media_type="application/gzip", headers=headers)

    @endpoint("any")
    async def items(self, request: Request) -> Response:
        """``GET .../items?limit&order&after`` (§iii.6)."""
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

    @endpoint("any")
    async def labels(self, request: Request) -> Response:
        """``GET .../labels`` (§iii.7)."""
        row = await self.plane.session(request.path_params["session_id"])
        return JSONResponse(
            {"id": row.id, "labels": row.labels}, headers={"cache-control": "no-store"}
        )

    # -- the runner's calls ------------------------------------------------------------------

    @endpoint("runner")
    async def evaluate(self, request: Request) -> Response:
        """``POST .../policies/evaluate`` (§iii.8)."""
        raw = await self._json(request, self.options.runner_max_body_bytes)
        row = await self.plane.session(request.path_params["session_id"])
        body = _convert(raw, EvaluateRequest)
        event = body.event
        decision = await self.plane.evaluate(
            row, event.type, event.data or {}, event.request_data, event.target
        )
        reason = decision.prompt or decision.reason
        return _SpacedJSON({"result": decision.result, "reason": reason})

    @endpoint("runner")
    async def mcp(self, request: Request) -> Response:
        """``POST .../mcp`` (§iii.9): JSON-RPC ``tools/call``."""
        raw = await self._json(request, self.options.runner_max_body_bytes)
        row = await self.plane.session(request.path_params["session_id"])
        return _SpacedJSON(await self.plane.mcp(row, raw))

    # -- events ------------------------------------------------------------------------------

    @endpoint("any")
    async def events(self, request: Request) -> Response:
        """``POST .../events``: client events, and the runner's ``external_conversation_item``."""
        is_runner = request.state.caller == "runner"
        limit = self.options.runner_max_body_bytes if is_runner else None
        raw = await self._json(request, limit)
        if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
            raise Refused(422, "invalid_request", "An event is an object with a string 'type'.")
        kind = raw["type"]
        # The runner posts its own items; messages are a client's or the runner's (a
        # sub-agent's work, a parent's wake, §J); verdicts are a client's, and so are controls
        # but to a child session, which the runner stops for its parent (sys_cancel_task).
        row = await self.plane.session(request.path_params["session_id"])
        cancel = is_runner and kind in _CONTROL_EVENTS and row.parent_session_id is not None
        if kind != "message" and not cancel:
            self._require(request, "runner" if kind == "external_conversation_item" else "client")
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

    @endpoint("client")
    async def resolve(self, request: Request) -> Response:
        """``POST .../elicitations/{eid}/resolve``."""
        raw = await self._json(request)
        row = await self.plane.session(request.path_params["session_id"])
        verdict = _convert(raw, Verdict)
        answer = await self.plane.resolve(
            row, request.path_params["elicitation_id"], verdict.action, verdict.content
        )
        return JSONResponse(answer, status_code=202)

    @endpoint("client")
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
            self._sse(row.id, cursor, _bearer(request)),
            media_type="text/event-stream; charset=utf-8",
            headers=_SSE_HEADERS,
        )

    async def _sse(self, session_id: str, cursor: int, credential: str) -> AsyncIterator[str]:
        """Stored events after ``cursor`` in order, then live ones; keepalives in silences.

        The stream ends once ``credential`` is no longer the client token (it was rotated).
        """
        plane = self.plane
        while (
            not plane.closing.is_set()
            and session_id not in plane.deleted
            and plane.client_token.matches(credential)
        ):
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


def _bearer(request: Request) -> str:
    """The bearer credential of a request that passed :meth:`_Api._authenticate`."""
    return request.headers.get("authorization", "").partition(" ")[2].strip()


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
        ("/v1/runners/{runner_id}/status", api.runner_status, ["GET"]),
        ("/v1/sessions", api.sessions, ["GET", "POST"]),
        (s, api.session, ["GET", "PATCH", "DELETE"]),
        (f"{s}/agent", api.session_agent, ["GET"]),
        (f"{s}/agent/contents", api.agent_contents, ["GET"]),
        (f"{s}/child_sessions", api.child_sessions, ["GET"]),
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
