"""The tools actor's protocol: running one runner-local tool, and stopping it.

Policy calls :class:`ToolExec` (durable) once a tool call has passed its gates; the reply is
:class:`ToolExecResult`. :class:`ToolCancel` stops a running call.
"""

from __future__ import annotations

from typing import Any

from ...bus import Message
from ...tools._api import ToolStatus

TOOLS_ACTOR = "tools"


class ToolExec(Message, tag="tools.exec"):
    """Run one runner-local tool (policy → tools, a durable call)."""

    session_id: str
    call_id: str
    name: str
    arguments: str
    spec: dict[str, Any] = {}
    #: Overrides the tools actor's default per-call timeout when set.
    timeout_s: float | None = None


class ToolExecResult(Message, tag="tools.exec_result"):
    """A tool's output (tools → policy, the reply to :class:`ToolExec`)."""

    call_id: str
    output: str
    status: ToolStatus = "completed"


class ToolCancel(Message, tag="tools.cancel"):
    """Stop a running tool call (its turn ended or was interrupted)."""

    call_id: str
