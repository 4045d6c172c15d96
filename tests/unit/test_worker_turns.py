"""The worker's turn bookkeeping against a peer whose durable sends wait for a commit."""

from __future__ import annotations

from typing import Any

import msgspec
import trio

from corral.bus import Envelope, Incoming, Message
from corral.config import LivenessSettings
from corral.harnesses._worker import TurnContext, Worker
from corral.harnesses.protocol import ResponseCompleted, TurnStart


class _SlowCommitPeer:
    """A stand-in for a bus peer: durable sends return when the test releases the commit."""

    name = "harness/s1"
    incarnation = "test"

    def __init__(self) -> None:
        self.commit = trio.Event()
        self.sent: list[Message] = []

    async def cast(self, to: str, msg: Message, *, durable: bool = False, **_: Any) -> str:
        self.sent.append(msg)
        if durable:
            await self.commit.wait()
        return "id"

    async def cast_many(self, to: str, msgs: list[Message], **_: Any) -> list[str]:
        self.sent.extend(msgs)
        return []


class _OneLine:
    async def run_turn(self, turn: TurnContext) -> None:
        await turn.text("hi")


def _start(turn_id: str) -> Incoming:
    msg = TurnStart(session_id="s1", turn_id=turn_id, spec={}, message={})
    env = Envelope(
        id=turn_id,
        sender="harness",
        recipient="harness/s1",
        type="harness.turn",
        body=msgspec.Raw(b""),
    )
    return Incoming(env, msg)


async def test_h03_next_turn_is_taken_while_the_last_terminal_commits() -> None:
    """The broker hands a terminal on before its commit ends, so the next turn's start can
    arrive while the worker still awaits the terminal's acceptance: the turn is over by then
    (before, the worker answered 409 and the next turn failed ``harness_busy``)."""
    peer = _SlowCommitPeer()
    worker = Worker(peer, "s1", _OneLine(), LivenessSettings())  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        first = await worker._on_input(_start("turn_1"), nursery)
        assert first is not None and first.status == 200
        with trio.fail_after(5):
            while not any(isinstance(m, ResponseCompleted) for m in peer.sent):
                await trio.sleep(0.01)
        second = await worker._on_input(_start("turn_2"), nursery)
        assert second is not None and second.status == 200, second
        assert worker.turn is not None and worker.turn.turn_id == "turn_2"
        peer.commit.set()
        with trio.fail_after(5):
            while worker.turn is not None:
                await trio.sleep(0.01)
        ends = [m.turn_id for m in peer.sent if isinstance(m, ResponseCompleted)]
        assert ends == ["turn_1", "turn_2"]
