"""The harness protocol: what a harness worker is told, and what it says, as bus messages.

The vocabulary is the omnigent runner ↔ harness protocol (PROTOCOL_FACTS.md §iv), carried as
tagged msgspec Structs instead of HTTP + SSE. Output events encode to exactly the JSON objects
that protocol streams (``{"type": "response.output_text.delta", "delta": "..."}``, plus a
``turn_id`` and a ``sequence_number``), so dispatch can publish them on the session stream
as they are.

Inputs (dispatch → harness actor → worker), each answered with :class:`InputAccepted`:
:class:`TurnStart`, :class:`ToolResult`, :class:`Approval`, :class:`PolicyVerdict`,
:class:`Interrupt` — :data:`WorkerInbound`, what a worker decodes. A worker also sends the
harness actor :class:`WorkerAlive` and :class:`ElicitationParked`, and answers its
:class:`Inventory` (after a restart of that actor) with :class:`Holdings`. Dispatch itself tells a
worker which of its events are :class:`Confirmed` and asks it to :class:`Resend` the rest
(docs/harnesses.md, "Events held until confirmed").

This protocol stays in ``corral.harnesses`` (not beside the harness actor) because workers
import it and sit below the actors (STYLE.md's layering): a worker must not import an
actor's package. The harness actor's own union is in :mod:`corral.actors.harness.messages`.

Outputs (worker → the turn's ``reply_to``): :data:`AnyOutput`, runs of deltas packed in
:class:`Deltas` for a ``reply_to`` that asked (``TurnStart.batch``). The harness actor
itself emits ``response.failed`` with code ``harness_crashed`` (or ``harness_restarted``) for
a turn whose worker died, and ``response.elicitation_resolved`` for elicitations it had to
cancel.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from ..bus import Message, Request

#: Where harness workers and the harness actor live on the bus.
HARNESS_ACTOR = "harness"


def worker_address(session_id: str) -> str:
    """The bus address of a session's worker."""
    return f"harness/{session_id}"


# --- inputs ----------------------------------------------------------------------------------


class TurnStart(Request["InputAccepted"], tag="harness.turn"):
    """Start a turn. ``message`` is the §iv.1 body: full history in ``content``,
    ``instructions``, ``tools``, ``model``, ``conversation_id``, ...
    """

    session_id: str
    turn_id: str
    spec: dict[str, Any]
    message: dict[str, Any]
    harness: str | None = None
    model_override: str | None = None
    harness_override: str | None = None
    reply_to: str = "dispatch"
    #: Sent again by a dispatch that could not tell whether its first start reached the
    #: harness actor (it crashed in between): a turn already seen is left as it is.
    again: bool = False
    #: ``reply_to`` takes runs of deltas packed in :class:`Deltas` (dispatch does); any
    #: other gets every event in a message of its own.
    batch: bool = False
    #: Filled in by the harness actor for the worker: the session's tool working directory
    #: (where ``sys_os_*`` run), and a per-session directory of its own for a CLI's home.
    workdir: str | None = None
    cli_home: str | None = None


class ToolResult(Request["InputAccepted"], tag="harness.tool_result"):
    """The output of a tool the worker asked for (``function_call`` ``action_required``)."""

    session_id: str
    call_id: str
    output: str


class Approval(Request["InputAccepted"], tag="harness.approval"):
    """A human verdict on an elicitation, flattened (E-01): no ``content`` key when none."""

    session_id: str
    elicitation_id: str
    action: Literal["accept", "decline", "cancel"]
    content: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET


class PolicyVerdict(Request["InputAccepted"], tag="harness.policy_verdict"):
    """The verdict on a ``policy_evaluation.requested``.

    ``failed`` marks a verdict the runner made up because the server gave none (an
    unreachable server, a non-200, a malformed answer): the phase failed closed, no policy
    decided it.
    """

    session_id: str
    evaluation_id: str
    action: str
    reason: str | None = None
    data: dict[str, Any] | None = None
    failed: bool = False


class Interrupt(Request["InputAccepted"], tag="harness.interrupt"):
    """Cancel the session's active turn; it ends with ``response.cancelled``."""

    session_id: str


