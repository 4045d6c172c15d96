"""What the harness actor holds in memory: the turns it owns, its workers, their parked
elicitations. Rebuildable: a restarted actor reads the unacked TurnStart and ElicitationParked
messages back from its mailbox, and adopts its workers, which outlive it (:mod:`._adopt`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ...bus import Incoming
from ...harnesses.protocol import ElicitationParked, TurnStart
from .._child_state import ChildState
from .._children import Child
from .._deferred import Deferred


@dataclass
class OwnedTurn:
    """A turn this actor is responsible for ending."""

    start: TurnStart
    #: Its TurnStart, in flight until the turn's terminal event is sent.
    deferred: Deferred
    began: float = field(default_factory=time.monotonic)
    elicitations: set[str] = field(default_factory=set)


@dataclass
class WorkerState:
    """One session's worker."""

    session_id: str
    harness: str
    spawned: float = field(default_factory=time.monotonic)
    last_seen: float = field(default_factory=time.monotonic)
    last_active: float = field(default_factory=time.monotonic)
    exited: bool = False
    #: When its process was seen to exit (the record is reclaimed once it is not needed).
    exited_at: float = 0.0
    pid: int | None = None

    def reclaimable(self, child: Child | None, now: float, period_s: float) -> bool:
        """Whether this exited worker's records can go: its process is gone, and it was
        stopped (nothing to remember) or its crash is older than the intensity period
        ``period_s`` (its restarts no longer count)."""
        if child is None:
            return True
        if child.state.up or not child.exited.is_set():
            return False
        if child.state is ChildState.STOPPED:
            return True
        return now - self.exited_at > period_s


@dataclass
class ParkedElicitation:
    """A parked elicitation, as this actor knows it."""

    incoming: Incoming
    msg: ElicitationParked
    #: The verdict on its way to the worker: the worker may end the turn before the verdict's
    #: reply is in, and the turn's end must not cancel what is being resolved.
    verdict: str | None = None
