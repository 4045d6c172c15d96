"""A minimal runner for control-plane tests, written from PROTOCOL_FACTS.md §i-ii only.

It is the WebSocket client of ``{server}/v1/runners/{id}/tunnel``: it sends ``hello``, answers
app-level pings, and serves the requests the server tunnels to it:

==========================================  =================================================
request                                     answer
==========================================  =================================================
``POST /v1/sessions``                       201, the runner's session view (init v2 echoed)
``GET /v1/sessions/{id}``                   200
``GET .../skills``                          ``{"skills": []}``
``GET .../stream``                          200 SSE: a heartbeat, then what :meth:`emit` sends
``POST .../events``                         message 202 accepted; interrupt 204; approval 204
``POST .../mcp/execute``                    ``{"result": {"output": ...}}`` from ``tool``
==========================================  =================================================

Every request is recorded (:attr:`FakeRunner.requests`) before it is answered, and a hook
(``on_event``) may run before an event is answered, e.g. to look at the server's store at the
moment the runner first sees a message. :meth:`FakeRunner.wait_until` waits on a condition with
a deadline instead of sleeping.
"""

from __future__ import annotations

import base64
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio
from trio_websocket import ConnectionClosed, WebSocketConnection, open_websocket_url

from corral.server_client import runner_id_for_token

HEARTBEAT = {"type": "session.heartbeat"}
#: The ``hello`` it sends unless told another: a 0.11 runner's (PROTOCOL_FACTS §i.2).
HELLO = {
    "kind": "hello",
    "runner_version": "0.11.0.dev0",
    "frame_protocol_version": 1,
    # The harnesses of the agents its tests serve: the control plane lists an agent of
    # another as invalid (corral.agent_files).
    "harnesses": ["openai", "scripted"],
    "envs": [],
    "telemetry_opt_out": True,
}


@dataclass
class Seen:
    """One tunnelled request as the runner received it."""

    id: str
    method: str
    path: str
    query: str
    body: Any
    at: float = field(default_factory=time.monotonic)


