"""The echo actor: a small, real actor for tests, which no production host runs.

A test host runs it with ``[actors.echo] target = "tests._echo:EchoActor"`` (what
``tests.conftest`` adds for a module that sets ``RUNS_ECHO = True``).

Handles:
    EchoPing    → EchoPong with the same text (request/reply, stream)
    EchoRecord  durable; records its key once per message id (in the dedup file itself)
    EchoSleep   sleeps, to hold a message in flight
    EchoCrash   exits the process at once with the given code
    EchoCount   counts stream messages (benchmarks); EchoCountQuery → EchoCountReply
"""

from __future__ import annotations

import os
from typing import Any

import trio

from corral.actors._actor import Actor, ActorContext, handles
from corral.bus import Dedup, Incoming, Message, Request


class EchoPing(Request["EchoPong"], tag="echo.ping"):
    """Ask for the text back."""

    text: str = ""


class EchoPong(Message, tag="echo.pong"):
    """The text, back."""

    text: str = ""


class EchoRecord(Request["EchoPong"], tag="echo.record"):
    """Durably record ``key`` once (a stand-in for a side effect)."""

    key: str


class EchoSleep(Request["EchoPong"], tag="echo.sleep"):
    """Hold the handler for ``seconds``."""

    seconds: float


class EchoCrash(Message, tag="echo.crash"):
    """Exit the process at once with ``code``."""

    code: int = 1


class EchoCount(Message, tag="echo.count"):
    """One unit of benchmark traffic."""

    n: int = 0


class EchoCountQuery(Request["EchoCountReply"], tag="echo.count_query"):
    """How many EchoCount messages arrived?"""


class EchoCountReply(Message, tag="echo.count_reply"):
    """The number of EchoCount messages so far."""

    count: int


#: Everything the echo actor handles (what a test peer standing in for it accepts, too).
Inbound = EchoPing | EchoRecord | EchoSleep | EchoCrash | EchoCount | EchoCountQuery
#: Everything the echo actor sends or handles.
Every = Inbound | EchoPong | EchoCountReply


class EchoActor(Actor):
    """Replies, records, sleeps, crashes and counts on request."""

    def __init__(self, ctx: ActorContext, peer: Any) -> None:
        super().__init__(ctx, peer)
        self.records = Dedup(ctx.data_dir / "records.log")
        self.count = 0

    @handles(EchoPing)
    async def ping(self, msg: EchoPing, incoming: Incoming) -> EchoPong:
        return EchoPong(text=msg.text)

    @handles(EchoRecord)
    async def record(self, msg: EchoRecord, incoming: Incoming) -> EchoPong:
        await self.records.mark(incoming.env.id, msg.key)
        return EchoPong(text=msg.key)

    @handles(EchoSleep)
    async def sleep(self, msg: EchoSleep, incoming: Incoming) -> EchoPong:
        await trio.sleep(msg.seconds)
        return EchoPong(text="slept")

    @handles(EchoCrash)
    async def crash(self, msg: EchoCrash, incoming: Incoming) -> None:
        os._exit(msg.code)

    @handles(EchoCount)
    async def counted(self, msg: EchoCount, incoming: Incoming) -> None:
        self.count += 1

    @handles(EchoCountQuery)
    async def count_query(self, msg: EchoCountQuery, incoming: Incoming) -> EchoCountReply:
        return EchoCountReply(count=self.count)

    def snapshot(self) -> dict[str, Any]:
        return {**super().snapshot(), "count": self.count}
