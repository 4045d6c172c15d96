"""The server's end of a runner tunnel, for ``corral bench relay`` (PROTOCOL_FACTS.md §i, §ii).

Just enough of an omnigent server to drive sessions through a real host's gateway and to time
what comes back. :class:`TunnelPeer` accepts the runner's WebSocket on
``/v1/runners/{id}/tunnel``, takes its ``hello``, sends ``request`` frames shaped like the
server's httpx client sends them (§ii), collects each answer, and reads session streams
(``GET .../stream``) as SSE — several ``data:`` events may share one ``response.body`` frame
when the gateway coalesces a backlog — stamping every event with its frame's arrival time.
It checks only what the benchmark relies on: it is a load generator, not a conformance test.

Run as a process, ``python -m corral.bench._tunnel_peer flood URL N``, it is the sender of
the benchmark's baseline (:func:`raw_frames_per_s`): a bare trio-websocket client sending N
one-delta ``response.body`` frames, one ``send_message`` each, as the gateway's writer does.
"""

from __future__ import annotations

import base64
import contextlib
import json
import sys
import time
import uuid
from collections.abc import Iterator
from functools import partial
from typing import Any

import msgspec
import trio
from trio_websocket import (
    ConnectionClosed,
    WebSocketConnection,
    WebSocketRequest,
    open_websocket_url,
    serve_websocket,
)

from .._jsonlines import JsonObject
from ._common import start_role

FRAME_PROTOCOL_VERSION = 1
#: The headers the server's httpx client puts on every tunnelled request (§ii).
_BASE_HEADERS = [
    ["host", "runner"],
    ["accept", "*/*"],
    ["accept-encoding", "gzip, deflate, zstd"],
    ["connection", "keep-alive"],
    ["user-agent", "python-httpx/0.28.1"],
]
#: Large enough for any coalesced stream frame (the gateway's default cap is 256 KiB).
MAX_MESSAGE = 16 * 1024 * 1024
#: trio-websocket's default (4 KiB) would make the reader, not the relay, the bottleneck.
RECEIVE_BUFFER = 64 * 1024
DELTA = "response.output_text.delta"
#: ``session.status`` values that end a turn (dispatch sends exactly one per turn).
TURN_ENDS = ("idle", "failed")


class _Frame(msgspec.Struct):
    """The fields of a runner → server frame this peer reads (the rest are skipped)."""

    kind: str
    id: str = ""
    status: int = 0
    body: str | None = None
    encoding: str = "utf-8"


class _Event(msgspec.Struct):
    """The fields of a session stream event the benchmark reads."""

    type: str = ""
    turn_id: str = ""
    sequence_number: int = 0
    status: str | None = None
    error: Any = None


_decode_frame = msgspec.json.Decoder(_Frame).decode
_decode_event = msgspec.json.Decoder(_Event).decode


class PeerError(RuntimeError):
    """The host answered something the benchmark cannot go on from (a failed turn, a 5xx)."""


@contextlib.contextmanager
def lone_errors() -> Iterator[None]:
    """Re-raise a nursery's only failure as itself: a benchmark's error reads better so."""
    try:
        yield
    except BaseExceptionGroup as group:
        error: BaseException = group
        while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
            error = error.exceptions[0]  # nested nurseries wrap it once each
        if error is group:
            raise
        raise error from None


class Reply:
    """One tunnelled request's answer, as the server receives it."""

    def __init__(self, request_id: str) -> None:
        self.id = request_id
        self.status: int | None = None
        self.parts: list[str] = []
        #: ``time.perf_counter()`` when the request frame was handed to the socket.
        self.sent_at = 0.0
        self.done = trio.Event()

    @property
    def body(self) -> str:
        return "".join(self.parts)

    async def wait(self, timeout: float = 60) -> Reply:
        with trio.move_on_after(timeout):
            await self.done.wait()
        if not self.done.is_set():
            raise PeerError(f"request {self.id}: no complete answer within {timeout:g}s")
        return self


