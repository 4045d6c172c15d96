"""HTTP over the bus: how the gateway hands a tunnelled request to the actor that owns it.

The gateway receives ``request`` frames from the server's tunnel (PROTOCOL_FACTS.md §i.2)
and turns each into an :class:`HttpRequest` for the owning actor (dispatch for
``/v1/sessions...``). The actor answers with an :class:`HttpResponse`; a streaming answer
(``?stream=true`` SSE) sets ``streaming`` and then sends :class:`HttpChunk` messages to the
request's ``reply_to``, the last one with ``end``. Chunks travel separately from the reply,
so the first may arrive before the head: the gateway holds them until the head is in.
Session events that are not tied to one request go to the gateway in order, for
``GET .../stream``: as :class:`SessionEvents`, a batch of :class:`SessionEvent` records in one
bus message (a lone :class:`SessionEvent` is accepted too); :func:`events_of` reads either.
"""

from __future__ import annotations

import json
from typing import Any

from .bus import Message


class HttpRequest(Message, tag="http.request"):
    """One tunnelled HTTP request."""

    request_id: str
    method: str
    path: str
    query: str = ""
    headers: list[tuple[str, str]] = []
    body: bytes = b""
    runner_id: str | None = None
    #: Who gets the HttpChunk messages of a streaming answer.
    reply_to: str = "gateway"

    def json(self) -> Any:
        """The body parsed as JSON (raises ValueError)."""
        return json.loads(self.body) if self.body else None


class HttpResponse(Message, tag="http.response"):
    """The answer: status, headers and body (JSON bodies byte for byte, H-02)."""

    status: int
    headers: list[tuple[str, str]] = []
    body: bytes = b""
    streaming: bool = False


class HttpChunk(Message, tag="http.chunk"):
    """A piece of a streaming answer; ``end`` closes it."""

    request_id: str
    data: bytes = b""
    end: bool = False


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


def json_response(status: int, body: Any) -> HttpResponse:
    """A compact JSON answer."""
    data = json.dumps(body, separators=(",", ":")).encode()
    return HttpResponse(
        status=status,
        headers=[("content-type", "application/json"), ("content-length", str(len(data)))],
        body=data,
    )


def error_response(status: int, code: str, message: str) -> HttpResponse:
    """An error in the 0.19 server's shape, ``{"error": {"code", "message"}}`` (§H.2).

    The server reads a runner's error as ``payload["error"]["message"]``; a string ``error``
    makes its proxy fail with a 500 of its own.
    """
    return json_response(status, {"error": {"code": code, "message": message}})


def empty_response(status: int) -> HttpResponse:
    """An answer with no body at all: no content-length, never ``null`` (H-01)."""
    return HttpResponse(status=status)


def sse_frame(event_type: str, data: bytes) -> bytes:
    """One SSE frame as a harness streams it: ``event: <type>\\ndata: <json>\\n\\n``."""
    return b"event: " + event_type.encode() + b"\ndata: " + data + b"\n\n"
