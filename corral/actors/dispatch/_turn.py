"""The turn state machine: a session's phases, the transitions between them, how a turn ends.

A session is ``idle`` (no active turn), ``running`` (one turn is active) or ``interrupted``
(the active turn was asked to stop and its end is awaited). What moves it is a
:class:`Trigger`; :data:`TRANSITIONS` is the whole table, and :func:`transition` refuses
a pair that is not in it with :class:`IllegalTransition` (a terminal event or a runner failure
of a session with no active turn: dispatch drops those before asking). A message during a
turn does not enter it: it is buffered and runs as the next turn (PROTOCOL_0_19.md §E.3).

How a turn ends is decided by two pure functions: :func:`on_terminal` (from the terminal
event and whether the turn was interrupted: what goes upstream, whether the answer is kept,
whether an ``[System: interrupted]`` note is left, §E.4) and :func:`after_end` (from the
session status it ends in and whether messages are buffered: one terminal edge, or straight
into the continuation turn with no ``idle`` in between, D-31).

:class:`Turn` is the active turn's live bookkeeping (what it waits on, what was answered);
nothing here does I/O, so all of it is tested without processes
(``tests/unit/test_dispatch_turn_states.py``).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from ..._exceptions import CorralError
from ..._jsonlines import JsonObject
from .._handoff import HandoffLock

if TYPE_CHECKING:
    from ...harnesses.protocol import Output
    from .._deferred import Deferred
    from ._session import SessionRecord

#: Prefix of a harness elicitation's key in ``Turn.waiting`` (tool calls use their call id).
_ELICITATION = "elicitation:"

#: A turn's stream numbering: its worker's event ``k`` (its ``sequence_number``) is
#: ``base + (k + 1) * STRIDE`` whichever incarnation publishes it, so an event sent again
#: after a restart keeps its ``seq`` (the gateway drops a ``seq`` it has seen); the runner's
#: own events of the turn take the numbers in between (``record.seq + 1``: fewer than
#: ``STRIDE`` between two of the worker's, a handful per tool call).
STRIDE = 1 << 10
#: Past any worker event of a turn (2**24 events): where a turn whose worker is gone, and
#: so cannot say what it had sent, numbers its end.
PAST_WORKER = (1 << 24) * STRIDE


def worker_seq(base: int, k: int) -> int:
    """The ``seq`` of worker event ``k`` of the turn numbered from ``base``."""
    return base + (k + 1) * STRIDE


class Phase(enum.Enum):
    """Where a session's turn stands."""

    IDLE = "idle"
    RUNNING = "running"
    INTERRUPTED = "interrupted"


class Trigger(enum.Enum):
    """What moves a session from one phase to another."""

    #: A ``message`` event: it starts a turn, or is buffered behind the active one.
    MESSAGE = "message"
    #: ``interrupt`` or ``stop_session``: the active turn is asked to stop.
    INTERRUPT = "interrupt"
    #: The active turn's one terminal ``response.*`` event (from the harness actor, or the
    #: runner's own ``failed``: the watchdog, a spec that cannot be resolved).
    TERMINAL = "terminal"
    #: The runner ends the active turn before a worker has it (turn setup failed).
    SETUP_FAILED = "setup_failed"
    #: ``DELETE /v1/sessions/{id}``: the active turn, if any, ends and the session is gone.
    DELETE = "delete"