class SessionStream:
    """One ``GET /v1/sessions/{id}/stream``, relayed the way the server relays it (§ii.6).

    ``deltas`` holds, per text delta in arrival order, ``(arrival, turn_id,
    sequence_number)`` with ``arrival`` from ``time.perf_counter()``: every event of one
    frame shares its frame's arrival time. ``ends`` lists the turn-ending statuses seen.
    """

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.deltas: list[tuple[float, str, int]] = []
        self.ends: list[tuple[str, Any]] = []
        self.events = 0
        self.frames = 0
        #: Set by the first event (always a heartbeat): the relay is ready (§ii.6).
        self.ready = trio.Event()
        self._changed = trio.Event()
        self._tail = ""

    def feed(self, text: str, arrival: float) -> None:
        """Parse one ``response.body``'s SSE text; a trailing partial event waits for more."""
        self.frames += 1
        if self._tail:
            text, self._tail = self._tail + text, ""
        blocks = text.split("\n\n")
        self._tail = blocks.pop()
        for block in blocks:
            data = _sse_data(block)
            if data is None or data == "[DONE]":
                continue
            event = _decode_event(data)
            self.events += 1
            if event.type == DELTA:
                self.deltas.append((arrival, event.turn_id, event.sequence_number))
            elif event.type == "session.status" and event.status in TURN_ENDS:
                self.ends.append((event.status, event.error))
        self.ready.set()
        self._changed.set()

    async def wait_ends(self, count: int, timeout: float) -> None:
        """Until ``count`` turns of this session have ended; raises if one failed."""
        with trio.move_on_after(timeout):
            while len(self.ends) < count:
                self._changed = trio.Event()
                await self._changed.wait()
        if len(self.ends) < count:
            raise PeerError(
                f"session {self.session_id}: {len(self.ends)} of {count} turns ended within "
                f"{timeout:g}s ({len(self.deltas)} deltas, {self.events} events so far)"
            )
        failed = [error for status, error in self.ends if status == "failed"]
        if failed:
            raise PeerError(f"session {self.session_id}: a turn failed: {failed[0]}")


def delta_key(event: bytes | str) -> tuple[str, int] | None:
    """(turn id, sequence number) of a text delta's JSON; None for any other event."""
    decoded = _decode_event(event)
    if decoded.type != DELTA:
        return None
    return decoded.turn_id, decoded.sequence_number


def _sse_data(block: str) -> str | None:
    """The data of one SSE event (its ``data:`` lines joined), or None if it has none."""
    if block.startswith("data: ") and "\n" not in block:
        return block[6:]  # the gateway's one-line shape: the fast path
    lines = [line[5:].removeprefix(" ") for line in block.split("\n") if line.startswith("data:")]
    return "\n".join(lines) if lines else None