class Resend(Request["Resending"], tag="harness.resend"):
    """Dispatch → a worker: send again what of ``turn_id`` dispatch has not confirmed.

    A new incarnation of dispatch asks it of the turn it resumes (what the killed one had
    taken and not yet published is gone with it), and any incarnation asks it when a turn's
    events arrive with a gap in their ``sequence_number``."""

    session_id: str
    turn_id: str


class Resending(Message, tag="harness.resending"):
    """A worker's answer to :class:`Resend`: it sends its events of the turn from ``first``
    (all before it were confirmed) to ``last``, the last it emitted, again; ``known`` is
    False when it holds nothing of the turn (it never started it, or is a new process)."""

    known: bool
    first: int = 0
    last: int = -1


class Inventory(Request["Holdings"], tag="harness.inventory"):
    """The harness actor → a worker it adopted after a restart: what do you hold?"""

    session_id: str


class Holdings(Message, tag="harness.holdings"):
    """A worker's answer to :class:`Inventory`: the turn it runs (``turn_id``, None if
    none), the elicitations that turn waits on, the last turn it ended (``ended``: its
    terminal is sent, or on its way to the harness actor), and where the events of the
    latest of the two go (``reply_to``: its start's)."""

    turn_id: str | None = None
    elicitations: list[str] = []
    ended: str | None = None
    reply_to: str | None = None


class Confirmed(Message, tag="harness.confirmed"):
    """Dispatch → a worker: every event of ``turn_id`` up to ``sequence_number`` ``upto`` is
    with every receiver (durable at the broker): the worker forgets them (stream)."""

    session_id: str
    turn_id: str
    upto: int


class InputAccepted(Message, tag="harness.accepted"):
    """Reply to an input: ``status`` mirrors the HTTP side channel (200, 204, 404, 409)."""

    status: int
    error: dict[str, Any] | None = None


# --- outputs ---------------------------------------------------------------------------------


class Output(Message, kw_only=True):
    """Base of every event a worker emits for a turn."""

    turn_id: str = ""
    sequence_number: int = 0


class ResponseCreated(Output, tag="response.created"):
    response: dict[str, Any]


class WorkerAlive(Message, tag="harness.alive"):
    """A worker's heartbeat to the harness actor; ``busy`` while a turn runs."""

    session_id: str
    busy: bool
    #: Which worker process says so: a late heartbeat of a dead one must not count.
    pid: int = 0


class ResponseInProgress(Output, tag="response.in_progress"):
    response: dict[str, Any]


class OutputTextDelta(Output, tag="response.output_text.delta"):
    """Assistant text. ``message_id`` names the assistant ``message`` item that will carry
    the whole text (:meth:`TurnContext.text`); the server persists that item and does not
    accumulate deltas that name one (PROTOCOL_0_19 §D.3)."""

    delta: str
    message_id: str | None = None


class ReasoningDelta(Output, tag="response.reasoning_text.delta"):
    delta: str


class OutputItemDone(Output, tag="response.output_item.done"):
    """A finished item: ``function_call`` (in_progress / action_required / completed),
    ``function_call_output``, or an assistant ``message``.

    The server persists a completed ``function_call`` and an assistant ``message`` only when
    they carry ``agent`` (PROTOCOL_0_19 §E.1); :meth:`TurnContext.item` adds it. A kind's
    streamed text is sent as deltas marked with a ``message_id`` and then as one assistant
    ``message`` item of that id (:meth:`TurnContext.text`), so the server saves the text
    whole even when its relay of the stream restarted in between (docs/protocol-0.19.md).
    """

    item: dict[str, Any]


class ElicitationRequest(Output, tag="response.elicitation_request"):
    elicitation_id: str
    params: dict[str, Any]


class ElicitationResolved(Output, tag="response.elicitation_resolved"):
    elicitation_id: str
    action: str
    reason: str | None = None


class PolicyEvaluationRequested(Output, tag="policy_evaluation.requested"):
    evaluation_id: str
    phase: str
    data: dict[str, Any] = {}


class PolicyDenied(Output, tag="response.policy_denied"):
    """A policy stopped something the turn was about to do (PROTOCOL_0_19 §D.2: the server
    requires ``conversation_id``); ``phase`` is the policy phase's short name
    (``llm_request``)."""

    conversation_id: str
    reason: str = ""
    phase: str = ""


class ResponseHeartbeat(Output, tag="response.heartbeat"):
    server_time: str
    last_event_seq: int


