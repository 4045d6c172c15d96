"""A worker's runs of deltas packed in Deltas messages (:func:`pack_deltas`), and the worker
packing only for a ``reply_to`` that asked (``TurnStart.batch``)."""

from __future__ import annotations

from typing import Any

import msgspec
import trio

from corral.bus import Envelope, Incoming, Message
from corral.config import BusSettings, LivenessSettings
from corral.harnesses._turn import TurnContext
from corral.harnesses._worker import Worker
from corral.harnesses.protocol import (
    DELTAS_MAX,
    Deltas,
    OutputItemDone,
    OutputTextDelta,
    ReasoningDelta,
    ResponseCompleted,
    TurnStart,
    pack_deltas,
)


def _delta(k: int, text: str = "x") -> OutputTextDelta:
    return OutputTextDelta(turn_id="t", sequence_number=k, delta=text)


def _unpacked(msgs: list[Message]) -> list[Message]:
    return [e for m in msgs for e in (m.events if isinstance(m, Deltas) else [m])]


def test_runs_of_deltas_are_packed_in_order_and_other_events_break_them() -> None:
    item = OutputItemDone(turn_id="t", sequence_number=3, item={"type": "message"})
    reasoning = ReasoningDelta(turn_id="t", sequence_number=2, delta="hm")
    msgs: list[Message] = [_delta(0), _delta(1), reasoning, item, _delta(4), item, _delta(6)]
    packed = pack_deltas(msgs, max_chars=1000)
    assert [type(m) for m in packed] == [
        Deltas,
        OutputItemDone,
        OutputTextDelta,
        OutputItemDone,
        OutputTextDelta,
    ]
    assert _unpacked(packed) == msgs, "every event once, in order"
    assert packed[2] == msgs[4], "a run of one goes as it is"


def test_a_pack_holds_at_most_deltas_max_events_and_max_chars_of_text() -> None:
    many: list[Message] = [_delta(k) for k in range(DELTAS_MAX * 2 + 1)]
    packed = pack_deltas(many, max_chars=10**6)
    assert [len(m.events) if isinstance(m, Deltas) else 1 for m in packed] == [
        DELTAS_MAX,
        DELTAS_MAX,
        1,
    ]
    assert _unpacked(packed) == many
    texts: list[Message] = [_delta(k, "abcd") for k in range(10)] + [_delta(10, "z" * 50)]
    packed = pack_deltas(texts, max_chars=12)
    assert [len(m.events) if isinstance(m, Deltas) else 1 for m in packed] == [3, 3, 3, 1, 1]
    assert _unpacked(packed) == texts, "one larger than a pack goes alone"


def test_a_pack_decodes_to_the_deltas_that_went_in() -> None:
    msgs: list[Message] = [
        _delta(0, "é"),
        ReasoningDelta(turn_id="t", sequence_number=1, delta="r"),
    ]
    (pack,) = pack_deltas(msgs, max_chars=100)
    data = msgspec.msgpack.encode(pack)
    assert msgspec.msgpack.decode(data, type=Deltas) == pack


class _Peer:
    """A stand-in for the worker's bus peer that records what it sends, message by message."""

    name = "harness/s1"
    incarnation = "test"
    bus = BusSettings()

    def __init__(self) -> None:
        self.sent: list[tuple[str, Message]] = []
        self.completed = trio.Event()

    async def cast(self, to: str, msg: Message, **_: Any) -> str:
        self.sent.append((to, msg))
        if isinstance(msg, ResponseCompleted):
            self.completed.set()
        return "id"

    async def cast_many(self, to: str, msgs: list[Message], **_: Any) -> list[str]:
        self.sent.extend((to, m) for m in msgs)
        return []


class _Floods:
    async def run_turn(self, turn: TurnContext) -> None:
        for _ in range(1000):
            await turn.text("x")


async def _turns_sent(*batch: bool) -> list[list[Message]]:
    """What one worker sent dispatch in each of its turns, one turn per ``batch`` flag."""
    peer = _Peer()
    worker = Worker(peer, "s1", _Floods(), LivenessSettings())  # type: ignore[arg-type]
    sent: list[list[Message]] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.outbox.run)
        for i, asked in enumerate(batch):
            start = TurnStart(session_id="s1", turn_id=f"t{i}", spec={}, message={}, batch=asked)
            env = Envelope(
                id=f"m{i}",
                sender="harness",
                recipient=peer.name,
                type="harness.turn",
                body=msgspec.Raw(b""),
            )
            peer.completed = trio.Event()
            await worker._on_input(Incoming(env, start), nursery)
            with trio.fail_after(10):
                await peer.completed.wait()
                await worker._turn_done.wait()
            sent.append([m for to, m in peer.sent if to == "dispatch"])
            peer.sent.clear()
        nursery.cancel_scope.cancel()
    return sent


async def test_a_worker_packs_deltas_only_for_a_turn_whose_reply_to_asked() -> None:
    packed, single = await _turns_sent(True, False)
    assert not any(isinstance(m, Deltas) for m in single)
    assert sum(isinstance(m, OutputTextDelta) for m in single) == 1000
    deltas = [e for m in packed if isinstance(m, Deltas) for e in m.events]
    assert [d.sequence_number for d in deltas] == [
        d.sequence_number for d in single if isinstance(d, OutputTextDelta)
    ]
    assert sum(isinstance(m, Deltas) for m in packed) <= 1000 // 64, "a message per delta"
