"""The tunnel's stream runs a text frame's sent-callback in the step that wrote it (E-03).

A real trio-websocket client over TCP on 127.0.0.1, plain and over TLS; the far end answers the
upgrade by hand and then reads nothing, so what the kernel holds for it shows what was
written. A trio instrument counts scheduler steps and notes the first step after which the
frame's bytes are there: the callback must run in that very step (a mark written one round
later left a window in which a ``kill -9`` made the next gateway send the frame again).
"""

from __future__ import annotations

import base64
import hashlib
import socket
import ssl
import subprocess
from pathlib import Path

import pytest
import trio
import trio.lowlevel
from trio_websocket import ConnectionClosed, WebSocketConnection, wrap_client_stream

from corral.actors.gateway._wire import MarkedStream, install

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class Steps(trio.abc.Instrument):
    """Counts task steps; notes after which one the peer socket first holds bytes."""

    def __init__(self, peer: socket.socket) -> None:
        self.peer = peer
        self.step = 0
        self.first_with_data: int | None = None

    def watch(self) -> None:
        self.first_with_data = None

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if self.first_with_data is None and _has_data(self.peer):
            self.first_with_data = self.step
        self.step += 1


def _has_data(peer: socket.socket) -> bool:
    try:
        return bool(peer.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except BlockingIOError:
        return False


async def _answer_upgrade(stream: trio.abc.Stream) -> None:
    request = b""
    while b"\r\n\r\n" not in request:
        request += await stream.receive_some(4096)
    key = next(
        line.split(b":", 1)[1].strip()
        for line in request.split(b"\r\n")
        if line.lower().startswith(b"sec-websocket-key:")
    )
    accept = base64.b64encode(hashlib.sha1(key + _GUID).digest())
    await stream.send_all(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n"
    )


def _certificate(tmp: Path) -> tuple[Path, Path]:
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-nodes", "-days", "1", "-subj", "/CN=localhost"),
            *("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"),
            *("-addext", "subjectAltName=DNS:localhost", "-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


async def _connect(
    nursery: trio.Nursery, tls: Path | None
) -> tuple[WebSocketConnection, MarkedStream, socket.socket, trio.abc.Stream]:
    """A client WebSocket over one end of a socket pair; the raw other end, and the server's
    stream on it (kept open, never read after the upgrade)."""
    listener = socket.create_server(("127.0.0.1", 0))
    ours = trio.socket.socket()
    with listener:
        await ours.connect(listener.getsockname())
        raw_peer, _ = listener.accept()
    raw_peer.setblocking(False)
    server: trio.abc.Stream = trio.SocketStream(trio.socket.from_stdlib_socket(raw_peer.dup()))
    client: trio.SocketStream | trio.SSLStream[trio.SocketStream] = trio.SocketStream(ours)
    if tls is not None:
        cert, key = _certificate(tls)
        server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ctx.load_cert_chain(cert, key)
        client_ctx = ssl.create_default_context(cafile=str(cert))
        server = trio.SSLStream(server, server_ctx, server_side=True)
        client = trio.SSLStream(client, client_ctx, server_hostname="localhost")
    async with trio.open_nursery() as handshake:
        handshake.start_soon(_answer_upgrade, server)
        ws = await wrap_client_stream(nursery, client, "localhost", "/tunnel")
    return ws, install(ws), raw_peer, server


@pytest.mark.parametrize("tls", [False, True], ids=["ws", "wss"])
async def test_e03_a_text_frames_callback_runs_in_the_step_that_wrote_it(
    tls: bool, tmp_path: Path, nursery: trio.Nursery
) -> None:
    ws, marked, peer, _server = await _connect(nursery, tmp_path if tls else None)
    steps = Steps(peer)
    trio.lowlevel.add_instrument(steps)
    try:

        async def busy() -> None:
            while True:  # other tasks' steps: a late callback would come after some
                await trio.lowlevel.checkpoint()

        nursery.start_soon(busy)
        for n in range(20):
            ran_in: list[int] = []
            while _has_data(peer):
                peer.recv(65536)
            steps.watch()

            def mark(ran_in: list[int] = ran_in) -> None:
                # Corked: the server's reader is not woken before the mark is written.
                assert not _has_data(peer)
                ran_in.append(steps.step)

            marked.armed = mark
            await ws.send_message(f"frame {n} " + "x" * (n * 700))
            assert steps.first_with_data is not None
            assert ran_in == [steps.first_with_data], (n, ran_in, steps.first_with_data)
    finally:
        trio.lowlevel.remove_instrument(steps)


async def test_a_ping_written_first_leaves_the_callback_to_the_text_frame(
    nursery: trio.Nursery,
) -> None:
    ws, marked, _peer, _server = await _connect(nursery, None)
    ran: list[str] = []
    marked.armed = lambda: ran.append("text")
    # A masked ping with an empty payload, as the pinger's share of the stream would be.
    await marked.send_all(bytes([0x89, 0x80, 0, 0, 0, 0]))
    assert ran == []
    await ws.send_message("the frame")
    assert ran == ["text"]


async def test_a_frame_that_is_not_written_never_runs_its_callback(
    nursery: trio.Nursery,
) -> None:
    ws, marked, peer, server = await _connect(nursery, None)
    await server.aclose()
    peer.close()
    ran: list[str] = []
    with pytest.raises(ConnectionClosed):
        for _ in range(100):  # the first writes may still land in the socket's buffer
            ran.clear()
            marked.armed = lambda: ran.append("sent")
            await ws.send_message("x" * 65536)
    assert ran == []
