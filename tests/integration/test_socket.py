"""The trio ⇄ pyzmq adapter between two OS processes: concurrent send and receive, no loss."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import trio
import zmq

from corral.bus import Socket, configure

COUNT = 100_000


@pytest.mark.chaos
@pytest.mark.parametrize("transport", ["ipc", "tcp"])
async def test_100k_concurrent_send_and_receive_between_processes(
    tmp_path: Path, transport: str
) -> None:
    """A ROUTER here echoes; the child sends and receives on one DEALER at the same time."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    configure(sock, hwm=1000, linger_ms=0)
    if transport == "ipc":
        endpoint = f"ipc://{tmp_path}/pair.sock"
        sock.bind(endpoint)
    else:
        port = sock.bind_to_random_port("tcp://127.0.0.1")
        endpoint = f"tcp://127.0.0.1:{port}"
    router = Socket(sock)
    child = await trio.lowlevel.open_process(
        [sys.executable, "-m", "tests.integration._pair", endpoint, str(COUNT)],
        stdout=subprocess.PIPE,
    )
    echoed = 0
    with trio.fail_after(120):
        while echoed < COUNT:
            batch = await router.receive_batch(512)
            await router.send_many(batch)
            echoed += len(batch)
        out = b""
        while chunk := await child.stdout.receive_some(1000):  # type: ignore[union-attr]
            out += chunk
        await child.wait()
    router.close()
    ctx.term()
    assert out.decode().split() == ["ok", str(COUNT), "True"]
    assert child.returncode == 0


async def test_send_and_receive_in_one_process_do_not_lose_wakeups(tmp_path: Path) -> None:
    """The naive adapter hangs here: a send consumes the edge the receiver waits for."""
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    for s in (a, b):
        configure(s, hwm=100, linger_ms=0)
    a.bind(f"ipc://{tmp_path}/p.sock")
    b.connect(f"ipc://{tmp_path}/p.sock")
    sa, sb = Socket(a), Socket(b)
    n = 20_000
    got_a: list[bytes] = []
    got_b: list[bytes] = []

    async def pump(src: Socket, count: int) -> None:
        for i in range(count):
            await src.send([b"%d" % i])

    async def drain(dst: Socket, into: list[bytes], count: int) -> None:
        while len(into) < count:
            into.extend(f[0] for f in await dst.receive_batch(64))

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pump, sa, n)
            nursery.start_soon(pump, sb, n)
            nursery.start_soon(drain, sa, got_a, n)
            nursery.start_soon(drain, sb, got_b, n)
    assert got_a == [b"%d" % i for i in range(n)] == got_b
    sa.close()
    sb.close()
    ctx.term()


async def test_close_wakes_a_blocked_receiver(tmp_path: Path) -> None:
    from corral import BusClosed

    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    configure(sock, hwm=10, linger_ms=0)
    sock.bind(f"ipc://{tmp_path}/c.sock")
    s = Socket(sock)
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:

            async def receiver() -> None:
                with pytest.raises(BusClosed):
                    await s.receive()

            nursery.start_soon(receiver)
            await trio.testing.wait_all_tasks_blocked()
            s.close()
    ctx.term()


async def test_router_mandatory_reports_missing_peer() -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    configure(sock, hwm=10, linger_ms=0)
    sock.bind_to_random_port("tcp://127.0.0.1")
    s = Socket(sock)
    with pytest.raises(zmq.ZMQError) as info:
        s.send_nowait([b"nobody", b"x"])
    assert info.value.errno == zmq.EHOSTUNREACH
    s.close()
    ctx.term()
