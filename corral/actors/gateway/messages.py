"""The gateway's protocol: what actors send the gateway for the server's tunnel.

Message → reply:
    SessionEvents  → none  (durable, from dispatch) events for sessions' ``/stream``, in order
    SessionEvent   → none  (durable) one event alone (as a mailbox kept from an older
                           dispatch may still hold them)
    HttpChunk      → none  (from the routes' owners) a piece of a streaming answer

Besides these, every actor answers :class:`~corral.bus.InspectRequest` with an
:class:`~corral.bus.InspectReply`; a body outside :data:`Inbound` is rejected (dead-lettered)
and a caller gets ``protocol_error``; a handler that raises answers ``handler_error`` and its
durable message is nacked.

Session events that are not tied to one request go to the gateway in order, for
``GET .../stream``: as :class:`SessionEvents`, a batch of :class:`SessionEvent` records in one
bus message (a lone :class:`SessionEvent` is accepted too); :func:`events_of` reads either.
The pieces of a streaming HTTP answer arrive as :class:`~corral.routes.HttpChunk` (HTTP over
the bus lives in :mod:`corral.routes`, with the answers' builders).
"""

from __future__ import annotations

from ...bus import Message
from ...routes import HttpChunk


class SessionEvent(Message, tag="gateway.session_event"):
    """An event on a session's stream (``GET /v1/sessions/{id}/stream``), as JSON bytes.

    ``seq`` increases by one per session so that the gateway can detect gaps and resume.
    """

    session_id: str
    seq: int
    event: bytes
    runner_id: str | None = None
    #: When the event's source (e.g. a harness worker) sent it, for end-to-end latency.
    origin_at: float = 0.0


class SessionEvents(Message, tag="gateway.session_events"):
    """Session events in publish order, as one bus message (of one or more sessions).

    Sent durably, each event would cost a broker log record, a group-commit acceptance, an
    ack and a stream-buffer write of its own; a batch pays each of those once. Events of one
    session keep their order within a batch and across batches.
    """

    events: list[SessionEvent]


def events_of(msg: Message) -> list[SessionEvent]:
    """The session events a message carries, in order (none if it is neither kind)."""
    if isinstance(msg, SessionEvents):
        return msg.events
    if isinstance(msg, SessionEvent):
        return [msg]
    return []


#: Everything the gateway actor handles.
Inbound = SessionEvents | SessionEvent | HttpChunk
