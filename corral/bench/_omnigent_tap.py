"""A loopback proxy in front of the omnigent server that times the deltas a runner sends it.

``corral bench relay --against`` points each runner at this proxy instead of the server. Plain
HTTP (the runner's own REST calls) passes through byte for byte. The runner's tunnel
(``GET /v1/runners/{id}/tunnel``, a WebSocket) is ended here and opened again to the server with
the runner's path and headers, so the proxy sees whole frames: every text delta a runner → server
``response.body`` frame carries is stamped with the frame's arrival, at the server's door, as
the tunnel peer of ``corral bench relay`` stamps them (PROTOCOL_FACTS.md §ii.6).

Why here rather than on the server's client stream: the server hands each viewer of a session
at most 1,024 queued events and cuts a viewer that falls further behind ("session stream
subscriber overflowed … closing for snapshot reconnect"); it validates and writes each event to
a viewer slower than corral relays them, so a 5,000-delta turn from corral ends every client
stream. What the client stream shows is the server's own ceiling, not the runner's.

Frames from the runner are read as fast as they come and queued for the server without bound,
so a server slow to read does not slow the runner down through this proxy; the other way,
frames are copied as they come.
"""

from __future__ import annotations

import base64
import contextlib
import math
import time
from collections.abc import Awaitable, Callable
from functools import partial

import msgspec
import trio
from trio_websocket import (
    ConnectionClosed,
    ConnectionRejected,
    HandshakeError,
    WebSocketConnection,
    open_websocket_url,
    wrap_server_stream,
)

from ._tunnel_peer import MAX_MESSAGE, RECEIVE_BUFFER

#: How a delta reads inside an SSE body (counted, not parsed: frames carry up to hundreds).
DELTA = '"response.output_text.delta"'
#: Headers the WebSocket handshake to the server sets itself.
_HANDSHAKE = {
    b"host",
    b"upgrade",
    b"connection",
    b"sec-websocket-key",
    b"sec-websocket-version",
    b"sec-websocket-extensions",
    b"sec-websocket-protocol",
    b"content-length",
}


class _Frame(msgspec.Struct):
    kind: str
    body: str | None = None
    encoding: str = "utf-8"


_decode_frame = msgspec.json.Decoder(_Frame).decode


class _Replay(trio.abc.Stream):
    """A socket whose first bytes, already read to route the connection, are read again."""

    def __init__(self, stream: trio.SocketStream, head: bytes) -> None:
        self.stream = stream
        self.head = head

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self.head:
            data, self.head = self.head, b""
            return data
        return await self.stream.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.stream.aclose()


class TunnelTap:
    """``await tap.start(nursery)``, then give runners :attr:`url` as their server.

    ``deltas`` holds each delta's arrival (``time.perf_counter()``) from every tunnel, in
    order; the benchmark runs one turn at a time, so a turn's deltas are those that arrived
    since it was posted.
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.deltas: list[float] = []
        self._changed = trio.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, nursery: trio.Nursery) -> None:
        listeners = await nursery.start(partial(trio.serve_tcp, self._serve, 0, host="127.0.0.1"))
        self.port = listeners[0].socket.getsockname()[1]

    async def wait_deltas(self, count: int, timeout: float) -> bool:
        """Until ``count`` deltas arrived in all; False if they did not within ``timeout``."""
        with trio.move_on_after(timeout):
            while len(self.deltas) < count:
                self._changed = trio.Event()
                await self._changed.wait()
        return len(self.deltas) >= count

    # -- connections -------------------------------------------------------------------------

    async def _serve(self, client: trio.SocketStream) -> None:
        head = b""
        # A connection that breaks (the server stopped, a runner hung up) ends alone: the
        # benchmark learns of it from the turn it spoils.
        with contextlib.suppress(
            trio.BrokenResourceError, trio.ClosedResourceError, OSError, ConnectionClosed
        ):
            while b"\r\n\r\n" not in head:
                data = await client.receive_some()
                if not data:
                    return
                head += data
            request_line, _, headers = head.partition(b"\r\n")
            if b"/tunnel" in request_line and b"upgrade: websocket" in headers.lower():
                await self._tunnel(_Replay(client, head))
            else:
                await self._pass_through(client, head)
        await trio.aclose_forcefully(client)

    async def _pass_through(self, client: trio.SocketStream, head: bytes) -> None:
        upstream = await trio.open_tcp_stream("127.0.0.1", self.upstream_port)
        try:
            await upstream.send_all(head)
            async with trio.open_nursery() as nursery:

                async def copy(src: trio.SocketStream, dst: trio.SocketStream) -> None:
                    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                        while data := await src.receive_some():
                            await dst.send_all(data)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(copy, client, upstream)
                nursery.start_soon(copy, upstream, client)
        finally:
            await trio.aclose_forcefully(upstream)

    async def _tunnel(self, client: _Replay) -> None:
        async with trio.open_nursery() as nursery:
            request = await wrap_server_stream(
                nursery,
                client,
                max_message_size=MAX_MESSAGE,
                receive_buffer_size=RECEIVE_BUFFER,
            )
            headers = [(k, v) for k, v in request.headers if k.lower() not in _HANDSHAKE]
            url = f"ws://127.0.0.1:{self.upstream_port}{request.path}"
            try:
                async with open_websocket_url(
                    url,
                    extra_headers=headers,
                    max_message_size=MAX_MESSAGE,
                    receive_buffer_size=RECEIVE_BUFFER,
                ) as upstream:
                    runner = await request.accept()
                    await self._relay(runner, upstream)
            except ConnectionRejected as rejected:
                await request.reject(rejected.status_code, body=rejected.body)
            except HandshakeError:
                await request.reject(502)
            nursery.cancel_scope.cancel()

    async def _relay(self, runner: WebSocketConnection, upstream: WebSocketConnection) -> None:
        send, receive = trio.open_memory_channel[str | bytes](math.inf)

        async def from_runner() -> None:
            try:
                while True:
                    message = await runner.get_message()
                    self._on_frame(message, time.perf_counter())
                    send.send_nowait(message)
            except ConnectionClosed as closed:
                reason = closed.reason
                await upstream.aclose(
                    reason.code if reason else 1000, reason.reason if reason else None
                )

        async def to_server() -> None:
            async for message in receive:
                await upstream.send_message(message)

        async def from_server() -> None:
            try:
                while True:
                    await runner.send_message(await upstream.get_message())
            except ConnectionClosed as closed:
                reason = closed.reason
                await runner.aclose(
                    reason.code if reason else 1000, reason.reason if reason else None
                )

        with contextlib.suppress(ConnectionClosed):
            async with trio.open_nursery() as nursery:
                for task in (from_runner, to_server, from_server):
                    nursery.start_soon(_then_cancel, task, nursery.cancel_scope)

    def _on_frame(self, message: str | bytes, arrival: float) -> None:
        if "response.body" not in (message if isinstance(message, str) else message.decode()):
            return  # a head, an end, a request: no delta in it
        frame = _decode_frame(message)
        if frame.kind != "response.body" or not frame.body:
            return
        body = frame.body
        if frame.encoding == "base64":
            body = base64.b64decode(body).decode()
        count = body.count(DELTA)
        if count:
            self.deltas.extend([arrival] * count)
            self._changed.set()


async def _then_cancel(task: Callable[[], Awaitable[None]], scope: trio.CancelScope) -> None:
    """Run one direction of the relay; when it ends, so does the whole tunnel."""
    await task()
    scope.cancel()
