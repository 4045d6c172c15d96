"""A fake omnigent 0.19.1 server's runner-tunnel endpoint, written from PROTOCOL_0_19.md (and
PROTOCOL_FACTS.md §i, §ii, §v.6 for what 0.19 left unchanged).

It runs in the test's trio loop on 127.0.0.1 (``await tunnels.start(nursery)``) and speaks the
server side of the tunnel:

* accepts ``[<prefix>]/v1/runners/{id}/tunnel`` upgrades; refuses a foreign ``Origin`` with
  HTTP 403 (or any status set in ``reject_status``); with a token header, closes with 4004
  when the id is not ``runner_token_ + sha256("omnigent-runner:" + token)[:32]``;
* requires ``hello`` first (4001 otherwise) with ``frame_protocol_version`` 1 (4002) and, if
  present, ``capabilities`` a list of strings and ``connection_id`` a string (else a violation
  and 4001); answers ``event.ready`` when the hello lists ``session-event-ingest-v1`` (§A.3);
* closes a replaced tunnel (same runner id) with 4000, and any tunnel on demand
  (``close_after_hello[runner_id] = (code, reason)``, :meth:`Tunnel.close`);
* sends ``request`` frames the way the server's httpx client does and collects the
  ``response.head|body|end`` frames per id (:class:`Response`), noting protocol violations
  (a body before the head, frames after the end, unknown ids);
* relays session streams: ``GET /v1/sessions/{id}/stream`` bodies are parsed as SSE and
  every non-heartbeat event is appended to ``events[session_id]`` — the server's view, across
  every stream and every tunnel. Like the real relay it validates each event: a ``type``
  outside :data:`ACCEPTED_STREAM_TYPES` (§D.2; the real server cuts every client's stream on
  one) and a ``response.output_item.done`` item the server could not persist (§E.1) are
  logged as errors and recorded in ``stream_violations`` (and the tunnel's ``violations``);
  the event is not kept. ``data: [DONE]`` ends a stream cleanly (§D.1), and the server
  then sends ``request.cancel`` for it as the real one does (§A.5);
* on each (re)connect, re-inits the sessions bound to the runner (``bind``): ``POST
  /v1/sessions`` with the 0.19 ``session_init`` v2 envelope (§B.1), then ``GET .../stream``.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

import trio
from trio_websocket import (
    ConnectionClosed,
    WebSocketConnection,
    WebSocketRequest,
    serve_websocket,
)
from wsproto.connection import ConnectionState

log = logging.getLogger("tests.fake_tunnel_server")


def _no_pong_after_close() -> None:
    """Let a ping that crosses this server's close go unanswered, as RFC 6455 wants (§5.5.1:
    nothing after a Close but a Close). trio-websocket 0.12.2 answers it and wsproto raises
    ``LocalProtocolError`` in the connection's reader task, which ends the whole fake server;
    the gateway pings after every stream frame to learn what the server read, so a close in
    the middle of a stream meets one."""
    answer = WebSocketConnection._handle_ping_event

    async def handle(self: WebSocketConnection, event: Any) -> None:
        if self._wsproto.state == ConnectionState.OPEN:
            await answer(self, event)

    WebSocketConnection._handle_ping_event = handle  # type: ignore[method-assign]


_no_pong_after_close()

SERVER_VERSION = "0.19.1"
EVENT_INGEST = "session-event-ingest-v1"
#: The ``type`` tags the server's client stream accepts (§D.2, the ``ServerStreamEvent`` union
#: of omnigent 0.19.1). Written out here, independently of corral's own list.
ACCEPTED_STREAM_TYPES = frozenset(
    {
        "session.status",
        "session.usage",
        "session.model",
        "session.title",
        "session.reasoning_effort",
        "session.collaboration_mode",
        "session.permission_mode",
        "session.codex_approval_mode",
        "session.agent_changed",
        "session.todos",
        "session.terminal_pending",
        "session.sandbox_status",
        "session.mcp_startup",
        "session.model_options",
        "session.input.consumed",
        "session.interrupted",
        "session.created",
        "session.superseded",
        "session.btw_sidechat",
        "session.presence",
        "session.resource.created",
        "session.resource.deleted",
        "session.child_session.updated",
        "session.changed_files.invalidated",
        "session.terminal.activity",
        "session.heartbeat",
        "response.output_text.delta",
        "response.function_call_output.delta",
        "response.reasoning.started",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
        "response.output_item.done",
        "response.output_file.done",
        "response.heartbeat",
        "response.elicitation_request",
        "response.elicitation_resolved",
        "browser.action_request",
        "response.policy_denied",
        "response.created",
        "response.queued",
        "response.in_progress",
        "response.completed",
        "response.failed",
        "response.cancelled",
        "response.incomplete",
        "response.retry",
        "response.error",
        "response.compaction.in_progress",
        "response.compaction.completed",
        "response.compaction.failed",
        "response.client_task.cancel",
        "turn.started",
        "turn.completed",
        "turn.failed",
        "turn.cancelled",
    }
)


def item_violation(item: Any) -> str | None:
    """Why the relay would drop a ``response.output_item.done`` item (§E.1), or None.

    Only ``message``, completed ``function_call`` and ``function_call_output`` items are
    parsed (by field name, extra keys ignored); a failure is logged by the real server as
    ``Failed to parse persistent item from SSE: <type>`` and the item is not persisted.
    """
    if not isinstance(item, dict):
        return "the item is not an object"
    kind = item.get("type")
    if kind == "function_call" and item.get("status") == "completed":
        for name in ("agent", "name", "arguments", "call_id"):
            if not isinstance(item.get(name), str):
                return f"a completed function_call needs a string {name!r}"
    elif kind == "message":
        if item.get("role") not in ("user", "assistant"):
            return f"a message's role must be user or assistant, not {item.get('role')!r}"
        if not isinstance(item.get("content"), list):
            return "a message needs a content list"
        if item["role"] == "assistant" and not isinstance(item.get("agent"), str):
            return "an assistant message needs a string 'agent'"
    elif kind == "function_call_output":
        for name in ("call_id", "output"):
            if not isinstance(item.get(name), str):
                return f"a function_call_output needs a string {name!r}"
    return None


def stream_violation(event: Any) -> str | None:
    """Why the server's relay would reject a session stream event, or None."""
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        return f"a stream event without a string type: {event!r:.120}"
    if event["type"] not in ACCEPTED_STREAM_TYPES:
        return f"stream event type {event['type']!r} is not in the server's union"
    if event["type"] == "response.output_item.done":
        why = item_violation(event.get("item"))
        if why is not None:
            item = event.get("item")
            kind = item.get("type") if isinstance(item, dict) else None
            return f"output item {kind!r} would not be persisted: {why}"
    return None


