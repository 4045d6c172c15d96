"""The tools actor's protocol: running one runner-local tool, and stopping it.

Message → reply:
    ToolExec     → ToolExecResult  (durable call, from policy) run one tool; a failing or
                                   timed-out tool is a result with ``status`` ``failed``
    ToolCancel   → none            stop a running call (its turn ended)
    InboxPush    → InboxPushed     (durable call, from dispatch) a sub-agent's result into
                                   its parent's inbox, idempotent by ``key`` (S-14)
    HttpRequest  → HttpResponse    ``/v1/sessions/{id}/resources[/...]`` (from the gateway
                                   and dispatch); errors are HTTP answers
                                   ``{"error": {"code", "message"}}``, never an ErrorReply

Besides these, every actor answers :class:`~corral.bus.InspectRequest` with an
:class:`~corral.bus.InspectReply`; a body outside :data:`Inbound` is rejected (dead-lettered)
and a caller gets ``protocol_error``; a handler that raises answers ``handler_error`` and its
durable message is nacked.
"""

from __future__ import annotations

from ..._jsonlines import JsonObject
from ...bus import Message, Request
from ...routes import HttpRequest
from ...tools._api import ToolStatus

TOOLS_ACTOR = "tools"


class ToolExec(Request["ToolExecResult"], tag="tools.exec"):
    """Run one runner-local tool (policy → tools, a durable call)."""

    session_id: str
    call_id: str
    name: str
    arguments: str
    spec: JsonObject = {}
    #: Overrides the tools actor's default per-call timeout when set.
    timeout_s: float | None = None
    #: The runner id the session is bound through: whose server the session tools ask.
    runner_id: str | None = None


class ToolExecResult(Message, tag="tools.exec_result"):
    """A tool's output (tools → policy, the reply to :class:`ToolExec`)."""

    call_id: str
    output: str
    status: ToolStatus = "completed"


class ToolCancel(Message, tag="tools.cancel"):
    """Stop a running tool call (its turn ended or was interrupted)."""

    call_id: str


class InboxPush(Request["InboxPushed"], tag="tools.inbox_push"):
    """Queue ``item`` on the inbox of ``session_id`` (dispatch → tools, a durable call); a
    key pushed before is ignored, so a push sent again after a crash is queued once."""

    session_id: str
    key: str
    item: JsonObject


class InboxPushed(Message, tag="tools.inbox_pushed"):
    """The item is in the inbox, fsynced (``queued`` False: its key was there already)."""

    key: str
    queued: bool


#: Everything the tools actor handles.
Inbound = ToolExec | ToolCancel | InboxPush | HttpRequest
