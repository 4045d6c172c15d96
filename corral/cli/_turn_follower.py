"""One turn of a session, followed from its stream: its events, its text, its end.

The turn is over at its terminal ``session.status`` (``idle`` or ``failed``) after its
``running`` — the runner publishes exactly one per turn (a buffered follow-up message runs
on with no ``idle`` in between, and is covered by the same edge) — or when the control plane
says the runner refused the message (``session.delivery_failed`` for its item): the message
POST is answered ``queued`` at once, before the runner has seen it. A reconnect replays from
the last id seen, and :class:`TurnFollower` drops what it has already seen, so each event is
shown exactly once.

Plain code with no I/O, so it is tested on recorded event lists; :func:`~._client.run_turn`
feeds it what the stream delivers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypedDict

from .._jsonlines import JsonObject
from ._sse import StreamEvent, event_number

#: The turn edges that end a turn.
TERMINAL_STATUSES = ("idle", "failed")


class SendResult(TypedDict):
    """The document ``corral send --json`` prints."""

    session_id: str
    #: ``idle`` or ``failed``; None: the turn did not end.
    status: str | None
    text: str
    #: The server's error object of a failed turn.
    error: JsonObject | None
    #: What the stream delivered of the turn, as :meth:`StreamEvent.record` lists them.
    events: list[JsonObject]


@dataclass
class TurnFollower:
    """Collects the events of one turn and says when it is over.

    Feed it every event the stream delivers after the cursor the turn started from; it
    drops events it has already seen (a reconnect replays from the last id), and is
    :attr:`done` at the first ``session.status`` ``idle``/``failed`` after a ``running``, or
    at a ``session.delivery_failed`` for :attr:`item_id` (the turn's message, once posted).

    With :attr:`item_id` known, the turn is the one of that message. A message to a busy
    session runs as its own turn after the running one (PROTOCOL_0_19.md §E.3), so with
    :attr:`busy` the running turn's events are dropped up to its end (its terminal edge, or
    the ``running`` of the next turn); the control plane's ``session.input.consumed`` of the
    message says ``buffered`` when the runner queued it, which also catches a turn another
    client started after the cursor was read. The turn ends at its own edge, or at the
    ``running`` of a turn after it (messages buffered behind it run on, no ``idle`` between).
    """

    session_id: str
    #: The id of the user message that starts the turn (from the POST's answer).
    item_id: str | None = None
    #: The session ran a turn when the cursor was read: the message waits behind it.
    busy: bool = False
    events: list[JsonObject] = field(default_factory=list)
    status: str | None = None
    error: JsonObject | None = None
    running: bool = False
    done: bool = False
    #: The id of the newest event seen: the resume point of the next turn.
    last_id: str | None = None
    _text: list[str] = field(default_factory=list)
    _seen: set[str] = field(default_factory=set)
    _newest: int | None = None
    _failure: JsonObject | None = None

    @property
    def text(self) -> str:
        """The assistant text streamed so far."""
        return "".join(self._text)

    def feed(self, event: StreamEvent) -> bool:
        """Record ``event``; False if it is a repeat, came after the end or belongs to
        another turn, and was dropped."""
        if self.done or not self._new(event):
            return False
        if self.item_id is None:
            return self._record(event)
        if event.type == "session.input.consumed":
            data = v if isinstance(v := event.data.get("data"), dict) else {}
            if data.get("item_id") == self.item_id and data.get("runner_status") == "buffered":
                if self.running:
                    # Another client's turn began between the cursor and this message,
                    # which waits behind it: that turn is not this one.
                    self._forget()
                else:
                    self.busy = True
                return False
        if self.busy and not self.running:
            if _is_running(event):
                self.busy = False  # the turn of the message, straight after the running one
            elif event.type == "session.status" and event.data.get("status") in TERMINAL_STATUSES:
                self.busy = False  # the running turn is over; the next to start is this one
                return False
            elif event.type != "session.delivery_failed":
                return False
        return self._record(event)

    def _forget(self) -> None:
        """Drop what was collected of a turn that turned out to be another's."""
        self.events.clear()
        self._text.clear()
        self.running, self._failure, self.busy = False, None, True

    def _new(self, event: StreamEvent) -> bool:
        """Whether ``event`` was not seen before (and note it as seen)."""
        if event.id is not None:
            number = event_number(event.id)
            if event.id in self._seen or (
                number is not None and self._newest is not None and number <= self._newest
            ):
                return False
            self._seen.add(event.id)
            self.last_id = event.id
            if number is not None:
                self._newest = number
        return True

    def _record(self, event: StreamEvent) -> bool:
        """Add ``event`` to the turn; False if it is the start of the turn after it."""
        if self.item_id is not None and self.running and _is_running(event):
            # The next turn (messages buffered behind this one) began: this one is over.
            self.done = True
            self.status = "failed" if self._failure is not None else "idle"
            self.error = self._failure
            return False
        self.events.append(event.record())
        data = event.data
        if event.type == "response.output_text.delta":
            self._text.append(str(data.get("delta") or ""))
        elif event.type == "response.failed":
            response = data.get("response")
            error = data.get("error") or (response or {}).get("error")
            if isinstance(error, dict):
                self._failure = error
        elif event.type == "session.delivery_failed" and (
            self.item_id is not None and data.get("item_id") == self.item_id
        ):
            # The runner refused the message (or never took it): no turn will start.
            self.status = "failed"
            self.done = True
            self.error = {
                "code": "delivery_failed",
                "message": str(data.get("detail") or "the runner did not take the message"),
            }
        elif event.type == "session.status":
            status = data.get("status")
            if status == "running":
                self.running = True
            elif status in TERMINAL_STATUSES and self.running:
                self.status = str(status)
                self.done = True
                if status == "failed":
                    error = data.get("error")
                    self.error = (
                        error
                        if isinstance(error, dict)
                        else self._failure or {"code": "failed", "message": "the turn failed"}
                    )
        return True

    def result(self) -> SendResult:
        """The document ``corral send --json`` prints."""
        return {
            "session_id": self.session_id,
            "status": self.status,
            "text": self.text,
            "error": self.error,
            "events": self.events,
        }


def _is_running(event: StreamEvent) -> bool:
    return event.type == "session.status" and event.data.get("status") == "running"
