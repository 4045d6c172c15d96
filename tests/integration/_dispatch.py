"""A stand-in for the dispatch actor in harness tests: sends inputs, collects outputs."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio

from corral.actors.dispatch.messages import Inbound
from corral.bus import Message, Peer, open_peer
from corral.config import LivenessSettings
from corral.harnesses.protocol import HARNESS_ACTOR, Output, TurnStart, is_terminal

FAST = LivenessSettings(interval_s=0.2, liveness=3)


class FakeDispatch:
    """Collects every harness output addressed to it, in arrival order."""

    def __init__(self, peer: Peer) -> None:
        self.peer = peer
        self.events: list[Output] = []
        self._changed = trio.Event()

    async def _collect(self) -> None:
        async for incoming in self.peer.inbox:
            self.peer.ack(incoming)
            if isinstance(incoming.msg, Output):
                self.events.append(incoming.msg)
                self._changed.set()
                self._changed = trio.Event()

    async def wait_for(self, predicate: Callable[[Output], bool], timeout: float = 10) -> Output:
        with trio.fail_after(timeout):
            seen = 0
            while True:
                for event in self.events[seen:]:
                    if predicate(event):
                        return event
                seen = len(self.events)
                await self._changed.wait()

    async def wait_type(self, tag: str, timeout: float = 10, turn_id: str | None = None) -> Output:
        return await self.wait_for(
            lambda e: e.__struct_config__.tag == tag and (turn_id is None or e.turn_id == turn_id),
            timeout,
        )

    async def terminal(self, turn_id: str, timeout: float = 15) -> Output:
        return await self.wait_for(lambda e: is_terminal(e) and e.turn_id == turn_id, timeout)

    def of_turn(self, turn_id: str) -> list[Output]:
        return [e for e in self.events if e.turn_id == turn_id]

    def types(self, turn_id: str) -> list[str]:
        return [e.__struct_config__.tag for e in self.of_turn(turn_id)]

    async def start_turn(
        self,
        session_id: str,
        spec: dict[str, Any],
        text: str = "hi",
        *,
        history: list[dict[str, Any]] | None = None,
        tools: list[dict[str, Any]] | None = None,
        **kw: Any,
    ) -> str:
        turn_id = f"turn_{uuid.uuid4().hex[:12]}"
        content = [
            *(history or []),
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]},
        ]
        await self.peer.cast(
            HARNESS_ACTOR,
            TurnStart(
                session_id=session_id,
                turn_id=turn_id,
                spec=spec,
                message={
                    "type": "message",
                    "role": "user",
                    "content": content,
                    "model": spec.get("name", "agent"),
                    **({"tools": tools} if tools is not None else {}),
                },
                reply_to=self.peer.name,
                **kw,
            ),
            durable=True,
            session_id=session_id,
        )
        return turn_id

    async def send(self, msg: Message, *, durable: bool = False) -> Message:
        return await self.peer.call(HARNESS_ACTOR, msg, durable=durable, timeout=10)


@asynccontextmanager
async def fake_dispatch(endpoint: str, name: str = "test-dispatch") -> AsyncIterator[FakeDispatch]:
    async with (
        open_peer(name, endpoint, liveness=FAST, accepts=Inbound) as peer,
        trio.open_nursery() as nursery,
    ):
        fake = FakeDispatch(peer)
        nursery.start_soon(fake._collect)
        yield fake
        nursery.cancel_scope.cancel()


def scripted(
    *steps: dict[str, Any], turns: list[list[dict[str, Any]]] | None = None
) -> dict[str, Any]:
    """An agent spec on the scripted harness."""
    return {
        "name": "scripted-test",
        "executor": {
            "harness": "scripted",
            "script": {"turns": turns if turns is not None else [list(steps)]},
        },
    }
