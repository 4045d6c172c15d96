"""Processes the bus benchmark starts: ``python -m corral.bench._bus_roles ROLE ...``.

Roles:
    push ENDPOINT N SIZE          raw blocking pyzmq PUSH of N frames (the baseline sender)
    broker ENDPOINT DIR           a broker with its durable log in DIR
    stream ENDPOINT N BATCH       peer ``bench-tx`` sends N stream messages in batches
    durable ENDPOINT N TASKS B    peer ``bench-tx`` sends N durable messages from TASKS tasks,
                                  B at a time per task
    echo ENDPOINT                 peer ``bench-echo`` answers every request
    paced ENDPOINT N MS           peer ``bench-tx`` sends N stream messages, one every MS ms
    raw-router ENDPOINT           raw blocking pyzmq ROUTER that forwards ``[to, payload]``
                                  from a peer to ``to`` as ``[from, payload]`` (the round
                                  trip's baseline broker)
    raw-echo ENDPOINT             raw blocking pyzmq DEALER ``raw-echo`` that sends every
                                  ``[from, payload]`` back to ``from``
Each role prints ``ready`` when connected and runs until it is done or its stdin closes.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import trio
import zmq

from ..bus import Broker, open_peer
from ..config import BusSettings
from ._messages import Count, Ping


def push(endpoint: str, n: int, size: int) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.SNDHWM, 20_000)
    sock.setsockopt(zmq.LINGER, 5000)
    sock.connect(endpoint)
    print("ready", flush=True)
    sys.stdin.readline()
    frame = b"x" * size
    for _ in range(n):
        sock.send(frame)
    sock.close()
    ctx.term()


def _serve_raw(sock: zmq.Socket, handle: Callable[[list[bytes]], list[bytes]]) -> None:
    """Answer every message on ``sock`` with ``handle``'s frames until stdin closes."""
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    poller.register(sys.stdin, zmq.POLLIN)
    print("ready", flush=True)
    while True:
        for what, _ in poller.poll():
            if what is sock:
                sock.send_multipart(handle(sock.recv_multipart()))
            elif not sys.stdin.readline():
                return


def raw_router(endpoint: str) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.bind(endpoint)
    _serve_raw(sock, lambda frames: [frames[1], frames[0], *frames[2:]])
    sock.close(0)
    ctx.term()


def raw_echo(endpoint: str) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, b"raw-echo")
    sock.connect(endpoint)
    _serve_raw(sock, lambda frames: frames)
    sock.close(0)
    ctx.term()


async def _wait_stdin_closed() -> None:
    stdin = trio.lowlevel.FdStream(sys.stdin.fileno())
    while await stdin.receive_some(1024):
        pass


async def broker(endpoint: str, directory: str) -> None:
    b = Broker([endpoint], Path(directory) / "mb.log", BusSettings(), ctx=zmq.Context())
    for name in ("bench-rx", "bench-echo"):
        b.register(name)
    async with trio.open_nursery() as nursery:
        await nursery.start(b.run)
        print("ready", flush=True)
        await _wait_stdin_closed()
        print(f"commits {b.stats['commits']}", flush=True)
        nursery.cancel_scope.cancel()


async def stream(endpoint: str, n: int, batch: int) -> None:
    async with open_peer("bench-tx", endpoint) as peer:
        print("ready", flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline)
        for start in range(0, n, batch):
            await peer.cast_many(
                "bench-rx", [Count(n=i) for i in range(start, min(n, start + batch))]
            )
        await _wait_stdin_closed()


async def paced(endpoint: str, n: int, interval_ms: float) -> None:
    async with open_peer("bench-tx", endpoint) as peer:
        print("ready", flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline)
        for i in range(n):
            await peer.cast("bench-rx", Count(n=i))
            await trio.sleep(interval_ms / 1000)
        await _wait_stdin_closed()


async def durable(endpoint: str, n: int, tasks: int, batch: int) -> None:
    async with open_peer("bench-tx", endpoint) as peer:
        print("ready", flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline)

        async def sender(count: int) -> None:
            for start in range(0, count, batch):
                msgs = [Count(n=i) for i in range(start, min(count, start + batch))]
                await peer.cast_many("bench-rx", msgs, durable=True, timeout=60)

        async with trio.open_nursery() as nursery:
            for t in range(tasks):
                nursery.start_soon(sender, n // tasks + (t < n % tasks))
        await _wait_stdin_closed()


async def echo(endpoint: str) -> None:
    async with (
        open_peer("bench-echo", endpoint, accepts=Ping) as peer,
        trio.open_nursery() as nursery,
    ):
        print("ready", flush=True)

        async def serve() -> None:
            async for incoming in peer.inbox:
                if isinstance(incoming.msg, Ping):
                    await peer.reply(incoming, incoming.msg)

        nursery.start_soon(serve)
        await _wait_stdin_closed()
        nursery.cancel_scope.cancel()


def main(argv: list[str]) -> None:
    role, endpoint, *rest = argv
    if role == "push":
        push(endpoint, int(rest[0]), int(rest[1]))
    elif role == "broker":
        trio.run(broker, endpoint, rest[0])
    elif role == "stream":
        trio.run(stream, endpoint, int(rest[0]), int(rest[1]))
    elif role == "durable":
        trio.run(durable, endpoint, int(rest[0]), int(rest[1]), int(rest[2]))
    elif role == "paced":
        trio.run(paced, endpoint, int(rest[0]), float(rest[1]))
    elif role == "echo":
        trio.run(echo, endpoint)
    elif role == "raw-router":
        raw_router(endpoint)
    elif role == "raw-echo":
        raw_echo(endpoint)
    else:
        raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
