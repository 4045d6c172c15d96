"""The actor runtime: typed handlers, request/reply, periodic tasks, orderly stop.

An actor is a class with handlers registered per message type::

    class Echo(Actor):
        @handles(Ping)
        async def ping(self, msg: Ping, incoming: Incoming) -> Pong:
            return Pong(text=msg.text)

Messages are handled one at a time in arrival order (like a gen_server); a handler that
starts long work spawns it into :attr:`Actor.nursery` (or a per-key queue,
:meth:`Actor.in_order`) and answers later with ``self.peer.reply``. A handler's return value
is the reply (sent if the sender asked for one).

One ack discipline. A durable message is acked when its handler returns and nacked (the
broker redelivers it, counting the attempt toward dead-lettering) when the handler raises.
A handler that finishes the message later calls :meth:`Actor.defer` and resolves the
:class:`~._deferred.Deferred` it gets exactly once (ack, nack or park); an in-order job that
raises nacks the handles it was given. :class:`~corral.bus.InspectRequest` is answered with
:meth:`Actor.snapshot` for every actor, which counts the unresolved handles, and
:class:`~corral.bus.DrainRequest` (the host is stopping) with what :meth:`Actor.drain` leaves
in flight.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import trio

from .. import _heap as heap
from ..bus import (
    ActorControl,
    DrainReply,
    DrainRequest,
    ErrorReply,
    Incoming,
    InspectReply,
    InspectRequest,
    Message,
    Peer,
    Stop,
    members,
)
from ..instance import Instance
from ._deferred import Deferred, Ledger

log = logging.getLogger("corral.actors")

Handler = Callable[[Any, Any, Incoming], Awaitable[Message | None]]
H = TypeVar("H", bound=Handler)
Periodic = TypeVar("Periodic", bound=Callable[[Any], Awaitable[None]])
Job = Callable[[], Awaitable[object]]

#: Jobs waiting in one key's queue, at most (past it :meth:`Actor.in_order` raises
#: :class:`trio.WouldBlock`, so the handler fails and its message is nacked).
QUEUE_LIMIT = 10_000

# The marks the decorators leave on a method, read back by Actor.__init_subclass__.
_HANDLES = "__corral_handles__"
_EVERY = "__corral_every__"


def handles(*types: object) -> Callable[[H], H]:
    """Mark a method as the handler of the given message types (classes or unions)."""
    classes = members(*types)

    def mark(fn: H) -> H:
        setattr(fn, _HANDLES, classes)
        return fn

    return mark


def every(seconds: float) -> Callable[[Periodic], Periodic]:
    """Mark a method to run periodically while the actor runs."""

    def mark(fn: Periodic) -> Periodic:
        setattr(fn, _EVERY, seconds)
        return fn

    return mark


def task_count() -> int:
    """The trio tasks of this process, its root task included."""
    root = trio.lowlevel.current_root_task()
    count, stack = 0, [root] if root is not None else []
    while stack:
        task = stack.pop()
        count += 1
        stack += [child for nursery in task.child_nurseries for child in nursery.child_tasks]
    return count


@dataclass(frozen=True, slots=True)
class ActorContext:
    """What an actor is given at start."""

    name: str
    state_dir: Path
    options: dict[str, Any]
    #: The host's pid and start time. Not this process's parent when the host's zygote
    #: forked it (None: the parent, for an actor started by hand).
    host_pid: int | None = None
    host_start: int | None = None

    @property
    def data_dir(self) -> Path:
        """This actor's own durable directory (created on first use)."""
        path = Instance(self.state_dir).actor_dir(self.name)
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        return path