_PATH = re.compile(r"^(?P<prefix>.*)/v1/runners/(?P<runner_id>[^/]+)/tunnel$")
#: The headers the server's httpx client puts on every tunnelled request (§ii).
_BASE_HEADERS = [
    ["host", "runner"],
    ["accept", "*/*"],
    ["accept-encoding", "gzip, deflate, zstd"],
    ["connection", "keep-alive"],
    ["user-agent", "python-httpx/0.28.1"],
]


def token_bound_runner_id(token: str) -> str:
    """§i.1, computed here independently of corral's own code."""
    return "runner_token_" + hashlib.sha256(f"omnigent-runner:{token}".encode()).hexdigest()[:32]


@dataclass
class Response:
    """One tunnelled request's answer, as the server receives it."""

    id: str
    status: int | None = None
    headers: list[list[str]] = field(default_factory=list)
    chunks: list[tuple[str, bytes]] = field(default_factory=list)  # (encoding, bytes)
    ended: bool = False
    head_seen: trio.Event = field(default_factory=trio.Event)
    done: trio.Event = field(default_factory=trio.Event)
    changed: trio.Event = field(default_factory=trio.Event)

    @property
    def body(self) -> bytes:
        return b"".join(data for _, data in self.chunks)

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name), None)

    async def wait(self, timeout: float = 10) -> Response:
        with trio.fail_after(timeout):
            await self.done.wait()
        return self


