"""Per-actor mailboxes kept by the broker, and the dead-letter list.

A durable message is *queued* until delivered, *in flight* until its recipient acks it, and
*parked* while it waits on a verdict (elicitations). One in flight for longer than
``[bus] stuck_after_s`` since its delivery is *stuck*: its recipient deferred it (or hangs in
its handler) and has not resolved it. Entries remember which incarnation of the
recipient they were delivered to, so that a restarted recipient gets them again.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Entry:
    """One durable message in a mailbox."""

    id: str
    recipient: str
    sender: str
    type: str
    session_id: str | None
    frame: bytes
    wants_reply: bool = False
    attempt: int = 1
    enqueued: float = field(default_factory=time.monotonic)
    delivered_to: str | None = None
    #: When it was last delivered (``time.monotonic``), None until then.
    delivered_at: float | None = None
    owner: str | None = None
    #: Its recipient said its own work on it is done (:class:`~corral.bus.Hold`); only
    #: for this delivery.
    held: bool = False


@dataclass(slots=True)
class DeadLetter:
    """A message that could not be handled, with the error that ended it."""

    id: str
    actor: str
    type: str
    attempts: int
    error: str
    at: float
    #: The start of the message as it arrived (at most 64 KiB), kept so an operator can
    #: requeue it; not shown.
    frame: bytes = b""

    def to_json(self) -> dict[str, Any]:
        """The shape ``corral dead-letters --json`` prints."""
        return {
            "id": self.id,
            "actor": self.actor,
            "type": self.type,
            "attempts": self.attempts,
            "error": self.error,
            "at": self.at,
        }


@dataclass(slots=True)
class Mailbox:
    """The durable messages addressed to one actor."""

    name: str
    queued: deque[Entry] = field(default_factory=deque)
    in_flight: dict[str, Entry] = field(default_factory=dict)
    parked: dict[str, Entry] = field(default_factory=dict)
    dead_letters: int = 0
    redelivered: int = 0

    def entries(self) -> list[Entry]:
        """Every live entry, oldest first within each state."""
        return [*self.in_flight.values(), *self.queued, *self.parked.values()]

    def requeue_from(self, incarnation: str | None) -> list[tuple[Entry, bool]]:
        """Take back in-flight entries not delivered to ``incarnation`` (it restarted), each
        with whether its recipient held it.

        They go back to the front of the queue in their original order; the caller decides
        whether each may be attempted again.
        """
        stale = [e for e in self.in_flight.values() if e.delivered_to != incarnation]
        taken = [(entry, entry.held) for entry in stale]
        for entry in stale:
            del self.in_flight[entry.id]
            entry.delivered_to = None
            entry.held = False
        self.queued.extendleft(reversed(stale))
        return taken

    def statistics(self, *, peek: int = 0, stuck_after_s: float = math.inf) -> dict[str, Any]:
        """The row ``corral mailboxes --json`` prints for this mailbox."""
        now = time.monotonic()
        live = self.entries()
        oldest = min((e.enqueued for e in live), default=None)
        stuck = {e.id for e in self.in_flight.values() if _held_for(e, now) > stuck_after_s}
        row: dict[str, Any] = {
            "actor": self.name,
            "queued": len(self.queued),
            "in_flight": len(self.in_flight),
            # In flight and waiting on another process than their recipient (a turn's start).
            "held": sum(e.held for e in self.in_flight.values()),
            "parked": len(self.parked),
            "dead_letters": self.dead_letters,
            "redelivered": self.redelivered,
            "oldest_age_s": None if oldest is None else round(now - oldest, 3),
            "stuck": len(stuck),
        }
        if peek:
            row["peek"] = [
                {
                    "id": e.id,
                    "type": e.type,
                    "session_id": e.session_id,
                    "attempts": e.attempt,
                    "age_s": round(now - e.enqueued, 3),
                    "state": "stuck"
                    if e.id in stuck
                    else "in_flight"
                    if e.id in self.in_flight
                    else ("parked" if e.id in self.parked else "queued"),
                }
                for e in live[:peek]
            ]
        return row


def _held_for(entry: Entry, now: float) -> float:
    """Seconds since an in-flight entry was delivered."""
    return 0.0 if entry.delivered_at is None else now - entry.delivered_at