class Actor:
    """Base of every actor. Override :meth:`setup`, :meth:`terminate`, :meth:`snapshot`."""

    _handlers: ClassVar[dict[type[Message], str]]
    _periodic: ClassVar[list[tuple[str, float]]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        handlers: dict[type[Message], str] = {}
        periodic: list[tuple[str, float]] = []
        for klass in reversed(cls.__mro__):
            for attr, value in vars(klass).items():
                for t in getattr(value, _HANDLES, ()):
                    handlers[t] = attr
                if hasattr(value, _EVERY):
                    periodic.append((attr, getattr(value, _EVERY)))
        cls._handlers = handlers
        cls._periodic = periodic

    @classmethod
    def inbound(cls) -> tuple[type[Message], ...]:
        """What this actor's peer decodes: its handlers' types and the runtime's own."""
        return (*cls._handlers, *members(ActorControl))

    def __init__(self, ctx: ActorContext, peer: Peer) -> None:
        self.ctx = ctx
        self.peer = peer
        self.nursery: trio.Nursery | None = None
        self.handled = 0
        #: The jobs of each key with work queued or running; a drained key has no entry.
        self._queues: dict[str, deque[tuple[Job, tuple[Deferred, ...]]]] = {}
        self._ledger = Ledger(ctx.name, peer)
        #: The message whose handler runs now, and its handle if the handler deferred it.
        self._current: Incoming | None = None
        self._current_deferred: Deferred | None = None

    def defer(self, incoming: Incoming) -> Deferred:
        """Keep the message being handled in flight past its handler's return.

        The handler (or work it starts) must resolve the handle exactly once. Called twice
        for one message, it returns the same handle.

        Raises:
            RuntimeError: ``incoming`` is not the message being handled (a programming
                error: the runtime has already acked or nacked it).
        """
        if incoming is not self._current:
            raise RuntimeError(f"{self.ctx.name}: defer() of {incoming!r}, not being handled")
        if self._current_deferred is None:
            self._current_deferred = self._ledger.defer(incoming)
        return self._current_deferred

    def in_order(self, key: str, job: Job, *carried: Deferred) -> None:
        """Run ``job`` after every earlier job of ``key``; different keys run concurrently.

        Handlers run one at a time, so a handler that must wait (a spawn, a server call)
        hands its work to a per-key queue instead — one session's messages stay in order
        while other sessions go on. A job that raises is logged, and the handles it
        ``carried`` that it left unresolved are nacked (redelivered), never left in flight.
        A key's queue exists only while it has work: its task ends once the queue drains.

        Raises:
            trio.WouldBlock: the key already has :data:`QUEUE_LIMIT` jobs waiting.
        """
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = deque()
            assert self.nursery is not None
            self.nursery.start_soon(self._run_queue, key, queue)
        elif len(queue) >= QUEUE_LIMIT:
            raise trio.WouldBlock
        queue.append((job, carried))

    def has_queued(self, key: str) -> bool:
        """True while ``key`` has in-order work waiting or running."""
        return key in self._queues

    async def _run_queue(self, key: str, queue: deque[tuple[Job, tuple[Deferred, ...]]]) -> None:
        # The queue is taken down with no checkpoint between seeing it empty and dropping
        # it, so a job for the key either joins this queue (and runs here, after the earlier
        # ones) or finds none and starts a new one with nothing before it.
        try:
            while queue:
                job, carried = queue.popleft()
                try:
                    await job()
                except Exception as exc:
                    log.exception("%s: a job for %s failed", self.ctx.name, key)
                    for handle in carried:
                        if not handle.resolved:
                            await handle.nack(f"{type(exc).__name__}: {exc}")
        finally:
            if self._queues.get(key) is queue:
                del self._queues[key]

    async def setup(self) -> None:
        """Called once before the first message."""

    async def terminate(self) -> None:
        """Called once on an orderly stop (SIGTERM or Stop), after the last message."""

    async def drain(self, wait_s: float) -> int:
        """The host is about to stop: take no new work, wait up to ``wait_s`` seconds for
        the work in flight to end, and return how much is left (0: drained). An actor with
        nothing of its own to finish keeps the default: drained at once."""
        return 0

    def snapshot(self) -> dict[str, Any]:
        """State for inspection (``corral status``, tests). Must be JSON-friendly."""
        return {
            "handled": self.handled,
            **self._ledger.snapshot(),
            "queues": len(self._queues),
            # What the process holds whatever the actor's own fields say: an idle session
            # should add to neither (issue #20, docs/benchmarks.md "scale").
            "tasks": task_count(),
            "open_files": len(os.listdir("/proc/self/fd")),
            # Bursts after which the process gave its freed heap back (:mod:`corral._heap`).
            "heap_releases": heap.stats["releases"],
        }

    async def serve(self) -> None:
        """Handle messages until the inbox closes, a Stop arrives, or the task is cancelled."""
        try:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                for attr, seconds in self._periodic:
                    nursery.start_soon(self._periodically, getattr(self, attr), seconds)
                await self.setup()
                async for incoming in self.peer.inbox:
                    if isinstance(incoming.msg, Stop):
                        break
                    await self._handle(incoming)
                nursery.cancel_scope.cancel()
        finally:
            self._ledger.report_unresolved()

    async def _answer_drain(self, incoming: Incoming, wait_s: float) -> None:
        left = await self.drain(wait_s)
        await self.peer.reply(incoming, DrainReply(in_flight=left))

    async def _periodically(self, fn: Callable[[], Awaitable[None]], seconds: float) -> None:
        while True:
            await trio.sleep(seconds)
            try:
                await fn()
            except Exception:
                log.exception("%s: periodic task %s failed", self.ctx.name, fn.__name__)

    async def _handle(self, incoming: Incoming) -> None:
        msg = incoming.msg
        if isinstance(msg, InspectRequest):
            await self.peer.reply(incoming, InspectReply(name=self.ctx.name, state=self.snapshot()))
            return
        if isinstance(msg, DrainRequest):
            # Answered later, when drained: the actor handles messages meanwhile (the work
            # in flight needs them).
            assert self.nursery is not None
            self.nursery.start_soon(self._answer_drain, incoming, msg.wait_s)
            return
        attr = self._handlers.get(type(msg))
        if attr is None:
            error = f"{self.ctx.name} does not handle {incoming.env.type!r}"
            log.warning("%s", error)
            await self.peer.reply(incoming, ErrorReply(code="unhandled", message=error))
            self.peer.ack(incoming)
            return
        self._current, self._current_deferred = incoming, None
        try:
            result = await getattr(self, attr)(msg, incoming)
        except Exception as exc:
            log.exception("%s: handler %s failed on %s", self.ctx.name, attr, incoming.env.id)
            error = f"{type(exc).__name__}: {exc}"
            deferred = self._current_deferred
            if deferred is None:
                await self.peer.nack(incoming, error)
            elif not deferred.resolved:
                await deferred.nack(error)
            await self.peer.reply(
                incoming,
                ErrorReply(code="handler_error", message="the actor failed to handle the request"),
            )
            return
        finally:
            self._current = None
        self.handled += 1
        if result is not None:
            await self.peer.reply(incoming, result)
        if self._current_deferred is None:
            self.peer.ack(incoming)