@dataclass
class Stream:
    """A server-side relay of one ``GET /v1/sessions/{id}/stream``."""

    session_id: str
    response: Response
    events: list[dict[str, Any]] = field(default_factory=list)
    heartbeats: int = 0
    first_was_heartbeat: bool | None = None
    #: Events per ``response.body`` frame, in order (coalescing shows here).
    frame_sizes: list[int] = field(default_factory=list)
    #: The runner ended the stream with ``data: [DONE]``.
    done: bool = False


class Tunnel:
    """The server's end of one runner tunnel."""

    def __init__(self, server: FakeTunnelServer, ws: WebSocketConnection, request: Any) -> None:
        self.server = server
        self.ws = ws
        self.path: str = request.path
        self.headers = {k.decode().lower(): v.decode() for k, v in request.headers}
        match = _PATH.match(urlsplit(self.path).path)
        assert match is not None
        self.prefix = match.group("prefix")
        self.runner_id = unquote(match.group("runner_id"))
        self.hello: dict[str, Any] | None = None
        #: ``event.ready`` was sent on this tunnel.
        self.event_ready = False
        self.responses: dict[str, Response] = {}
        self.streams: dict[str, Stream] = {}
        self.received: list[dict[str, Any]] = []
        #: Every frame this end sent (JSON ones, decoded).
        self.sent: list[dict[str, Any]] = []
        self.violations: list[str] = []
        self.pongs: dict[int, trio.Event] = {}
        self.closed = trio.Event()
        self.close_code: int | None = None
        self.close_reason: str | None = None
        self.paused = False
        self._resume = trio.Event()

    # -- sending -----------------------------------------------------------------------------

    async def send(self, frame: dict[str, Any] | str) -> None:
        if isinstance(frame, dict):
            self.sent.append(frame)
        await self.ws.send_message(frame if isinstance(frame, str) else json.dumps(frame))

    def start_request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: str = "",
        raw: bytes | None = None,
        encoding: str | None = None,
        content_type: str = "application/json",
        request_id: str | None = None,
    ) -> tuple[Response, dict[str, Any]]:
        """The frame of a request (not yet sent) and the Response that will collect its answer."""
        request_id = request_id or uuid.uuid4().hex
        headers = [list(h) for h in _BASE_HEADERS]
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        text: str | None = None
        enc = "utf-8"
        if data is not None:
            headers += [["content-length", str(len(data))], ["content-type", content_type]]
            enc = encoding or "utf-8"
            text = base64.b64encode(data).decode() if enc == "base64" else data.decode()
        frame = {
            "kind": "request",
            "id": request_id,
            "method": method,
            "path": path,
            "query_string": query,
            "headers": headers,
            "body": text,
            "encoding": enc,
            "stream": True,
        }
        response = self.responses[request_id] = Response(request_id)
        return response, frame

    async def request(self, method: str, path: str, body: Any = None, **kw: Any) -> Response:
        """Send a request and wait for its whole answer."""
        timeout = kw.pop("timeout", 15)
        response, frame = self.start_request(method, path, body, **kw)
        await self.send(frame)
        return await response.wait(timeout)

    async def open_stream(self, session_id: str, timeout: float = 10) -> Stream:
        """``GET /v1/sessions/{id}/stream``; returns once the first frame (a heartbeat) came."""
        response, frame = self.start_request("GET", f"/v1/sessions/{session_id}/stream")
        stream = self.streams[response.id] = Stream(session_id, response)
        self.server.streams.setdefault(session_id, []).append(stream)
        await self.send(frame)
        with trio.fail_after(timeout):
            while stream.first_was_heartbeat is None:
                await response.changed.wait()
        return stream

    async def ack(self, batch_id: str, applied: int = 0, error: str | None = None) -> None:
        """An ``event.ack`` (§A.3), as for a batch (of any id: the runner must cope)."""
        await self.send(
            {
                "kind": "event.ack",
                "id": batch_id,
                "applied": applied,
                "error": error,
                "retryable": False,
            }
        )

    async def cancel(self, request_id: str) -> None:
        await self.send(
            {"kind": "request.cancel", "id": request_id, "reason": "client_disconnected"}
        )

    async def ping(self, ts: int | None = None, timeout: float = 5) -> int:
        """An app-level ping (§i.2); returns the echoed ``ts`` once the pong arrived."""
        ts = ts if ts is not None else int(time.time() * 1000)
        event = self.pongs[ts] = trio.Event()
        await self.send({"kind": "ping", "ts": ts})
        with trio.fail_after(timeout):
            await event.wait()
        return ts

    async def close(self, code: int = 1000, reason: str = "") -> None:
        with trio.move_on_after(3):
            await self.ws.aclose(code, reason)

    def pause(self) -> None:
        """Stop reading frames (the runner's writes back up through TCP)."""
        self.paused = True
        self._resume = trio.Event()

    def resume(self) -> None:
        self.paused = False
        self._resume.set()

    # -- receiving ---------------------------------------------------------------------------

    async def read(self) -> None:
        try:
            while True:
                if self.paused:
                    await self._resume.wait()
                raw = await self.ws.get_message()
                self._on_frame(raw)
        except ConnectionClosed as exc:
            if exc.reason is not None:
                self.close_code, self.close_reason = exc.reason.code, exc.reason.reason
        finally:
            self.closed.set()

    def _on_frame(self, raw: str | bytes) -> None:
        try:
            frame = json.loads(raw)
            kind = frame["kind"]
        except (ValueError, KeyError, TypeError):
            self.violations.append(f"not a frame: {raw!r:.200}")
            return
        self.received.append(frame)
        if kind == "pong":
            event = self.pongs.pop(frame.get("ts"), None)
            if event is None:
                self.violations.append(f"pong for no ping: {frame}")
            else:
                event.set()
            return
        if kind == "event.batch":
            self.violations.append(f"event.batch although corral streams everything: {frame}")
            return
        if not kind.startswith("response."):
            self.violations.append(f"unexpected frame kind {kind!r}")
            return
        response = self.responses.get(frame.get("id"))
        if response is None:
            self.violations.append(f"{kind} for unknown request {frame.get('id')!r}")
            return
        if response.ended:
            self.violations.append(f"{kind} after response.end for {response.id}")
            return
        if kind == "response.head":
            if response.status is not None:
                self.violations.append(f"second response.head for {response.id}")
            response.status = frame["status"]
            response.headers = frame["headers"]
            response.head_seen.set()
        elif kind == "response.body":
            if response.status is None:
                self.violations.append(f"response.body before response.head for {response.id}")
            encoding = frame["encoding"]
            body = frame["body"]
            data = base64.b64decode(body) if encoding == "base64" else body.encode()
            response.chunks.append((encoding, data))
            stream = self.streams.get(response.id)
            if stream is not None:
                self._on_stream_body(stream, body)
        elif kind == "response.end":
            response.ended = True
            response.done.set()
            stream = self.streams.get(response.id)
            if stream is not None and stream.done:
                # §A.5: the real server cancels a stream the runner just ended with [DONE].
                self.server._spawn(self.cancel, response.id)
        else:
            self.violations.append(f"unknown frame kind {kind!r}")
        response.changed.set()
        response.changed = trio.Event()

    def _on_stream_body(self, stream: Stream, body: str) -> None:
        if not body.endswith("\n\n"):
            self.violations.append(f"SSE body not ending in a blank line: {body!r:.100}")
        count = 0
        for block in body.split("\n\n")[:-1]:
            if not block.startswith("data: ") or "\n" in block:
                self.violations.append(f"SSE block is not one data line: {block!r:.100}")
                continue
            payload = block[len("data: ") :]
            if payload == "[DONE]":
                stream.done = True
                continue
            if stream.done:
                self.violations.append(f"stream data after [DONE]: {payload:.100}")
            if '":' in payload and '": ' not in payload:
                self.violations.append(f"SSE JSON without json.dumps separators: {payload:.100}")
            event = json.loads(payload)
            if stream.first_was_heartbeat is None:
                stream.first_was_heartbeat = event.get("type") == "session.heartbeat"
            if event.get("type") == "session.heartbeat":
                stream.heartbeats += 1
                continue
            why = stream_violation(event)
            if why is not None:
                log.error("session %s: %s", stream.session_id, why)
                self.violations.append(why)
                self.server.stream_violations.append((stream.session_id, why))
                continue
            count += 1
            stream.events.append(event)
            self.server.events.setdefault(stream.session_id, []).append(event)
        if count:
            stream.frame_sizes.append(count)
        self.server._changed()


