"""Deferred acknowledgement: the handle of a durable message its handler finishes later.

The runtime acks a handler's durable message when the handler returns and nacks it (the
broker redelivers it, counting the attempt toward dead-lettering) when the handler raises.
A handler whose work outlives it — a tool call running in the background, a turn that lasts
until its terminal event, an answer that must wait for an fsync — calls
:meth:`Actor.defer <corral.actors.Actor.defer>` and keeps the :class:`Deferred` it gets: the
message stays in flight until the handle is resolved, exactly once, by :meth:`Deferred.ack`,
:meth:`Deferred.nack` or :meth:`Deferred.park`. One that waits on another process rather
than on this one's work says so with :meth:`Deferred.hold`, so that this actor's crashes are
not counted against it.

The :class:`Ledger` holds every unresolved handle of one actor with its age, so that what an
actor holds shows in its snapshot, an in-order job that raises nacks the handles it carries
(:meth:`Actor.in_order <corral.actors.Actor.in_order>`), and an orderly stop says what it
leaves in flight for the next incarnation. Resolving a handle twice is a programming error:
the second resolution is not sent, and it is logged once.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ..bus import Incoming, Peer

log = logging.getLogger("corral.actors")


class Deferred:
    """A delivered message its handler did not finish; resolve it once (ack, nack or park)."""

    __slots__ = ("_ledger", "_twice_logged", "held", "incoming", "resolution", "since")

    def __init__(self, incoming: Incoming, ledger: Ledger) -> None:
        self.incoming = incoming
        #: When it was deferred (``time.monotonic``).
        self.since = time.monotonic()
        #: How it was resolved (``ack``, ``nack``, ``park``), None while it is not.
        self.resolution: str | None = None
        #: Said to be waiting on another process (:meth:`hold`).
        self.held = False
        self._ledger = ledger
        self._twice_logged = False

    @property
    def resolved(self) -> bool:
        return self.resolution is not None

    @property
    def age_s(self) -> float:
        return time.monotonic() - self.since

    def ack(self) -> None:
        """The message is handled: the broker forgets it."""
        if self._settle("ack"):
            self._ledger.peer.ack(self.incoming)

    async def nack(self, error: str) -> None:
        """Handling it failed: the broker redelivers it (and dead-letters it past its
        attempts)."""
        if self._settle("nack"):
            try:
                await self._ledger.peer.nack(self.incoming, error)
            except BaseException:
                self._unsettle()
                raise

    async def hold(self) -> None:
        """This actor's own work on it is done; it stays in flight only until another
        process answers (a turn's worker ends the turn). Not a resolution: the handle is
        still resolved once. A restart of this actor is then not counted as a failed
        attempt of the message (:class:`~corral.bus.Hold`); said once, however often asked."""
        if self.resolution is None and not self.held:
            self.held = True
            await self._ledger.peer.hold(self.incoming)

    async def park(self) -> None:
        """It waits, durably, on something else (a verdict): the broker holds it parked until
        :meth:`Peer.unpark <corral.bus.Peer.unpark>`."""
        if self._settle("park"):
            try:
                await self._ledger.peer.park(self.incoming)
            except BaseException:
                self._unsettle()  # still in flight: whoever handles the failure resolves it
                raise

    def _settle(self, how: str) -> bool:
        if self.resolution is None:
            self.resolution = how
            self._ledger.pending.pop(id(self), None)
            return True
        if not self._twice_logged:
            self._twice_logged = True
            log.error(
                "%s: programming error: %s of %s resolved twice (%s, then %s); the second is "
                "ignored",
                self._ledger.name,
                self.incoming.env.type,
                self.incoming.env.id,
                self.resolution,
                how,
            )
        return False

    def _unsettle(self) -> None:
        self.resolution = None
        self._ledger.pending[id(self)] = self

    def __repr__(self) -> str:
        state = self.resolution or f"unresolved for {self.age_s:.1f}s"
        return f"Deferred({self.incoming.env.type} {self.incoming.env.id}, {state})"


class Ledger:
    """The unresolved handles of one actor."""

    def __init__(self, name: str, peer: Peer) -> None:
        self.name = name
        self.peer = peer
        #: Unresolved handles by ``id()``, oldest first.
        self.pending: dict[int, Deferred] = {}

    def defer(self, incoming: Incoming) -> Deferred:
        handle = Deferred(incoming, self)
        self.pending[id(handle)] = handle
        return handle

    def snapshot(self) -> dict[str, Any]:
        """``deferred`` (unresolved handles) and ``oldest_deferred_s`` (None if none)."""
        oldest = next(iter(self.pending.values()), None)
        return {
            "deferred": len(self.pending),
            "oldest_deferred_s": None if oldest is None else round(oldest.age_s, 3),
        }

    def report_unresolved(self) -> None:
        """Say once, at stop, what stays in flight: the broker redelivers it to the next
        incarnation (a turn's TurnStart, by design; anything else is work cut off)."""
        if not self.pending:
            return
        handles = list(self.pending.values())
        log.warning(
            "%s: stopping with %d deferred messages unresolved (redelivered to the next "
            "incarnation): %s",
            self.name,
            len(handles),
            ", ".join(repr(h) for h in handles[:10]) + (" …" if len(handles) > 10 else ""),
        )
