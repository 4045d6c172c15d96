"""Dispatch's journal feed: a round's appends, one per run, travel in one durable message.

With many sessions streaming at once a round holds an event or two for each of dozens of
runs; a durable message per run cost the broker an entry, an acceptance and an ack each
(#20). A stand-in peer records what the feed sends."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import trio

from corral.actors.dispatch._journal_feed import BATCH_BYTES, JournalFeed, batch_budget
from corral.actors.dispatch._receipts import Receipts
from corral.actors.journal import JournalAppends, JournalEvent


class _Peer:
    """Records each ``cast_many``; fails the ones named in ``fail``."""

    def __init__(self, fail: int = 0) -> None:
        self.sent: list[tuple[list[Any], dict[str, Any]]] = []
        self.fail = fail

    async def cast_many(self, to: str, msgs: Sequence[Any], **kw: Any) -> list[str]:
        await trio.lowlevel.checkpoint()
        self.sent.append((list(msgs), {"to": to, **kw}))
        if self.fail:
            self.fail -= 1
            raise TimeoutError("no acceptance")
        return [f"id-{n}" for n in range(len(msgs))]


def _event(seq: int, size: int = 10) -> JournalEvent:
    return JournalEvent(event="delta", payload_json=b'"' + b"x" * size + b'"', session_seq=seq)


async def _round(feed: JournalFeed, peer: _Peer) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(feed.run)
        await feed.sent()
        nursery.cancel_scope.cancel()


async def test_a_round_of_many_runs_is_one_durable_message() -> None:
    peer = _Peer()
    receipts = Receipts()
    confirmed: dict[str, int] = {}
    receipts.on_sent = confirmed.__setitem__
    feed = JournalFeed(peer, "journal", receipts)  # type: ignore[arg-type]
    for n in range(40):
        session = f"s-{n % 20}"
        receipts.expect((session, n + 1), 1, track=False, k=n + 1)
        feed.add(session, f"run-{n % 20}", _event(n + 1), terminal=n >= 38)
    await _round(feed, peer)
    assert len(peer.sent) == 1
    msgs, kw = peer.sent[0]
    assert kw["to"] == "journal" and kw["durable"] is True
    assert kw["session_ids"] == [None]  # the envelope names a session only for one
    (batch,) = msgs
    assert isinstance(batch, JournalAppends)
    runs = [(a.session_id, a.run_id, [e.session_seq for e in a.events]) for a in batch.appends]
    # Open runs first, then the runs a terminal event closed, in the order they closed.
    assert runs[:18] == [(f"s-{r}", f"run-{r}", [r + 1, r + 21]) for r in range(18)]
    assert runs[18:] == [("s-18", "run-18", [19, 39]), ("s-19", "run-19", [20, 40])]
    # The journal is the one receiver here: every session's events are confirmed.
    assert confirmed == {f"s-{r}": r + 21 for r in range(20)}


async def test_a_round_past_the_byte_budget_goes_in_several_messages() -> None:
    peer = _Peer()
    feed = JournalFeed(peer, "journal", Receipts())  # type: ignore[arg-type]
    third = BATCH_BYTES // 3
    for n in range(4):
        feed.add("s-big", f"run-{n}", _event(n + 1, third), terminal=False)
    feed.add("s-big", "run-huge", _event(9, 2 * BATCH_BYTES), terminal=False)
    feed.add("s-big", "run-small", _event(10), terminal=False)
    await _round(feed, peer)
    (msgs, kw) = peer.sent[0]
    assert [[a.run_id for a in m.appends] for m in msgs] == [
        ["run-0", "run-1"],
        ["run-2", "run-3"],
        ["run-huge"],  # larger than the budget: alone
        ["run-small"],
    ]
    assert kw["session_ids"] == ["s-big"] * 4


async def test_one_runs_events_past_the_budget_go_on_in_the_next_message() -> None:
    """A flood's round: one run's events, far more than a message holds, as consecutive
    appends of that run, each message under the budget, every event once and in order, the
    terminal one last. Sent as one append, a 200,000-delta turn's rounds were 7 to 32 MB, over
    the bus's 4 MiB limit: refused, and most of the run never reached the journal."""
    peer = _Peer()
    receipts = Receipts()
    confirmed: dict[str, int] = {}
    receipts.on_sent = confirmed.__setitem__
    budget = 4096
    feed = JournalFeed(peer, "journal", receipts, budget=budget)  # type: ignore[arg-type]
    feed.add("s-0", "run-a", _event(1), terminal=False)
    for seq in range(1, 501):
        receipts.expect(("s-1", seq), 1, track=False, k=seq)
        feed.add("s-1", "run-flood", _event(seq, 40), terminal=seq == 500)
    await _round(feed, peer)
    (msgs, kw) = peer.sent[0]
    assert len(msgs) > 10
    sizes = [
        sum(len(e.payload_json or b"") + 64 for a in m.appends for e in a.events) for m in msgs
    ]
    assert max(sizes) <= budget
    flood = [a for m in msgs for a in m.appends if a.run_id == "run-flood"]
    assert {(a.session_id, a.run_id) for a in flood} == {("s-1", "run-flood")}
    assert [e.session_seq for a in flood for e in a.events] == list(range(1, 501))
    assert msgs[0].appends[0].run_id == "run-a"
    assert kw["session_ids"][1:] == ["s-1"] * (len(msgs) - 1)
    assert confirmed == {"s-1": 500}


def test_the_budget_follows_the_bus_message_limit() -> None:
    assert batch_budget(4 * 1024 * 1024) == BATCH_BYTES
    assert batch_budget(64 * 1024) == 16 * 1024


async def test_a_round_that_fails_confirms_nothing_of_its_sessions() -> None:
    peer = _Peer(fail=1)
    receipts = Receipts()
    confirmed: dict[str, int] = {}
    receipts.on_sent = confirmed.__setitem__
    feed = JournalFeed(peer, "journal", receipts)  # type: ignore[arg-type]
    for n in range(3):
        receipts.expect((f"s-{n}", 1), 1, track=False, k=1)
        feed.add(f"s-{n}", "run", _event(1), terminal=False)
    await _round(feed, peer)
    assert len(peer.sent) == 1 and confirmed == {}
    # Its workers keep the events; a later round's events confirm as usual.
    receipts.expect(("s-0", 2), 1, track=False, k=2)
    feed.add("s-0", "run", _event(2), terminal=False)
    await _round(feed, peer)
    assert confirmed == {"s-0": 2}