class RuntimeModel(Output, tag="runtime_model"):
    """The model actually serving the run (J-20..J-31); owned by (session, stream = run)."""

    session_id: str
    stream_id: str
    model: str
    provider: str | None
    fallback_active: bool
    phase: str = "observed_output"


class Warning(Output, tag="warning"):
    """A provider lifecycle status worth telling (e.g. a switch to a fallback model)."""

    kind: str = "fallback"
    message: str = ""


class ResponseRetry(Output, tag="response.retry"):
    """A model call failed in a way worth another try, which comes after ``delay_seconds``:
    the real server's ``RetryEvent`` (``attempt`` is the upcoming one, 1-based; ``error`` is
    ``{code, message}``), so a client can say "retrying, attempt 2 of 5"."""

    attempt: int
    max_attempts: int
    delay_seconds: float
    source: str = "llm"
    error: dict[str, Any] = {}


class ResponseCompleted(Output, tag="response.completed"):
    response: dict[str, Any]


class ResponseFailed(Output, tag="response.failed"):
    error: dict[str, Any]
    response: dict[str, Any] = {}


class ResponseCancelled(Output, tag="response.cancelled"):
    response: dict[str, Any] = {}


TERMINAL_OUTPUTS = (ResponseCompleted, ResponseFailed, ResponseCancelled)

#: The events that end a turn.
TerminalOutput = ResponseCompleted | ResponseFailed | ResponseCancelled
#: The events of a turn before its end, in the order a turn may emit them.
ProgressOutput = (
    ResponseCreated
    | ResponseInProgress
    | OutputTextDelta
    | ReasoningDelta
    | OutputItemDone
    | ElicitationRequest
    | ElicitationResolved
    | PolicyEvaluationRequested
    | PolicyDenied
    | ResponseHeartbeat
    | RuntimeModel
    | Warning
    | ResponseRetry
)
#: Every event a worker emits for a turn.
AnyOutput = ProgressOutput | TerminalOutput


#: Deltas per :class:`Deltas` message at most (a worker's outbox sends 256 at a time).
DELTAS_MAX = 256


class Deltas(Message, tag="harness.deltas"):
    """Consecutive deltas of one turn in one stream message, each as it would go alone.

    Sent one message each, every delta cost the worker and dispatch a message's own work
    (an envelope, its id, its encode and decode, an inbox slot, a handler call): packed,
    dispatch spends 42 % less CPU per delta in a flood and the worker 32 % less. Only
    deltas are packed: they are what a turn sends many of, and small."""

    events: list[OutputTextDelta | ReasoningDelta]


def pack_deltas(msgs: list[Message], max_chars: int) -> list[Message]:
    """``msgs`` in order with each run of two or more deltas packed in :class:`Deltas` of
    at most :data:`DELTAS_MAX` events and ``max_chars`` characters of text (a delta larger
    than that goes alone)."""
    out: list[Message] = []
    run: list[OutputTextDelta | ReasoningDelta] = []
    chars = 0

    def close() -> None:
        if len(run) > 1:
            out.append(Deltas(events=run.copy()))
        else:
            out.extend(run)
        run.clear()

    for msg in msgs:
        if not isinstance(msg, OutputTextDelta | ReasoningDelta):
            close()
            out.append(msg)
            continue
        if run and (len(run) >= DELTAS_MAX or chars + len(msg.delta) > max_chars):
            close()
        if not run:
            chars = 0
        run.append(msg)
        chars += len(msg.delta)
    close()
    return out


def is_terminal(event: Output) -> bool:
    """Whether ``event`` ends its turn."""
    return isinstance(event, TERMINAL_OUTPUTS)


def to_json(event: Output) -> bytes:
    """The event as the JSON object the session stream carries."""
    return msgspec.json.encode(event)


class ElicitationParked(Message, tag="harness.elicitation_parked"):
    """A worker parked an elicitation; the harness actor records it durably (durable)."""

    session_id: str
    turn_id: str
    elicitation_id: str
    owner: str
    incarnation: str
    params: dict[str, Any]
    reply_to: str


#: What a worker decodes: its inputs (the harness actor forwards them), the harness actor's
#: :class:`Inventory`, and dispatch's confirmations of and requests for its turn's events.
WorkerInbound = (
    TurnStart | ToolResult | Approval | PolicyVerdict | Interrupt | Inventory | Resend | Confirmed
)