class FakeRunner:
    """The runner side of one tunnel. ``await nursery.start(runner.run)``, then drive it."""

    def __init__(
        self,
        server_url: str,
        token: str | None,
        *,
        runner_id: str | None = None,
        origin: str = "omnigent://internal",
        hello: dict[str, Any] | None = None,
    ) -> None:
        self.token = token
        self.runner_id = runner_id or (runner_id_for_token(token) if token else "runner_x")
        base = server_url.replace("http://", "ws://", 1).rstrip("/")
        self.url = f"{base}/v1/runners/{self.runner_id}/tunnel"
        self.origin = origin
        self.hello = hello or HELLO
        self.requests: list[Seen] = []
        self.pings: list[int] = []
        self.cancels: list[str] = []
        #: session id -> request ids of its open streams, oldest first
        self.streams: dict[str, list[str]] = {}
        self.close_code: int | None = None
        self.close_reason: str | None = None
        #: Runs (and is awaited) before an event is answered: ``on_event(session_id, body)``.
        self.on_event: Callable[[str, Any], Awaitable[None]] | None = None
        #: ``tool(name, arguments) -> output string`` for ``/mcp/execute``.
        self.tool: Callable[[str, dict[str, Any]], str] = lambda name, args: json.dumps(
            {"tool": name, "arguments": args}
        )
        #: Status the runner answers a ``message`` event with (202 accepted by default);
        #: ``next_statuses`` are used first, one per message, e.g. to fail a few times.
        self.message_status = 202
        self.next_statuses: list[int] = []
        self.answer_pings = True
        #: Send JSON answers as ``base64`` body frames (a runner may; §i.2).
        self.base64_bodies = False
        self.ws: WebSocketConnection | None = None
        self._changed = trio.Event()
        self._send_lock = trio.Lock()
        self._scope: trio.CancelScope | None = None

    # -- conditions --------------------------------------------------------------------------

    def _touch(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_until(self, predicate: Callable[[], Any], timeout: float = 10) -> Any:
        """Wait until ``predicate()`` is truthy (re-checked on every frame); fail after
        ``timeout`` seconds."""
        with trio.fail_after(timeout):
            while not (value := predicate()):
                await self._changed.wait()
        return value

    def seen(self, method: str | None = None, path: str | None = None) -> list[Seen]:
        """Recorded requests, optionally only one method and path."""
        return [
            r
            for r in self.requests
            if (method is None or r.method == method) and (path is None or r.path == path)
        ]

    def events_for(self, session_id: str) -> list[Any]:
        """Bodies of the ``POST .../events`` the runner got for a session, in order."""
        return [r.body for r in self.seen("POST", f"/v1/sessions/{session_id}/events")]

    def stream_open(self, session_id: str) -> bool:
        return bool(self.streams.get(session_id))

    # -- running -----------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Connect, send hello, serve until the tunnel closes (close code in
        :attr:`close_code`)."""
        headers = [(b"Origin", self.origin.encode())]
        if self.token is not None:
            headers.append((b"X-Omnigent-Runner-Tunnel-Token", self.token.encode()))
        with trio.CancelScope() as scope:
            self._scope = scope
            async with open_websocket_url(self.url, extra_headers=headers) as ws:
                self.ws = ws
                with contextlib.suppress(ConnectionClosed):
                    await ws.send_message(json.dumps(self.hello))
                task_status.started()
                try:
                    async with trio.open_nursery() as nursery:
                        while True:
                            try:
                                raw = await ws.get_message()
                            except ConnectionClosed:
                                break
                            await self._on_frame(json.loads(raw), nursery)
                        nursery.cancel_scope.cancel()
                finally:
                    if ws.closed is not None:
                        self.close_code = ws.closed.code
                        self.close_reason = ws.closed.reason
                    self.streams.clear()
                    self._touch()

    async def disconnect(self) -> None:
        """Close the tunnel from the runner's side (1000), as a runner stopping does."""
        if self.ws is not None:
            with trio.move_on_after(3):
                await self.ws.aclose(1000, "runner stopping")
        if self._scope is not None:
            self._scope.cancel()

    async def _send(self, frame: dict[str, Any]) -> None:
        assert self.ws is not None
        async with self._send_lock:
            await self.ws.send_message(json.dumps(frame))

    async def _on_frame(self, frame: dict[str, Any], nursery: trio.Nursery) -> None:
        kind = frame.get("kind")
        if kind == "ping":
            self.pings.append(frame["ts"])
            self._touch()
            if self.answer_pings:
                await self._send({"kind": "pong", "ts": frame["ts"]})
        elif kind == "request.cancel":
            self.cancels.append(frame["id"])
            for ids in self.streams.values():
                if frame["id"] in ids:
                    ids.remove(frame["id"])
            self._touch()
        elif kind == "request":
            body = frame.get("body")
            seen = Seen(
                id=frame["id"],
                method=frame["method"],
                path=frame["path"],
                query=frame.get("query_string", ""),
                body=json.loads(body) if body else None,
            )
            self.requests.append(seen)
            self._touch()
            nursery.start_soon(self._answer, seen)

    # -- answers -----------------------------------------------------------------------------

    async def _respond(self, rid: str, status: int, body: Any = None) -> None:
        if body is None:
            await self._send({"kind": "response.head", "id": rid, "status": status, "headers": []})
        else:
            text = json.dumps(body, separators=(",", ":"))
            headers = [["content-length", str(len(text))], ["content-type", "application/json"]]
            await self._send(
                {"kind": "response.head", "id": rid, "status": status, "headers": headers}
            )
            encoding = "utf-8"
            if self.base64_bodies:
                text, encoding = base64.b64encode(text.encode()).decode(), "base64"
            await self._send(
                {"kind": "response.body", "id": rid, "body": text, "encoding": encoding}
            )
        await self._send({"kind": "response.end", "id": rid})

    async def _answer(self, req: Seen) -> None:
        parts = req.path.strip("/").split("/")
        try:
            if req.method == "POST" and parts == ["v1", "sessions"]:
                body = req.body or {}
                init = body.get("session_init")
                view = {
                    "id": body.get("session_id"),
                    "agent_id": body.get("agent_id"),
                    "status": "idle",
                    "created_at": int(time.time()),
                    "title": None,
                    "labels": {},
                    "runner_id": self.runner_id,
                    "items": [],
                    "session_init_protocol_version": 2 if init else None,
                }
                await self._respond(req.id, 201, view)
            elif req.method == "GET" and len(parts) == 3:
                await self._respond(req.id, 200, {"id": parts[2], "status": "idle"})
            elif req.method == "GET" and parts[3:] == ["skills"]:
                await self._respond(req.id, 200, {"skills": []})
            elif req.method == "GET" and parts[3:] == ["stream"]:
                await self._open_stream(req, parts[2])
            elif req.method == "POST" and parts[3:] == ["events"]:
                await self._event(req, parts[2])
            elif req.method == "POST" and parts[3:] == ["mcp", "execute"]:
                params = (req.body or {}).get("params") or {}
                output = self.tool(params.get("name"), params.get("arguments") or {})
                await self._respond(req.id, 200, {"result": {"output": output}})
            else:
                await self._respond(req.id, 404, {"error": "not_found", "detail": req.path})
        except ConnectionClosed:
            pass

    async def _open_stream(self, req: Seen, session_id: str) -> None:
        headers = [
            ["cache-control", "no-cache"],
            ["x-accel-buffering", "no"],
            ["content-type", "text/event-stream; charset=utf-8"],
        ]
        await self._send({"kind": "response.head", "id": req.id, "status": 200, "headers": headers})
        await self._send(
            {"kind": "response.body", "id": req.id, "body": _sse(HEARTBEAT), "encoding": "utf-8"}
        )
        self.streams.setdefault(session_id, []).append(req.id)
        self._touch()

    async def _event(self, req: Seen, session_id: str) -> None:
        if self.on_event is not None:
            await self.on_event(session_id, req.body)
        kind = (req.body or {}).get("type")
        if kind == "message":
            status = self.next_statuses.pop(0) if self.next_statuses else self.message_status
            if status >= 400:
                await self._respond(req.id, status, {"error": "busy", "detail": "not now"})
            else:
                await self._respond(
                    req.id, status, {"status": "accepted", "detail": "Turn started."}
                )
        else:
            await self._respond(req.id, 204)

    # -- the session stream ------------------------------------------------------------------

    async def emit(self, session_id: str, *events: dict[str, Any], split: bool = False) -> None:
        """Send events on the session's newest stream, all in ONE body frame (coalesced), or,
        with ``split``, the text cut in two frames in the middle of an event."""
        ids = self.streams.get(session_id)
        assert ids, f"no open stream for {session_id}"
        text = "".join(_sse(e) for e in events)
        pieces = [text[: len(text) // 2], text[len(text) // 2 :]] if split else [text]
        for piece in pieces:
            await self._send(
                {"kind": "response.body", "id": ids[-1], "body": piece, "encoding": "utf-8"}
            )

    async def end_stream(self, session_id: str) -> None:
        """End the session's newest stream (``response.end``), as a runner restarting its
        gateway would."""
        ids = self.streams.get(session_id)
        assert ids
        await self._send({"kind": "response.end", "id": ids.pop()})


def _sse(event: dict[str, Any]) -> str:
    return f"data: {json.dumps(event)}\n\n"
