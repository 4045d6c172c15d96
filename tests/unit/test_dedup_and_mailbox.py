"""The dedup helper and mailbox bookkeeping."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.bus import Dedup
from corral.bus._mailbox import Entry, Mailbox


async def test_dedup_marks_once_and_survives_reopen(tmp_path: Path) -> None:
    d = Dedup(tmp_path / "ids")
    assert await d.mark("a", "one")
    assert not await d.mark("a", "again")
    assert d.seen("a") and not d.seen("b")
    d2 = Dedup(tmp_path / "ids")
    assert d2.seen("a") and d2.notes() == ["one"]


async def test_dedup_cuts_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "ids"
    path.write_bytes(b"a\tone\nb\ttw")
    d = Dedup(path)
    assert d.seen("a") and not d.seen("b")
    await d.mark("c", "three")
    assert path.read_bytes() == b"a\tone\nc\tthree\n"


async def test_dedup_is_bounded(tmp_path: Path) -> None:
    d = Dedup(tmp_path / "ids", keep=10)
    for i in range(25):
        await d.mark(str(i))
    assert not d.seen("0") and d.seen("24")
    assert len(Dedup(tmp_path / "ids", keep=10).notes()) == 10


async def test_dedup_refuses_multiline(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        await Dedup(tmp_path / "ids").mark("a\nb")


def _entry(i: int, to: str | None) -> Entry:
    return Entry(
        id=f"m{i}", recipient="x", sender="s", type="t", session_id=None, frame=b"", delivered_to=to
    )


def test_requeue_takes_back_only_other_incarnations_in_order() -> None:
    box = Mailbox("x")
    for i, inc in enumerate(["old", "old", "new"]):
        box.in_flight[f"m{i}"] = _entry(i, inc)
    box.in_flight["m1"].held = True
    box.queued.append(_entry(9, None))
    stale = box.requeue_from("new")
    assert [(e.id, held) for e, held in stale] == [("m0", False), ("m1", True)]
    assert not any(e.held for e in box.queued), "held says so of one delivery only"
    assert [e.id for e in box.queued] == ["m0", "m1", "m9"]
    assert list(box.in_flight) == ["m2"]
    stats = box.statistics(peek=2)
    assert stats["queued"] == 3 and stats["in_flight"] == 1
    assert [p["id"] for p in stats["peek"]] == ["m2", "m0"]


async def test_outbox_keeps_order_with_concurrent_flushers() -> None:
    import trio

    from corral.bus import Outbox
    from tests._echo import EchoCount

    class SlowPeer:
        def __init__(self) -> None:
            self.sent: list[int] = []

        async def cast_many(self, to: str, msgs: list, *, session_id: str | None = None) -> None:
            await trio.lowlevel.checkpoint()  # a real send yields after each run of messages
            self.sent.extend(m.n for m in msgs)

    # trio shuffles runnable tasks, so try a few schedules.
    for _ in range(20):
        peer = SlowPeer()
        outbox = Outbox(peer)  # type: ignore[arg-type]
        async with trio.open_nursery() as nursery:
            for i in range(50):
                outbox.put_nowait("a" if i % 2 else "b", EchoCount(n=i))
            nursery.start_soon(outbox.flush)
            await trio.lowlevel.checkpoint()  # let the first flush take its batch and send one run
            for i in range(50, 100):
                await outbox.put("a" if i % 2 else "b", EchoCount(n=i))
            nursery.start_soon(outbox.flush)
        assert peer.sent == list(range(100))
