"""A worker's events held until dispatch confirms them, and sent again when it asks.

Every event of a turn a worker sends dispatch (stream or durable) is held here until dispatch
says it is :class:`~corral.harnesses.protocol.Confirmed`: published and accepted by the broker
for every receiver. A dispatch killed mid-stream loses what it had taken and not yet
published, and what the broker was routing to it as it died; its next incarnation asks for
the rest (:class:`~corral.harnesses.protocol.Resend`), and the worker queues what it holds
again, oldest first. The events keep their ``sequence_number``, from which dispatch numbers
them, so a copy is recognised downstream.

What is held is the turn's unconfirmed tail: dispatch confirms every 64 events, so under a
hundred in a healthy run. It is also the worker's flow control: a turn that outruns dispatch
(a flood of deltas faster than dispatch publishes them) waits once :data:`HELD_MAX` events are
unconfirmed, and its harness with it, until dispatch confirms some (:meth:`HeldEvents.room`);
only a dispatch that confirms nothing for :data:`ROOM_WAIT_S` (down, or wedged) lets the turn
go on, the oldest held events dropped. A turn's events are forgotten at the next turn's first
event: dispatch saves a turn's end only once its whole stream is accepted, so an ended turn
never needs them again.
"""

from __future__ import annotations

import logging
from collections import deque

from .._changes import Changes
from .protocol import Confirmed, Output, Resending

log = logging.getLogger("corral.harnesses.worker")

#: The most unconfirmed events a worker holds: a turn that reaches it waits for dispatch. It
#: bounds what a worker has in flight too: at 65,536 the floods of 50 sessions at once
#: filled dispatch's inbox and the broker's queues, and heartbeats and resends waited behind
#: them (a worker killed as silent, events declared lost); 8,192 costs one session's flood
#: nothing (docs/benchmarks.md, "A flood longer than the buffers").
HELD_MAX = 8192
#: How long a turn with :data:`HELD_MAX` unconfirmed events waits for dispatch to confirm
#: one before it goes on and the oldest are dropped (logged). A restarted dispatch asks for
#: what it missed within a second or two.
ROOM_WAIT_S = 30.0


class HeldEvents:
    """The latest turn's unconfirmed events, oldest first, each with where it went."""

    def __init__(self) -> None:
        self.turn_id: str | None = None
        self.events: deque[tuple[str, Output]] = deque()
        #: The last sequence number the turn emitted (-1: none yet).
        self.last = -1
        #: Unconfirmed events of the turn dropped past :data:`HELD_MAX`.
        self.dropped = 0
        #: Bumped by each confirmation of the turn (what :meth:`room` waits on).
        self._confirms = Changes()
        #: A wait in :meth:`room` ran out: the turn goes on without waiting until dispatch
        #: confirms something again (a wait per event would stall it for good).
        self._stalled = False

    def full(self) -> bool:
        """Whether the next event would go past :data:`HELD_MAX`."""
        return len(self.events) >= HELD_MAX

    async def room(self, wait_s: float = ROOM_WAIT_S) -> None:
        """Return once the held events are under :data:`HELD_MAX`, or after ``wait_s``
        with nothing confirmed (the next :meth:`hold` drops the oldest then; later events do
        not wait until dispatch confirms one)."""
        while self.full() and not self._stalled:
            seen = self._confirms.version
            if await self._confirms.wait_past(seen, wait_s) == seen:
                self._stalled = True

    def hold(self, to: str, event: Output) -> None:
        """Keep ``event`` (sent to ``to``) until it is confirmed; a new turn starts afresh."""
        if event.turn_id != self.turn_id:
            self.turn_id, self.last, self.dropped = event.turn_id, -1, 0
            self.events.clear()
            self._stalled = False
        self.events.append((to, event))
        self.last = event.sequence_number
        if len(self.events) > HELD_MAX:
            self.events.popleft()
            self.dropped += 1
            if self.dropped == 1:
                log.warning(
                    "turn %s: dispatch confirmed nothing for %.0f s; the oldest unconfirmed "
                    "events are dropped (at most %d are held)",
                    event.turn_id,
                    ROOM_WAIT_S,
                    HELD_MAX,
                )

    def confirmed(self, msg: Confirmed) -> None:
        """Forget the events dispatch has confirmed."""
        if msg.turn_id != self.turn_id:
            return
        while self.events and self.events[0][1].sequence_number <= msg.upto:
            self.events.popleft()
        self._stalled = False
        self._confirms.bump()

    def again(self, turn_id: str) -> tuple[Resending, list[tuple[str, Output]]]:
        """The answer to dispatch's ``Resend`` of ``turn_id`` and the events to send again:
        everything before ``first`` was confirmed."""
        if turn_id != self.turn_id:
            return Resending(known=False), []
        first = self.events[0][1].sequence_number if self.events else self.last + 1
        log.info("turn %s: sending events %d..%d again", turn_id, first, self.last)
        return Resending(known=True, first=first, last=self.last), list(self.events)
