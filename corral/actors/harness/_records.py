"""What the harness actor holds in memory: the turns it owns, its workers, their parked
elicitations. Rebuildable: a restarted actor reads the unacked TurnStart and ElicitationParked
messages back from its mailbox, and its workers, which died with it, are spawned again."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ...bus import Incoming
from ...harnesses.protocol import ElicitationParked, TurnStart
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


@dataclass
class ParkedElicitation:
    """A parked elicitation, as this actor knows it."""

    incoming: Incoming
    msg: ElicitationParked
    #: The verdict on its way to the worker: the worker may end the turn before the verdict's
    #: reply is in, and the turn's end must not cancel what is being resolved.
    verdict: str | None = None