class TunnelPeer:
    """The server side of one runner's tunnel, listening on 127.0.0.1.

    ``await peer.start(nursery)`` binds a free port; point the host's runner at
    :attr:`url`, then ``await peer.wait_connected()``. A second tunnel for the same runner
    replaces the first (close 4000, as the server does).
    """

    def __init__(self, runner_id: str) -> None:
        self.runner_id = runner_id
        self.url = ""
        self.hello: JsonObject | None = None
        self.streams: dict[str, SessionStream] = {}
        self.frames_in = 0
        self._ws: WebSocketConnection | None = None
        self._connected = trio.Event()
        self._send_lock = trio.Lock()
        self._replies: dict[str, Reply] = {}
        self._by_request: dict[str, SessionStream] = {}

    async def start(self, nursery: trio.Nursery) -> None:
        """Listen on a free loopback port (``url`` is set when this returns)."""
        server = await nursery.start(
            partial(
                serve_websocket,
                self._handler,
                "127.0.0.1",
                0,
                None,
                max_message_size=MAX_MESSAGE,
                receive_buffer_size=RECEIVE_BUFFER,
            )
        )
        self.url = f"http://127.0.0.1:{server.port}"

    async def wait_connected(self, timeout: float = 30) -> None:
        with trio.fail_after(timeout):
            await self._connected.wait()

    # -- the connection ----------------------------------------------------------------------

    async def _handler(self, request: WebSocketRequest) -> None:
        if request.path != f"/v1/runners/{self.runner_id}/tunnel":
            await request.reject(404)
            return
        ws = await request.accept()
        try:
            hello = json.loads(await ws.get_message())
        except (ConnectionClosed, ValueError):
            return
        if not isinstance(hello, dict) or hello.get("kind") != "hello":
            await ws.aclose(4001, "expected hello frame")
            return
        if hello.get("frame_protocol_version") != FRAME_PROTOCOL_VERSION:
            await ws.aclose(4002, "frame_protocol_version mismatch")
            return
        old, self._ws, self.hello = self._ws, ws, hello
        if old is not None:
            await old.aclose(4000, "tunnel replaced")
        self._connected.set()
        try:
            while True:
                raw = await ws.get_message()
                self._on_frame(raw, time.perf_counter())
        except ConnectionClosed:
            pass
        finally:
            if self._ws is ws:
                self._ws = None
                self._connected = trio.Event()

    def _on_frame(self, raw: str | bytes, arrival: float) -> None:
        self.frames_in += 1
        frame = _decode_frame(raw)
        stream = self._by_request.get(frame.id)
        if frame.kind == "response.body":
            text = frame.body or ""
            if frame.encoding == "base64":
                text = base64.b64decode(text).decode()
            if stream is not None:
                stream.feed(text, arrival)
            elif (reply := self._replies.get(frame.id)) is not None:
                reply.parts.append(text)
        elif frame.kind == "response.head":
            if stream is None and (reply := self._replies.get(frame.id)) is not None:
                reply.status = frame.status
        elif frame.kind == "response.end":
            reply = self._replies.pop(frame.id, None)
            if reply is not None:
                reply.done.set()
        # pong, ws.*: nothing this peer asked for.

    # -- requests ----------------------------------------------------------------------------

    async def send_request(self, method: str, path: str, body: Any = None) -> Reply:
        """Send one ``request`` frame; the :class:`Reply` completes when its end arrives."""
        request_id = uuid.uuid4().hex
        reply = self._replies[request_id] = Reply(request_id)
        await self._send(_request_frame(request_id, method, path, body), reply)
        return reply

    async def request(self, method: str, path: str, body: Any = None, timeout: float = 60) -> Reply:
        """Send a request and wait for its whole answer."""
        return await (await self.send_request(method, path, body)).wait(timeout)

    async def _send(self, text: str, reply: Reply | None = None) -> None:
        ws = self._ws
        if ws is None:
            raise PeerError(f"runner {self.runner_id} has no tunnel open")
        async with self._send_lock:
            if reply is not None:
                reply.sent_at = time.perf_counter()
            await ws.send_message(text)

    async def bind(self, session_id: str, agent_id: str, timeout: float = 60) -> SessionStream:
        """Bind a new session as the server does (§v.1): init, then open its stream."""
        init = {
            "session_id": session_id,
            "agent_id": agent_id,
            "sub_agent_name": None,
            "session_init": {
                "protocol_version": 2,
                "server_version": "corral-bench",
                "session_id": session_id,
                "agent_id": agent_id,
                "sub_agent_name": None,
                "snapshot": {"labels": {}, "root_session_id": session_id},
                "suppress_recovery_turn": True,
            },
        }
        reply = await self.request("POST", "/v1/sessions", init, timeout)
        if reply.status != 201:
            raise PeerError(f"POST /v1/sessions: {reply.status} {reply.body[:200]}")
        return await self.open_stream(session_id, timeout)

    async def open_stream(self, session_id: str, timeout: float = 60) -> SessionStream:
        """``GET /v1/sessions/{id}/stream``; returns once its first event (a heartbeat) came."""
        request_id = uuid.uuid4().hex
        stream = self._by_request[request_id] = self.streams[session_id] = SessionStream(session_id)
        frame = _request_frame(request_id, "GET", f"/v1/sessions/{session_id}/stream", None)
        await self._send(frame)
        with trio.fail_after(timeout):
            await stream.ready.wait()
        return stream

    async def send_message(self, session_id: str, agent_id: str, text: str) -> Reply:
        """A client's message, flattened as the server forwards it (§ii.7); not awaited."""
        body = {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": text}],
            "agent_id": agent_id,
            "model": "bench-relay",
            "has_mcp_servers": False,
            "persisted_item_id": uuid.uuid4().hex,
        }
        return await self.send_request("POST", f"/v1/sessions/{session_id}/events", body)


