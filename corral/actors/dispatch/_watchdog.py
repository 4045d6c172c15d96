"""The per-turn watchdog's verdict: every turn gets its one terminal edge, even if everything
else misbehaves.

A turn is ended ``failed`` (code ``turn_watchdog``) by the runner when it has run longer than
``turn_timeout_s``, or when nothing of it has arrived for ``turn_idle_timeout_s`` while it
waits on nobody — a turn waiting on a tool call's outcome or a human's verdict is not silent.
The actor asks once a second; the verdict is a pure function of the turn and the clock.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

from ._turn import Turn


class TurnError(TypedDict):
    """The ``error`` of a turn the runner ends ``failed`` on its own account."""

    #: The exception's class, when one caused it.
    type: NotRequired[str]
    code: str
    message: str


def overdue(turn: Turn, now: float, *, turn_timeout_s: float, idle_timeout_s: float) -> str | None:
    """Why ``turn`` must be ended at monotonic time ``now`` (None: it may go on)."""
    if now - turn.started > turn_timeout_s:
        return "took too long"
    if not turn.waiting and now - turn.last_event > idle_timeout_s:
        return "went silent"
    return None


def watchdog_error(why: str) -> TurnError:
    """The ``error`` of the ``failed`` edge of a turn the watchdog ended."""
    return {"code": "turn_watchdog", "message": f"the turn {why} and was ended by the runner"}