TRANSITIONS: dict[tuple[Phase, Trigger], Phase] = {
    (Phase.IDLE, Trigger.MESSAGE): Phase.RUNNING,
    (Phase.IDLE, Trigger.INTERRUPT): Phase.IDLE,
    (Phase.IDLE, Trigger.DELETE): Phase.IDLE,
    (Phase.RUNNING, Trigger.MESSAGE): Phase.RUNNING,
    (Phase.RUNNING, Trigger.INTERRUPT): Phase.INTERRUPTED,
    (Phase.RUNNING, Trigger.TERMINAL): Phase.IDLE,
    (Phase.RUNNING, Trigger.SETUP_FAILED): Phase.IDLE,
    (Phase.RUNNING, Trigger.DELETE): Phase.IDLE,
    (Phase.INTERRUPTED, Trigger.MESSAGE): Phase.INTERRUPTED,
    (Phase.INTERRUPTED, Trigger.INTERRUPT): Phase.INTERRUPTED,
    (Phase.INTERRUPTED, Trigger.TERMINAL): Phase.IDLE,
    (Phase.INTERRUPTED, Trigger.SETUP_FAILED): Phase.IDLE,
    (Phase.INTERRUPTED, Trigger.DELETE): Phase.IDLE,
}


class IllegalTransition(CorralError):
    """A trigger that cannot happen in the session's phase (a terminal of no active turn)."""

    def __init__(self, phase: Phase, trigger: Trigger) -> None:
        super().__init__(f"{trigger.value} is not a transition of a session {phase.value}")
        self.phase = phase
        self.trigger = trigger


def transition(phase: Phase, trigger: Trigger) -> Phase:
    """The phase ``trigger`` moves a session in ``phase`` to.

    Raises:
        IllegalTransition: the pair is not in :data:`TRANSITIONS`.
    """
    try:
        return TRANSITIONS[(phase, trigger)]
    except KeyError:
        raise IllegalTransition(phase, trigger) from None


def on_message(phase: Phase) -> Literal["start", "buffer"]:
    """A message starts a turn in an idle session and is buffered behind an active one."""
    transition(phase, Trigger.MESSAGE)
    return "start" if phase is Phase.IDLE else "buffer"


Terminal = Literal["completed", "failed", "cancelled"]
Status = Literal["idle", "failed"]


@dataclass(frozen=True, slots=True)
class TurnEnd:
    """How the active turn ends, given its terminal event (:func:`on_terminal`)."""

    #: The session status the turn ends in.
    status: Status
    #: The terminal ``response.*`` event goes to the subscribers (the server): not for an
    #: interrupted turn's ``response.cancelled``, whose partial text the server would save as
    #: the answer (§E.4). The journal and a ``?stream=true`` caller get it either way.
    upstream: bool
    #: The streamed text joins the cached history as the assistant's answer.
    keep_answer: bool
    #: An ``[System: interrupted]`` note is left in the history and posted to the server.
    note: bool


def on_terminal(phase: Phase, terminal: Terminal) -> TurnEnd:
    """How a turn in ``phase`` ends on its ``terminal`` event.

    Raises:
        IllegalTransition: the session has no active turn.
    """
    transition(phase, Trigger.TERMINAL)
    if terminal == "failed":
        return TurnEnd(status="failed", upstream=True, keep_answer=False, note=False)
    if terminal == "completed":
        return TurnEnd(status="idle", upstream=True, keep_answer=True, note=False)
    interrupted = phase is Phase.INTERRUPTED
    return TurnEnd(status="idle", upstream=not interrupted, keep_answer=False, note=interrupted)


class Next(enum.Enum):
    """What follows the end of a turn (:func:`after_end`)."""

    #: The terminal edge (``session.status`` idle or failed), and nothing else.
    EDGE = "edge"
    #: The buffered messages run as the next turn: ``running`` again, no edge in between.
    CONTINUATION = "continuation"
    #: The ``failed`` edge, then the buffered messages run as a new turn.
    EDGE_THEN_TURN = "edge_then_turn"


def after_end(status: Status, *, buffered: bool) -> Next:
    """What follows a turn that ended in ``status`` with messages ``buffered`` or not (D-31)."""
    if not buffered:
        return Next.EDGE
    return Next.CONTINUATION if status == "idle" else Next.EDGE_THEN_TURN


