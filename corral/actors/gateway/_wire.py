"""The tunnel's byte stream: a text frame's sent-callback runs in the step that wrote it.

The hard problem: a gateway marks a frame "written" in its durable buffer so that, restarted
after ``kill -9``, it does not send the frame again to a server that cannot tell a replay
(omnigent's relay has no event id for stream events). trio's socket send yields to the
scheduler *after* the bytes went to the kernel, and ``send_message`` returns only after that
yield: a mark written then comes a whole scheduler round late, and a kill inside that round
made the next gateway send the frame again (3 of 14 kill runs). Writing the mark before the
send would turn that repeat into a loss.

So the stream under the WebSocket writes a text frame's bytes itself, with the non-blocking
system call, and runs the frame's callback right after the call returns, before anything
yields, with the socket corked until then so that no byte of the frame leaves before its
mark (:func:`write_then`). Under TLS the check for "a text frame" happens above the TLS
layer (it needs the plaintext) and the write below it, where that frame's ciphertext goes.

Rules this module keeps:

* Only text frames run a callback: pings, pongs and Close frames (sent by other tasks, or by
  trio-websocket's reader) share the stream, and the tunnel's writer is the only task that
  sends text (the hello goes before it starts, with nothing armed).
* A callback armed for a frame that is not written (the connection broke) never runs; the
  writer sees the send fail and treats the frame as not sent.
* trio-websocket owns its stream privately (``WebSocketConnection._stream``); :func:`install`
  swaps it once after the handshake, and fails loudly if that attribute ever goes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Callable
from typing import Any

import trio
from trio_websocket import WebSocketConnection

log = logging.getLogger("corral.actors.gateway")

#: The low four bits of a WebSocket frame's first byte are its opcode (RFC 6455 §5.2).
_OPCODE_MASK = 0x0F
_TEXT = 0x1


class _Wrapper(trio.abc.Stream):
    """A stream that passes everything but :meth:`send_all` to ``inner``."""

    inner: trio.abc.Stream

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()

    def __getattr__(self, name: str) -> Any:
        # trio-websocket reads the socket's addresses through its stream (``ws.local``).
        return getattr(self.inner, name)


class MarkedStream(_Wrapper):
    """The stream under a tunnel's WebSocket: runs :attr:`armed` in the step that wrote the
    next text frame (see the module docstring)."""

    inner: trio.SocketStream | trio.SSLStream[Any]

    def __init__(self, inner: trio.SocketStream | trio.SSLStream[Any]) -> None:
        self.inner = inner
        #: Run once the next text frame's bytes are written (the tunnel's writer arms it).
        self.armed: Callable[[], None] | None = None
        #: Under TLS: the callback the socket below runs for the frame being written.
        self.tls_pending: Callable[[], None] | None = None
        if isinstance(inner, trio.SSLStream):
            if not isinstance(inner.transport_stream, trio.SocketStream):
                raise TypeError("a TLS tunnel's transport must be a socket stream")
            inner.transport_stream = _SocketUnderTls(inner.transport_stream, self)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        callback = self.armed
        if callback is None or not _is_text(data):
            await self.inner.send_all(data)
            return
        self.armed = None
        if isinstance(self.inner, trio.SocketStream):
            await write_then(self.inner, data, callback)
            return
        self.tls_pending = callback
        try:
            await self.inner.send_all(data)
        finally:
            left, self.tls_pending = self.tls_pending, None
        if left is not None:
            # The TLS layer sent the frame without a write of its own (it never has so far):
            # late is still better than never.
            _run(left)


class _SocketUnderTls(_Wrapper):
    """The socket under TLS: the write carrying an armed text frame's ciphertext runs its
    callback."""

    inner: trio.SocketStream

    def __init__(self, inner: trio.SocketStream, owner: MarkedStream) -> None:
        self.inner = inner
        self.owner = owner

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        callback, self.owner.tls_pending = self.owner.tls_pending, None
        if callback is None:
            await self.inner.send_all(data)
        else:
            await write_then(self.inner, data, callback)


async def write_then(
    stream: trio.SocketStream, data: bytes | bytearray | memoryview, callback: Callable[[], None]
) -> None:
    """Write ``data`` with the non-blocking system call, then run ``callback`` before
    anything yields (it never runs if the write fails).

    On TCP the write is corked until the callback ran: a write that wakes the server's
    reader lets the kernel switch to it (and to whoever watches it) at once, so without the
    cork a ``kill -9`` timed by what the server received still landed between the write and
    the mark in about one kill in twenty. Corked, nothing leaves before the mark is written;
    a process killed in between still sends the frame when the kernel closes its socket
    (a repeat, as before, never a loss), but the window is two system calls wide.

    Raises:
        trio.BrokenResourceError: the socket broke.
    """
    await trio.lowlevel.checkpoint_if_cancelled()
    sock = stream.socket
    cork = sock.family in (socket.AF_INET, socket.AF_INET6)
    fd = sock.fileno()
    view = memoryview(data)
    try:
        if cork:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
        while view:
            try:
                view = view[os.write(fd, view) :]
            except BlockingIOError:
                await trio.lowlevel.wait_writable(fd)
        _run(callback)
    except OSError as exc:
        raise trio.BrokenResourceError(f"the tunnel's socket broke: {exc}") from exc
    finally:
        if cork:
            with contextlib.suppress(OSError):  # out it goes (unless the socket broke)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)
    await trio.lowlevel.cancel_shielded_checkpoint()


def install(ws: WebSocketConnection) -> MarkedStream:
    """Put a :class:`MarkedStream` under ``ws``, after its handshake.

    Raises:
        TypeError: this trio-websocket keeps its stream elsewhere, or not on a socket: a
            tunnel refused at connect beats a silent repeat after a kill.
    """
    stream = getattr(ws, "_stream", None)
    if not isinstance(stream, trio.SocketStream | trio.SSLStream):
        raise TypeError(f"trio-websocket's stream is {type(stream).__name__}, not a socket")
    marked = MarkedStream(stream)
    ws._stream = marked  # type: ignore[assignment]
    return marked


def _is_text(data: bytes | bytearray | memoryview) -> bool:
    return len(data) > 0 and data[0] & _OPCODE_MASK == _TEXT


def _run(callback: Callable[[], None]) -> None:
    try:
        callback()
    except Exception:
        log.exception("a tunnel frame's sent-callback failed")
