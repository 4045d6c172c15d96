"""A peer process for the two-process socket tests: one DEALER, concurrent send and receive.

Usage: python -m tests.integration._pair ENDPOINT COUNT
Sends COUNT numbered messages while receiving COUNT echoes on the same socket, then prints
``ok <received> <in-order>``.
"""

from __future__ import annotations

import sys

import trio
import zmq

from corral.bus import Socket, configure


async def main(endpoint: str, count: int) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    configure(sock, hwm=1000, linger_ms=1000)
    sock.connect(endpoint)
    s = Socket(sock)
    received: list[int] = []

    async def sender() -> None:
        for i in range(count):
            await s.send([i.to_bytes(4, "little")])

    async def receiver() -> None:
        while len(received) < count:
            for frames in await s.receive_batch():
                received.append(int.from_bytes(frames[0], "little"))

    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sender)
            nursery.start_soon(receiver)
    s.close()
    ctx.term()
    print("ok", len(received), received == list(range(count)), flush=True)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], int(sys.argv[2]))