def _request_frame(request_id: str, method: str, path: str, body: Any) -> str:
    headers = [list(h) for h in _BASE_HEADERS]
    text = None
    if body is not None:
        text = json.dumps(body, separators=(",", ":"))
        headers += [
            ["content-length", str(len(text.encode()))],
            ["content-type", "application/json"],
        ]
    frame = {
        "kind": "request",
        "id": request_id,
        "method": method,
        "path": path,
        "query_string": "",
        "headers": headers,
        "body": text,
        "encoding": "utf-8",
        "stream": True,
    }
    return json.dumps(frame)


# --- the baseline ------------------------------------------------------------------------------


def delta_frame() -> str:
    """A ``response.body`` frame carrying one delta, as the gateway sends a lone event."""
    event = {
        "type": DELTA,
        "delta": "x",
        "turn_id": uuid.uuid4().hex,
        "sequence_number": 1,
    }
    frame = {
        "kind": "response.body",
        "id": uuid.uuid4().hex,
        "body": f"data: {json.dumps(event)}\n\n",
        "encoding": "utf-8",
    }
    return json.dumps(frame)


async def raw_frames_per_s(n: int, timeout: float = 120) -> float:
    """Frames/s from a trio-websocket client process to a server here, received one by one.

    Both ends use the tunnel's settings (the gateway's 64 KiB receive buffer here too); the
    receiver only counts, so this is the transport's ceiling, not a relay's.
    """
    got = 0
    first = last = 0.0
    finished = trio.Event()

    async def handler(request: WebSocketRequest) -> None:
        nonlocal got, first, last
        ws = await request.accept()
        try:
            while got < n:
                await ws.get_message()
                last = time.perf_counter()
                if got == 0:
                    first = last
                got += 1
        except ConnectionClosed:
            pass
        finally:
            finished.set()

    with lone_errors():
        async with trio.open_nursery() as nursery:
            server = await nursery.start(
                partial(
                    serve_websocket,
                    handler,
                    "127.0.0.1",
                    0,
                    None,
                    max_message_size=MAX_MESSAGE,
                    receive_buffer_size=RECEIVE_BUFFER,
                )
            )
            url = f"ws://127.0.0.1:{server.port}/"
            sender = start_role("corral.bench._tunnel_peer", "flood", url, str(n))
            try:
                assert sender.stdout is not None and sender.stdin is not None
                ready = await trio.to_thread.run_sync(sender.stdout.readline)
                if ready.strip() != "ready":
                    raise PeerError(f"the baseline sender did not start: {ready!r}")
                sender.stdin.write("go\n")
                sender.stdin.flush()
                with trio.move_on_after(timeout):
                    await finished.wait()
            finally:
                sender.kill()
                await trio.to_thread.run_sync(sender.wait)
            nursery.cancel_scope.cancel()
    if got < n:
        raise PeerError(f"raw websocket: {got} of {n} frames arrived")
    return (got - 1) / max(last - first, 1e-9)


async def _flood(url: str, n: int) -> None:
    frame = delta_frame()
    async with open_websocket_url(url, receive_buffer_size=RECEIVE_BUFFER) as ws:
        print("ready", flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline)
        for _ in range(n):
            await ws.send_message(frame)
        # Leave the close to the receiver: it hangs up once it has counted every frame.
        with trio.move_on_after(60):
            await ws.get_message()


if __name__ == "__main__":
    if sys.argv[1:2] != ["flood"] or len(sys.argv) != 4:
        sys.exit("usage: python -m corral.bench._tunnel_peer flood URL N")
    with contextlib.suppress(ConnectionClosed):  # the receiver hung up: done
        trio.run(_flood, sys.argv[2], int(sys.argv[3]))
