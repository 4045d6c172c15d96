"""HTTP over the bus: how the gateway hands a tunnelled request to the actor that owns it.

The gateway receives ``request`` frames from the server's tunnel (PROTOCOL_FACTS.md §i.2)
and turns each into an :class:`HttpRequest` for the owning actor (dispatch for
``/v1/sessions...``). The actor answers with an :class:`HttpResponse`; a streaming answer
(``?stream=true`` SSE) sets ``streaming`` and then sends :class:`HttpChunk` messages to the
request's ``reply_to``, the last one with ``end``. Chunks travel separately from the reply,
so the first may arrive before the head: the gateway holds them until the head is in.

These messages are shared by every actor that serves routes (dispatch, tools) and by the
tools library, so they live here rather than with one actor; the gateway's own messages
(session events) are in :mod:`corral.actors.gateway.messages`.
"""

from __future__ import annotations

import json
from typing import Any

from ._input import load_json
from .bus import Message, Request


class HttpRequest(Request["HttpResponse"], tag="http.request"):
    """One tunnelled HTTP request."""

    request_id: str
    method: str
    path: str
    query: str = ""
    headers: list[tuple[str, str]] = []
    body: bytes = b""
    #: The runner id of the tunnel it came through: it reaches only the sessions bound through
    #: that id (docs/security.md, "Runner isolation"). None for a request an actor of this
    #: host makes itself (dispatch closing a deleted session's terminals), which the tunnel
    #: never forwards: it may reach every session.
    runner_id: str | None = None
    #: Who gets the HttpChunk messages of a streaming answer.
    reply_to: str = "gateway"

    def json(self) -> Any:
        """The body parsed as JSON, None if there is none.

        Raises:
            BadInput: (a ``ValueError``) not UTF-8, not JSON, a lone surrogate escape, or
                nested too deep (:func:`corral._input.load_json`); the message says which.
        """
        return load_json(self.body) if self.body else None


class HttpResponse(Message, tag="http.response"):
    """The answer: status, headers and body (JSON bodies byte for byte, H-02)."""

    status: int
    headers: list[tuple[str, str]] = []
    body: bytes = b""
    streaming: bool = False


class HttpChunk(Message, tag="http.chunk"):
    """A piece of a streaming answer; ``end`` closes it.

    ``seq``, if set, numbers the piece in its answer in a way its sender keeps across its own
    restarts: the gateway drops a piece at or below the last numbered one it relayed (sent
    again by a restarted sender). Pieces without one are always relayed."""

    request_id: str
    data: bytes = b""
    end: bool = False
    seq: int | None = None


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


def no_session(session_id: str) -> HttpResponse:
    """The 404 of a session this runner does not have: one it never bound, and as well one
    bound through another runner id of this host (nothing tells the two apart)."""
    return error_response(404, "not_found", f"No session '{session_id}' on this runner.")


def empty_response(status: int) -> HttpResponse:
    """An answer with no body at all: no content-length, never ``null`` (H-01)."""
    return HttpResponse(status=status)


def sse_frame(event_type: str, data: bytes) -> bytes:
    """One SSE frame as a harness streams it: ``event: <type>\\ndata: <json>\\n\\n``."""
    return b"event: " + event_type.encode() + b"\ndata: " + data + b"\n\n"