@dataclass
class Turn:
    """The active turn of a session."""

    turn_id: str
    started: float = field(default_factory=time.monotonic)
    last_event: float = field(default_factory=time.monotonic)
    #: The text streamed since the turn's last saved message (``_history.take_item``), and
    #: the items it saved so far: what it adds to the cached history when it ends.
    text: list[str] = field(default_factory=list)
    items: list[JsonObject] = field(default_factory=list)
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
    #: Its first text delta was timed (``corral_turn_first_delta_seconds``); a resumed
    #: turn's is not: its start is another incarnation's.
    first_delta_timed: bool = False
    #: It sent policy an evaluation (the server may hold one until a person answers), so
    #: its end tells policy. Assumed of a resumed turn: a restart forgets it.
    evaluated: bool = False
    #: Its stream numbering (:func:`worker_seq`): the ``seq`` of its ``running`` edge.
    base: int = 0
    #: The worker event to publish next (events are published in their worker's order);
    #: None while a resumed turn waits to hear from its worker what it holds.
    next_k: int | None = 0
    #: The last event the worker said it had sent (:class:`~corral.harnesses.protocol.
    #: Resending`): the runner's own events wait until the turn is past it.
    resent_upto: int = -1
    #: A resumed turn whose worker could not say what it had sent (it died with the last
    #: incarnation, which published an unknown part of its events past its last save): the
    #: runner's own events wait for the worker's next event or the turn's end, which numbers
    #: them past anything the worker could have sent (:data:`PAST_WORKER`).
    unplaced: bool = False
    #: Worker events that came ahead of ``next_k`` (after a gap), by sequence number, with
    #: their ``origin_at`` and the handle of a durable one.
    early: dict[int, tuple[Output, float, Deferred | None]] = field(default_factory=dict)
    #: What waits for the turn to be in order (:attr:`in_order`): the runner's own events
    #: and the terminal, each with the handle of its durable message.
    later: list[tuple[Callable[[], Awaitable[None]], Deferred | None]] = field(default_factory=list)
    #: The last worker event confirmed to the worker, and since when a gap waits.
    confirmed: int = -1
    gap_since: float | None = None
    resending: bool = False
    #: Its terminal event, waiting for the worker events before it, with its handle.
    ending: tuple[Output, Deferred | None] | None = None
    #: Taken while its events are ordered and taken (a resend's answer comes in a task).
    lock: HandoffLock = field(default_factory=HandoffLock)

    @property
    def in_order(self) -> bool:
        """Whether everything the worker said it had sent is published (the runner's own
        events then number past it)."""
        return self.next_k is not None and self.next_k > self.resent_upto and not self.unplaced

    @property
    def phase(self) -> Phase:
        """``running``, or ``interrupted`` once asked to stop."""
        return Phase.INTERRUPTED if self.interrupted else Phase.RUNNING

    def number_past_worker(self, record: SessionRecord) -> None:
        """Number what comes next in ``record``'s stream past any event this turn's worker
        could have sent (an end made up for a worker that died, or :attr:`unplaced`)."""
        record.seq = max(record.seq, self.base + PAST_WORKER)
        self.unplaced = False

    def end_seq(self, record: SessionRecord, k: int) -> int | None:
        """The ``seq`` a stream caller's frame of the turn's terminal event ``k`` carries: the
        worker's own end keeps its seq, a made-up one (number 0) has none. An end before the
        worker was heard from (the runner's watchdog) numbers ``record`` past it first."""
        if self.unplaced:
            self.number_past_worker(record)
        return worker_seq(self.base, k) if k else None

    def heard(self) -> None:
        """Something of the turn arrived: the idle watchdog counts from now."""
        self.last_event = time.monotonic()

    def wait_on_elicitation(self, elicitation_id: str) -> None:
        """The harness waits on a human: the turn is not silent until it is resolved."""
        self.waiting.add(_ELICITATION + elicitation_id)

    def elicitation_closed(self, elicitation_id: str) -> None:
        self.waiting.discard(_ELICITATION + elicitation_id)

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
            first_delta_timed=True,
            evaluated=True,
            base=record.turn_base,
            next_k=None,
        )
