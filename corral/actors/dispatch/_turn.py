"""The active turn of a session."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ._session import SessionRecord

#: Prefix of a harness elicitation's key in ``Turn.waiting`` (tool calls use their call id).
_ELICITATION = "elicitation:"


@dataclass
class Turn:
    """The active turn of a session."""

    turn_id: str
    started: float = field(default_factory=time.monotonic)
    last_event: float = field(default_factory=time.monotonic)
    text: list[str] = field(default_factory=list)
    stream_to: tuple[str, str] | None = None  # (reply_to, request_id) of a ?stream=true POST
    spec_resolved: bool = True
    #: Tool calls still waiting on their outcome (a turn waiting on a tool or a human's
    #: verdict is not silent), and those whose outcome was taken (a second copy is dropped).
    #: The calls sent to policy are in the session record (``SessionRecord.tool_calls``).
    waiting: set[str] = field(default_factory=set)
    answered: set[str] = field(default_factory=set)
    #: An ``interrupt`` or ``stop_session`` asked it to stop (in the record too): its
    #: ``response.cancelled`` ends it the way §E.4 records an interruption.
    interrupted: bool = False

    @classmethod
    def resume(cls, record: SessionRecord) -> Turn:
        """The active turn of a session recovered after a restart.

        Its worker goes on streaming, so the turn must know what it had in flight: calls sent
        to policy and not answered still wait (a human may be deciding one: the idle watchdog
        must spare the turn), answered ones stay answered (a redelivered outcome is not sent
        to the worker twice), and the record still lists the calls, so the turn's end sends
        policy a TurnEnded for what it parked. The spec is fetched again before the next
        tool call: a restart forgets it, and a call without it would run outside the agent's
        working directory and rules.
        """
        assert record.turn_id is not None
        answered = set(record.answered)
        # Its age carries over (turn_timeout_s counts from the real start), and so does the
        # caller of a ``?stream=true`` turn, whose response is still open at the gateway.
        age = max(0.0, time.time() - record.turn_started_at) if record.turn_started_at else 0.0
        return cls(
            record.turn_id,
            started=time.monotonic() - age,
            stream_to=(record.stream_to[0], record.stream_to[1]) if record.stream_to else None,
            spec_resolved=False,
            waiting=(set(record.tool_calls) - answered)
            | {_ELICITATION + e for e in record.elicitations},
            answered=answered,
            interrupted=record.interrupted,
        )
