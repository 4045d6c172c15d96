"""The defer actor: a small, real actor for tests of the ack discipline (no host runs it).

A test host runs it with ``[actors.defer] target = "tests._defer:DeferActor"``.

Handles:
    DeferHold       durable; deferred, and never resolved (a hung handler's message)
    DeferFailOnce   durable; deferred to an in-order job that raises on the first delivery
                    and records ``key`` (once per message id) on the next
    DeferRaise      durable; the handler raises on the first delivery, records on the next
"""

from __future__ import annotations

from typing import Any

from corral.actors._actor import Actor, ActorContext, handles
from corral.actors._deferred import Deferred
from corral.bus import Dedup, Incoming, Message


class DeferHold(Message, tag="defer.hold"):
    """Keep this message in flight for ever."""


class DeferFailOnce(Message, tag="defer.fail_once"):
    """Record ``key`` through an in-order job that fails on the first attempt."""

    key: str


class DeferRaise(Message, tag="defer.raise"):
    """Record ``key``; the handler raises on the first attempt."""

    key: str


class DeferActor(Actor):
    """Holds, fails once in an in-order job, or raises once, on request."""

    def __init__(self, ctx: ActorContext, peer: Any) -> None:
        super().__init__(ctx, peer)
        self.records = Dedup(ctx.data_dir / "records.log")
        self.held: list[Deferred] = []

    @handles(DeferHold)
    async def hold(self, msg: DeferHold, incoming: Incoming) -> None:
        self.held.append(self.defer(incoming))

    @handles(DeferFailOnce)
    async def fail_once(self, msg: DeferFailOnce, incoming: Incoming) -> None:
        deferred = self.defer(incoming)
        attempt = incoming.env.attempt

        async def job() -> None:
            if attempt == 1:
                raise RuntimeError("the first attempt fails")
            await self.records.mark(incoming.env.id, msg.key)
            deferred.ack()

        self.in_order(msg.key, job, deferred)

    @handles(DeferRaise)
    async def raise_once(self, msg: DeferRaise, incoming: Incoming) -> None:
        if incoming.env.attempt == 1:
            raise RuntimeError("the first attempt fails")
        await self.records.mark(incoming.env.id, msg.key)
