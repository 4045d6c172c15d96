"""The policy actor's protocol: a tool call's way through the gate.

Message → reply:
    ToolCall        → ToolOutcome    origin ``turn`` (durable cast, from dispatch): the
                                     outcome is cast durably to ``reply_to``; origin ``mcp``
                                     (a call, ``POST .../mcp/execute``): it is the reply. A
                                     denied, failed or cancelled call is an outcome whose
                                     ``status`` says so, never an error
    Approval        → InputAccepted  (durable call, from dispatch) a verdict for an ASK this
                                     actor parked: 204; 404 ``not_found`` when it parked none
    TurnEnded       → none           (durable) cancel what the ended turn still waits on
    PolicyEvaluate  → none           (durable) a worker's ``policy_evaluation.requested``;
                                     the verdict goes to the harness actor as a PolicyVerdict

Besides these, every actor answers :class:`~corral.bus.InspectRequest` with an
:class:`~corral.bus.InspectReply`; a body outside :data:`Inbound` is rejected (dead-lettered)
and a caller gets ``protocol_error``; a handler that raises answers ``handler_error`` and its
durable message is nacked.

A tool call of a turn (a ``function_call`` item with ``status: action_required``) travels as
durable messages, so that a crash of any actor on the way neither loses the call nor runs it
twice:

1. dispatch casts :class:`ToolCall` (durable) to the policy actor and goes on with the turn;
2. policy applies its local gates and the server's ``PHASE_TOOL_CALL`` verdict (an ASK parks
   the call as an elicitation until a verdict), then calls the tools actor with
   :class:`~corral.actors.tools.messages.ToolExec` (durable) and gets
   :class:`~corral.actors.tools.messages.ToolExecResult`;
3. policy applies the ``PHASE_TOOL_RESULT`` verdict and casts
   :class:`~corral.actors.dispatch.messages.ToolOutcome` (durable) back to dispatch, which
   hands the output to the worker as ``tool_result``.

Session events a tool causes (terminal resources, changed files, the elicitation prompt) go
to dispatch as :class:`~corral.actors.dispatch.messages.PublishEvents`, which puts them on
the session stream in order.
"""

from __future__ import annotations

import hashlib
from typing import Literal

from ..._jsonlines import JsonObject
from ...bus import Message, Request
from ...harnesses.protocol import Approval
from ...tools._api import ToolStatus

POLICY_ACTOR = "policy"


class ToolCall(Request["ToolOutcome"], tag="policy.tool_call"):
    """A model's tool call in a turn, for the policy gate (dispatch → policy, durable)."""

    session_id: str
    turn_id: str
    call_id: str
    name: str
    #: The arguments as the model produced them (a JSON text, possibly malformed).
    arguments: str
    #: The session's agent spec (``spec_to_dict``), ``{}`` when unknown.
    spec: JsonObject = {}
    #: Who gets the :class:`ToolOutcome`.
    reply_to: str = "dispatch"
    #: The runner the session belongs to (whose server evaluates policy).
    runner_id: str | None = None
    #: ``turn``: a call of a turn, answered with a durable :class:`ToolOutcome` cast.
    #: ``mcp``: ``POST .../mcp/execute`` — the server has already evaluated it; answered as
    #: the reply to this (non-durable) call.
    origin: Literal["turn", "mcp"] = "turn"


class ToolOutcome(Message, tag="dispatch.tool_outcome"):
    """What the model sees of a tool call (policy → dispatch, durable)."""

    session_id: str
    turn_id: str
    call_id: str
    output: str
    status: ToolStatus = "completed"


class TurnEnded(Message, tag="policy.turn_ended"):
    """A turn that made tool calls ended: what it still waits on is cancelled (dispatch →
    policy, durable)."""

    session_id: str
    turn_id: str


class PolicyEvaluate(Message, tag="policy.evaluate"):
    """A worker's ``policy_evaluation.requested`` (dispatch → policy, durable); the verdict
    goes to the harness actor as a ``PolicyVerdict``."""

    session_id: str
    evaluation_id: str
    phase: str
    data: JsonObject = {}
    runner_id: str | None = None


def elicitation_id_for(session_id: str, call_id: str) -> str:
    """The id of the approval a tool call waits on: the same after any restart."""
    digest = hashlib.sha256(f"{session_id}\0{call_id}".encode()).hexdigest()
    return f"elicit_{digest[:32]}"


#: Everything the policy actor handles.
Inbound = ToolCall | Approval | TurnEnded | PolicyEvaluate
