"""Server-Sent Events of a session stream: each event, and the parser of the body's lines.

Plain code with no I/O, tested on recorded lines; the client (:mod:`._client`) feeds it the
lines of ``/v1/sessions/{id}/stream`` and :class:`~._turn_follower.TurnFollower` reads the
events it makes. Apart from both because each of them needs it and neither needs the other.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .._jsonlines import JsonObject


def event_number(event_id: str | None) -> int | None:
    """An event id as a number (the control plane's are), or None if it is none."""
    if event_id is None:
        return None
    try:
        return int(event_id)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One event of a session stream: its id, type and JSON payload."""

    id: str | None
    type: str
    data: JsonObject

    def record(self) -> JsonObject:
        """The event as ``corral send --json`` lists it: the payload, its ``type`` and its
        stream id as ``event_id`` (a number when the id is one)."""
        number = event_number(self.id)
        return {
            "event_id": number if number is not None else self.id,
            **self.data,
            "type": self.type,
        }


class SseParser:
    """Turns the lines of a ``text/event-stream`` body into :class:`StreamEvent` s.

    Comments (``: keepalive``) and events without data are skipped; ``data`` that is not a
    JSON object becomes ``{"data": <text>}`` rather than an error, so one odd frame cannot
    end a turn the user is watching.
    """

    def __init__(self) -> None:
        self._id: str | None = None
        self._event: str | None = None
        self._data: list[str] = []

    def feed(self, line: str) -> StreamEvent | None:
        """Take one line (without its line ending); return an event when one is complete."""
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._id = value
        return None

    def _dispatch(self) -> StreamEvent | None:
        data, event, self._data, self._event = self._data, self._event, [], None
        if not data:
            return None
        text = "\n".join(data)
        try:
            payload = json.loads(text)
        except ValueError:
            payload = {"data": text}
        if not isinstance(payload, dict):
            payload = {"data": payload}
        kind = event or str(payload.get("type") or "message")
        # The id persists across events (SSE rules); the last one seen is the resume point.
        return StreamEvent(id=self._id, type=kind, data=payload)
