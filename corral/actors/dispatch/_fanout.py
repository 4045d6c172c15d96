"""Session events cut into durable batches for the subscribers."""

from __future__ import annotations

from ...routes import SessionEvent, SessionEvents

#: Session events per durable :class:`~corral.routes.SessionEvents` message, and about how
#: many bytes of them (well under the bus's default 4 MiB message limit).
_EVENT_BATCH = 512
_EVENT_BATCH_BYTES = 1024 * 1024


def _event_batches(events: list[SessionEvent]) -> list[SessionEvents]:
    """Publish-ordered events cut into messages of at most ``_EVENT_BATCH`` events and about
    ``_EVENT_BATCH_BYTES`` (an event larger than that travels alone)."""
    batches: list[SessionEvents] = []
    start = size = 0
    for i, event in enumerate(events):
        if i > start and (
            i - start >= _EVENT_BATCH or size + len(event.event) > _EVENT_BATCH_BYTES
        ):
            batches.append(SessionEvents(events=events[start:i]))
            start, size = i, 0
        size += len(event.event)
    if start < len(events):
        batches.append(SessionEvents(events=events[start:]))
    return batches
