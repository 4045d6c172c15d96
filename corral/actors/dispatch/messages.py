"""The dispatch actor's protocol: sessions' routes, and what comes back to their turns.

Its one message of its own is :class:`PublishEvents`; the rest are the protocols it consumes:
HTTP over the bus (:mod:`corral.routes`), workers' events (:mod:`corral.harnesses.protocol`)
and the policy's :class:`~corral.actors.policy.messages.ToolOutcome`.

Message → reply:
    HttpRequest        → HttpResponse  a route of the table in ``_routes.ROUTES`` (from the
                                       gateway): create, read, delete a session, its events
                                       (``?stream=true``: 200 SSE, then HttpChunks),
                                       ``mcp/execute``, and which runner id bound a session;
                                       the reply may come later
    ProgressOutput     → none          a ``response.*`` event of the session's active turn,
                                       from its worker; one of another turn is dropped
    Deltas             → none          a run of them (deltas), packed by the worker: each
                                       taken as if it came alone
    TerminalOutput     → none          (durable, from the harness actor) the active turn's
                                       one terminal event; one of another turn is dropped
    ToolOutcome        → none          (durable, from policy) a tool call's output → the
                                       worker as ``tool_result``
    PublishEvents      → none          (durable, from tools and policy) events on the
                                       session stream, in order
    SubagentDispatched → SubagentRegistered  (durable call, from tools) a child given work
                                       by ``sys_session_send``: its entry in the work
                                       registry (``_subagents``), idempotent by dispatch id
    SubagentCancel     → SubagentTask  (call, from tools) ``sys_cancel_task``: the caller's
                                       work on a child and its status; ``confirm`` ends its
                                       open work ``cancelled`` (a hard-stopped child)
    SubagentDrained    → none          (durable, from tools) the parent's ``sys_read_inbox``
                                       took these results: their entries are done (S-17)

Route errors are HTTP answers, never an ErrorReply: every error body is
``{"error": {"code", "message"}}`` (PROTOCOL_0_19.md §H.2) — 400 ``invalid_request`` or
``invalid_input``, 422 ``invalid_event`` or ``invalid_request`` (a malformed body), 404
``not_found``, 501 ``not_implemented`` (no harness actor, D-03, or no runner-side tools),
502 ``harness_forward_failed`` or ``tool_failed``, 503 ``spec_resolver_failed`` or
``runner_error``, 500 ``runner_error`` (anything else, logged; details never in the body).

Besides these, every actor answers :class:`~corral.bus.InspectRequest` with an
:class:`~corral.bus.InspectReply`; a body outside :data:`Inbound` is rejected (dead-lettered)
and a caller gets ``protocol_error``; a handler that raises answers ``handler_error`` and its
durable message is nacked.
"""

from __future__ import annotations

from ..._jsonlines import JsonObject
from ...bus import Message, Request
from ...harnesses.protocol import Deltas, ProgressOutput, TerminalOutput
from ...routes import HttpRequest
from ..policy.messages import ToolOutcome


class PublishEvents(Message, tag="dispatch.publish_events"):
    """Session events caused outside a turn's stream (tools, policy → dispatch, durable)."""

    session_id: str
    events: list[JsonObject]


class SubagentDispatched(Request["SubagentRegistered"], tag="dispatch.subagent_dispatched"):
    """A child session was given work by its parent (tools → dispatch, a durable call): one
    work entry, recorded before the child's message is posted so its end cannot go unseen."""

    dispatch_id: str
    parent_session_id: str
    child_session_id: str
    agent: str
    title: str
    #: The runner id the parent is bound through (whose server it is woken on).
    runner_id: str | None = None
    #: The child's message could not be posted: no result will come, and the parent was told
    #: by the tool's error, so the entry is closed with nothing to deliver.
    abandoned: bool = False


class SubagentRegistered(Message, tag="dispatch.subagent_registered"):
    """The entry is on disk (the reply to :class:`SubagentDispatched`)."""

    dispatch_id: str


class SubagentCancel(Request["SubagentTask"], tag="dispatch.subagent_cancel"):
    """``sys_cancel_task`` on a child (tools → dispatch): the caller's latest work on it, and
    with ``confirm`` (the child was stopped for good) its open work ends ``cancelled`` now —
    recorded, delivered to the parent once, and a completion that comes later ignored."""

    parent_session_id: str
    child_session_id: str
    confirm: bool = False


class SubagentTask(Message, tag="dispatch.subagent_task"):
    """The reply to :class:`SubagentCancel`: whether the caller has work on the child, and
    that work's status (after the cancel, with ``confirm``)."""

    found: bool
    status: str | None = None


class SubagentDrained(Message, tag="dispatch.subagent_drained"):
    """The parent's ``sys_read_inbox`` took these sub-agents' results from its inbox with a
    final policy verdict (tools → dispatch, durable; sent again when the drain is replayed):
    their work entries are done (S-17). One held back by a failed evaluation is not here."""

    parent_session_id: str
    work_ids: list[str]


#: Everything the dispatch actor handles.
Inbound = (
    HttpRequest
    | ProgressOutput
    | Deltas
    | TerminalOutput
    | ToolOutcome
    | PublishEvents
    | SubagentDispatched
    | SubagentCancel
    | SubagentDrained
)
