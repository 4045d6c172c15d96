"""A worker's events held until dispatch confirms them, and sent again when it asks.

Every event of a turn a worker sends dispatch (stream or durable) is held here until dispatch
says it is :class:`~corral.harnesses.protocol.Confirmed`: published and accepted by the broker
for every receiver. A dispatch killed mid-stream loses what it had taken and not yet
published, and what the broker was routing to it as it died; its next incarnation asks for
the rest (:class:`~corral.harnesses.protocol.Resend`), and the worker queues what it holds
again, oldest first. The events keep their ``sequence_number``, from which dispatch numbers
them, so a copy is recognised downstream.

What is held is the turn's unconfirmed tail: dispatch confirms every 64 events, so under a
hundred in a healthy run, at most :data:`HELD_MAX` events if it confirms nothing. A turn's
events are forgotten at the next turn's first event: dispatch saves a turn's end only once
its whole stream is accepted, so an ended turn never needs them again.
"""

from __future__ import annotations

import logging
from collections import deque

from .protocol import Confirmed, Output, Resending

log = logging.getLogger("corral.harnesses.worker")

#: The most unconfirmed events a worker holds (the oldest go first past it, logged): only a
#: dispatch down for long leaves this many.
HELD_MAX = 65536


class HeldEvents:
    """The latest turn's unconfirmed events, oldest first, each with where it went."""

    def __init__(self) -> None:
        self.turn_id: str | None = None
        self.events: deque[tuple[str, Output]] = deque()
        #: The last sequence number the turn emitted (-1: none yet).
        self.last = -1
        #: Unconfirmed events of the turn dropped past :data:`HELD_MAX`.
        self.dropped = 0

    def hold(self, to: str, event: Output) -> None:
        """Keep ``event`` (sent to ``to``) until it is confirmed; a new turn starts afresh."""
        if event.turn_id != self.turn_id:
            self.turn_id, self.last, self.dropped = event.turn_id, -1, 0
            self.events.clear()
        self.events.append((to, event))
        self.last = event.sequence_number
        if len(self.events) > HELD_MAX:
            self.events.popleft()
            self.dropped += 1
            if self.dropped == 1:
                log.warning(
                    "turn %s: dispatch confirms nothing; the oldest unconfirmed events are "
                    "dropped (at most %d are held)",
                    event.turn_id,
                    HELD_MAX,
                )

    def confirmed(self, msg: Confirmed) -> None:
        """Forget the events dispatch has confirmed."""
        if msg.turn_id != self.turn_id:
            return
        while self.events and self.events[0][1].sequence_number <= msg.upto:
            self.events.popleft()

    def again(self, turn_id: str) -> tuple[Resending, list[tuple[str, Output]]]:
        """The answer to dispatch's ``Resend`` of ``turn_id`` and the events to send again:
        everything before ``first`` was confirmed."""
        if turn_id != self.turn_id:
            return Resending(known=False), []
        first = self.events[0][1].sequence_number if self.events else self.last + 1
        log.info("turn %s: sending events %d..%d again", turn_id, first, self.last)
        return Resending(known=True, first=first, last=self.last), list(self.events)
