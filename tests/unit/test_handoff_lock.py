"""HandoffLock: dispatch's turn lock, a fair mutex without trio.Lock's per-acquire owner
bookkeeping (:mod:`corral.actors._handoff`)."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from corral.actors._handoff import HandoffLock


async def test_a_free_lock_is_taken_without_a_wait_and_a_held_one_refuses_nowait() -> None:
    lock = HandoffLock()
    lock.acquire_nowait()
    assert lock.locked()
    with pytest.raises(trio.WouldBlock):
        lock.acquire_nowait()
    lock.release()
    assert not lock.locked()
    with pytest.raises(RuntimeError):
        lock.release()


async def test_release_hands_the_lock_to_waiters_in_the_order_they_asked() -> None:
    lock = HandoffLock()
    order: list[int] = []

    async def take(i: int) -> None:
        async with lock:
            order.append(i)
            await trio.lowlevel.checkpoint()

    lock.acquire_nowait()
    async with trio.open_nursery() as nursery:
        for i in range(5):
            nursery.start_soon(take, i)
            await trio.testing.wait_all_tasks_blocked()
        lock.release()
        # Handed over, not freed: a task that asks now queues behind the waiters.
        assert lock.locked()
        with pytest.raises(trio.WouldBlock):
            lock.acquire_nowait()
    assert order == [0, 1, 2, 3, 4]
    assert not lock.locked()


async def test_a_waiter_cancelled_while_parked_leaves_the_queue_and_never_holds_it() -> None:
    lock = HandoffLock()
    got: list[str] = []

    async def take(name: str) -> None:
        async with lock:
            got.append(name)

    lock.acquire_nowait()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(take, "first")
        await trio.testing.wait_all_tasks_blocked()
        cancel = trio.CancelScope()

        async def cancelled() -> None:
            with cancel:
                await take("cancelled")

        nursery.start_soon(cancelled)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(take, "last")
        await trio.testing.wait_all_tasks_blocked()
        cancel.cancel()
        await trio.testing.wait_all_tasks_blocked()
        lock.release()
    assert got == ["first", "last"]
    assert not lock.locked()


async def test_acquire_is_a_checkpoint_even_when_the_lock_is_free() -> None:
    lock = HandoffLock()
    with trio.CancelScope() as scope:
        scope.cancel()
        with pytest.raises(trio.Cancelled):
            await lock.acquire()
    assert not lock.locked()
