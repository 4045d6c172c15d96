"""A worker's unconfirmed events as its flow control: a turn that outruns dispatch waits at
``HELD_MAX`` for a confirmation, and drops the oldest only once dispatch has confirmed nothing
for ``ROOM_WAIT_S``. Dropping at once cost every flood past 65,536 unconfirmed events its
resend on a dispatch crash; whole-system: ``tests/integration/test_flood.py``."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from corral.harnesses import _held
from corral.harnesses._held import ROOM_WAIT_S, HeldEvents
from corral.harnesses.protocol import Confirmed, OutputTextDelta

MAX = 8


@pytest.fixture(autouse=True)
def _small(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_held, "HELD_MAX", MAX)


def _delta(seq: int) -> OutputTextDelta:
    return OutputTextDelta(delta="x", turn_id="t", sequence_number=seq)


def _full() -> HeldEvents:
    held = HeldEvents()
    for seq in range(MAX):
        held.hold("dispatch", _delta(seq))
    assert held.full()
    return held


async def test_a_full_worker_waits_for_a_confirmation_and_drops_nothing() -> None:
    held = _full()
    returned = trio.Event()

    async def room() -> None:
        await held.room()
        returned.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(room)
        await trio.testing.wait_all_tasks_blocked()
        assert not returned.is_set()
        held.confirmed(Confirmed(session_id="s", turn_id="other", upto=MAX))
        await trio.testing.wait_all_tasks_blocked()
        assert not returned.is_set()  # another turn's confirmation frees nothing here
        held.confirmed(Confirmed(session_id="s", turn_id="t", upto=2))
        await returned.wait()
    held.hold("dispatch", _delta(MAX))
    assert held.dropped == 0
    assert [e.sequence_number for _, e in held.events] == list(range(3, MAX + 1))


async def test_a_dispatch_that_confirms_nothing_is_waited_for_then_the_oldest_go(
    autojump_clock: Any, caplog: Any
) -> None:
    held = _full()
    start = trio.current_time()
    await held.room()
    assert trio.current_time() - start == pytest.approx(ROOM_WAIT_S)
    held.hold("dispatch", _delta(MAX))
    assert held.dropped == 1 and held.events[0][1].sequence_number == 1
    assert "confirmed nothing for 30 s" in caplog.text
    # Once stalled, later events do not wait (one wait per event would stall the turn).
    now = trio.current_time()
    await held.room()
    assert trio.current_time() == now
    held.hold("dispatch", _delta(MAX + 1))
    # The turn's resend (a restarted dispatch asks) holds what is left, oldest first.
    answer, events = held.again("t")
    assert (answer.first, answer.last) == (2, MAX + 1) and len(events) == MAX
    # A confirmation ends the stall: a full worker waits again.
    held.confirmed(Confirmed(session_id="s", turn_id="t", upto=2))
    held.hold("dispatch", _delta(MAX + 2))
    start = trio.current_time()
    await held.room()
    assert trio.current_time() - start == pytest.approx(ROOM_WAIT_S)


async def test_room_returns_at_once_below_the_bound() -> None:
    held = HeldEvents()
    held.hold("dispatch", _delta(0))
    with trio.fail_after(1):
        await held.room()
