"""The peer's inbox: FIFO, cheap receives that still share the loop, room for producers."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from corral.bus._inbox import FAIR_SHARE, InboxQueue


async def test_fifo_and_nowait() -> None:
    q: InboxQueue[int] = InboxQueue(10)
    with pytest.raises(trio.WouldBlock):
        q.receive_nowait()
    for i in range(5):
        q.put(i)
    assert len(q) == 5
    assert [await q.receive() for _ in range(4)] + [q.receive_nowait()] == [0, 1, 2, 3, 4]
    assert q.taken == 5


async def test_a_busy_consumer_lets_other_tasks_run_once_per_fair_share() -> None:
    q: InboxQueue[int] = InboxQueue(10_000)
    n = 10 * FAIR_SHARE
    for i in range(n):
        q.put(i)
    ticks = 0

    async def other_task() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other_task)
        await trio.lowlevel.checkpoint()
        start = ticks
        got = [await q.receive() for _ in range(n)]
        during = ticks - start
        nursery.cancel_scope.cancel()
    assert got == list(range(n))
    # A memory channel would let the other task run once per message.
    assert 5 <= during <= 2 * n // FAIR_SHARE, during


async def test_receive_waits_for_a_put_and_a_cancelled_receive_loses_nothing() -> None:
    q: InboxQueue[str] = InboxQueue(10)
    with trio.move_on_after(0.05):
        await q.receive()
    async with trio.open_nursery() as nursery:
        got: list[str] = []

        async def consume() -> None:
            got.append(await q.receive())

        nursery.start_soon(consume)
        await trio.testing.wait_all_tasks_blocked()
        q.put("x")
    assert got == ["x"]


async def test_wait_room_returns_once_the_consumer_takes_below_the_limit() -> None:
    q: InboxQueue[int] = InboxQueue(3)
    for i in range(3):
        q.put(i)
    done = trio.Event()

    async def producer() -> None:
        await q.wait_room()
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(producer)
        await trio.testing.wait_all_tasks_blocked()
        assert not done.is_set()
        q.receive_nowait()
        with trio.fail_after(1):
            await done.wait()