class FakeTunnelServer:
    """The tunnel endpoint. ``await server.start(nursery)``; runners connect to ``url``."""

    def __init__(self, *, prefix: str = "") -> None:
        self.prefix = prefix
        self.port = 0
        self.tunnels: list[Tunnel] = []
        self.live: dict[str, Tunnel] = {}
        #: runner id -> (code, reason): close that runner's tunnels right after hello.
        self.close_after_hello: dict[str, tuple[int, str]] = {}
        #: Refuse every upgrade with this HTTP status, or those of one runner id.
        self.reject_status: int | None = None
        self.reject_runner: dict[str, int] = {}
        #: runner id -> {session_id: agent_id}: sessions re-initialised on each connect.
        self.bound: dict[str, dict[str, str]] = {}
        #: session id -> every event seen on any of its streams (the server's view).
        self.events: dict[str, list[dict[str, Any]]] = {}
        self.streams: dict[str, list[Stream]] = {}
        #: (runner id, session id, status, body) of every re-init POST.
        self.reinits: list[tuple[str, str, int | None, Any]] = []
        #: (session id, why) of every stream event the real server would reject.
        self.stream_violations: list[tuple[str, str]] = []
        self.rejected: list[tuple[str, int]] = []
        self._change = trio.Event()
        self._nursery: trio.Nursery | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.prefix}"

    async def start(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        server = await nursery.start(
            lambda task_status: serve_websocket(
                self._handler,
                "127.0.0.1",
                0,
                None,
                max_message_size=100 * 1024 * 1024,
                task_status=task_status,
            )
        )
        self.port = server.port

    def _spawn(self, fn: Callable[..., Any], *args: Any) -> None:
        async def quietly() -> None:
            with contextlib.suppress(ConnectionClosed):
                await fn(*args)

        assert self._nursery is not None
        self._nursery.start_soon(quietly)

    def _changed(self) -> None:
        self._change.set()
        self._change = trio.Event()

    async def until(self, predicate: Callable[[], Any], timeout: float = 15, what: str = "") -> Any:
        """Wait (with a deadline) until ``predicate()`` is truthy; returns its value."""
        with trio.move_on_after(timeout):
            while True:
                value = predicate()
                if value:
                    return value
                await self._change.wait()
        raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")

    async def wait_tunnel(
        self, runner_id: str | None = None, *, count: int = 1, timeout: float = 15
    ) -> Tunnel:
        """The ``count``-th tunnel (of ``runner_id``) that said hello."""

        def found() -> Tunnel | None:
            ours = [t for t in self.tunnels if t.hello and runner_id in (None, t.runner_id)]
            return ours[count - 1] if len(ours) >= count else None

        return await self.until(found, timeout, f"tunnel #{count} of {runner_id}")

    def bind(self, runner_id: str, session_id: str, agent_id: str) -> None:
        self.bound.setdefault(runner_id, {})[session_id] = agent_id

    def deltas(self, session_id: str) -> str:
        return "".join(
            e.get("delta", "")
            for e in self.events.get(session_id, [])
            if e.get("type") == "response.output_text.delta"
        )

    def statuses(self, session_id: str) -> list[str]:
        return [
            e["status"]
            for e in self.events.get(session_id, [])
            if e.get("type") == "session.status"
        ]

    async def until_status(
        self, session_id: str, status: str = "idle", count: int = 1, timeout: float = 20
    ) -> list[str]:
        await self.until(
            lambda: self.statuses(session_id).count(status) >= count,
            timeout,
            f"{count} x session.status {status} on {session_id} (got {self.statuses(session_id)})",
        )
        return self.statuses(session_id)

    # -- the endpoint ------------------------------------------------------------------------

    async def _handler(self, request: WebSocketRequest) -> None:
        try:
            await self._serve(request)
        except Exception:
            log.exception("fake tunnel server: handler failed")

    async def _serve(self, request: WebSocketRequest) -> None:
        headers = {k.decode().lower(): v.decode() for k, v in request.headers}
        path = urlsplit(request.path).path
        match = _PATH.match(path)
        status = None
        if match is None or match.group("prefix") != self.prefix:
            status = 404
        elif headers.get("origin") != "omnigent://internal":
            status = 403
        elif self.reject_status is not None:
            status = self.reject_status
        elif unquote(match.group("runner_id")) in self.reject_runner:
            status = self.reject_runner[unquote(match.group("runner_id"))]
        if status is not None:
            await request.reject(status)
            self.rejected.append((request.path, status))
            self._changed()
            return
        ws = await request.accept()
        tunnel = Tunnel(self, ws, request)
        self.tunnels.append(tunnel)
        token = headers.get("x-omnigent-runner-tunnel-token")
        if token is not None and tunnel.runner_id != token_bound_runner_id(token):
            await tunnel.close(4004, "runner_id does not match tunnel token")
            tunnel.closed.set()
            self._changed()
            return
        try:
            with trio.fail_after(10):
                first = await ws.get_message()
        except (ConnectionClosed, trio.TooSlowError):
            tunnel.closed.set()
            return
        try:
            hello = json.loads(first)
        except ValueError:
            hello = {}
        if not isinstance(hello, dict) or hello.get("kind") != "hello":
            await tunnel.close(4001, "expected hello frame")
            tunnel.closed.set()
            self._changed()
            return
        version = hello.get("frame_protocol_version")
        if version != 1:
            reason = f"frame_protocol_version mismatch: server supports 1, runner sent {version}"
            await tunnel.close(4002, reason)
            tunnel.closed.set()
            self._changed()
            return
        capabilities = hello.get("capabilities", [])
        connection_id = hello.get("connection_id")
        if (
            not isinstance(capabilities, list)
            or not all(isinstance(c, str) for c in capabilities)
            or not isinstance(connection_id, str | None)
        ):
            # The real server raises decoding such a hello and drops the connection without a
            # close frame (the runner sees 1006); a clean close is easier to assert on.
            tunnel.violations.append(f"malformed hello: {hello!r:.200}")
            await tunnel.close(4001, "expected hello frame")
            tunnel.closed.set()
            self._changed()
            return
        tunnel.hello = hello
        closing = self.close_after_hello.get(tunnel.runner_id)
        if closing is not None:
            self._changed()
            await tunnel.close(*closing)
            tunnel.closed.set()
            self._changed()
            return
        old = self.live.get(tunnel.runner_id)
        self.live[tunnel.runner_id] = tunnel
        if old is not None and not old.closed.is_set():
            await old.close(4000, "tunnel replaced")
        if EVENT_INGEST in capabilities:
            with contextlib.suppress(ConnectionClosed):
                await tunnel.send({"kind": "event.ready"})
            tunnel.event_ready = True
        self._changed()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._reinit, tunnel)
            await tunnel.read()
            nursery.cancel_scope.cancel()
        if self.live.get(tunnel.runner_id) is tunnel:
            del self.live[tunnel.runner_id]
        self._changed()

    async def _reinit(self, tunnel: Tunnel) -> None:
        """Per bound session, one at a time: init (the 0.19 session_init envelope), stream.

        (The real server opens every bound session's stream at once and inits only those
        needing recovery, §K.2; one at a time keeps the tests' order readable.)
        """
        for session_id, agent_id in list(self.bound.get(tunnel.runner_id, {}).items()):
            envelope = {
                "protocol_version": 2,
                "server_version": SERVER_VERSION,
                "session_id": session_id,
                "agent_id": agent_id,
                "sub_agent_name": None,
                "snapshot": {
                    "workspace": None,
                    "labels": {},
                    "reasoning_effort": None,
                    "model_override": None,
                    "harness_override": None,
                    "parent_session_id": None,
                    "root_session_id": session_id,
                    "inference_config": None,
                },
                "suppress_recovery_turn": False,
                "resume_interrupted_turn": False,
                "recovery_id": None,
            }
            body = {
                "session_id": session_id,
                "agent_id": agent_id,
                "sub_agent_name": None,
                "session_init": envelope,
            }
            try:
                init = await tunnel.request("POST", "/v1/sessions", body, timeout=20)
                self.reinits.append((tunnel.runner_id, session_id, init.status, init.json))
                await tunnel.open_stream(session_id)
            except (ConnectionClosed, trio.TooSlowError) as exc:
                log.warning("re-init of %s failed: %r", session_id, exc)
                return
            self._changed()
