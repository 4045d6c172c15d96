"""What a runner-local tool is given and returns.

A tool is ``async def run(ctx: ToolContext, args: JsonObject) -> str``: it gets the decoded
arguments the model produced and returns the ``function_call_output`` text the model sees
(JSON text for every tool here). A tool that cannot do what it was asked raises
:class:`ToolError`; its message is meant for the model and becomes ``{"error": message}``.
Any other exception is a bug: the tools actor logs it and the model gets a generic error
(P-28).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from .._jsonlines import JsonObject

if TYPE_CHECKING:
    from ..server_client import ServerClient
    from .async_calls import AsyncCalls
    from .inbox import Inbox
    from .terminals import Terminals

#: Publishes one session event (``session.resource.created`` ...) on the session's stream.
Publish = Callable[[Mapping[str, object]], Awaitable[None]]
#: Runs another runner-local tool by name (what ``sys_call_async`` dispatches to).
RunTool = Callable[[str, JsonObject], Awaitable[str]]
#: Records a sub-agent's work with dispatch before its message is posted (``sys_session_send``):
#: ``(dispatch_id, child_session_id, agent, title, abandoned)``; returns once the entry is on
#: disk. ``abandoned``: the message could not be posted, so no result will come (the caller
#: was told by the tool's own error) and the entry is closed.
RegisterWork = Callable[[str, str, str, str, bool], Awaitable[None]]
#: Tells dispatch that the caller's ``sys_read_inbox`` took these sub-agent results, by their
#: ``work_id`` (S-17); returns once that is durable.
WorkDrained = Callable[[list[str]], Awaitable[None]]
#: ``cancel_work(child, confirm)`` → ``(found, status)``: the caller's work on a child in the
#: sub-agent registry; ``confirm`` ends it cancelled (``sys_cancel_task``).
CancelWork = Callable[[str, bool], Awaitable[tuple[bool, str | None]]]

ToolFamily = Literal["os", "terminal", "inbox", "session", "agent"]

#: How a tool call ended, as the model is told (the tools and dispatch actors' messages).
ToolStatus = Literal["completed", "failed", "denied", "cancelled"]


class ProcessTracker(Protocol):
    """Told about every process group a tool starts, so a crash cannot orphan it: the tools
    actor records each one and kills leftovers when it starts again."""

    def started(self, pid: int) -> None:
        """A process group led by ``pid`` started."""

    def ended(self, pid: int) -> None:
        """That process group is gone."""


class ToolError(Exception):
    """A tool could not do what it was asked; the message is shown to the model."""


@dataclass(slots=True)
class ToolContext:
    """Everything a tool call may use. Built per call by the tools actor."""

    #: The conversation (session) the call belongs to.
    session_id: str
    #: The ``call_id`` of the model's function call (idempotency key for durable effects).
    call_id: str
    #: The session's agent spec as a plain dict (``spec_to_dict``); ``{}`` when unknown.
    spec: JsonObject
    #: The runner workspace (``corral up --workspace``, ``CORRAL_WORKSPACE`` or
    #: ``OMNIGENT_RUNNER_WORKSPACE``); None when the runner has none.
    workspace: Path | None
    #: Root of the per-conversation fallback directories (T-10).
    os_env_root: Path
    #: Deadline of one call, in seconds (``sys_os_shell`` may take its own, smaller one).
    timeout_s: float
    #: Publishes a session event on this session's stream.
    publish: Publish
    #: The tools actor's durable directory.
    data_dir: Path
    #: The session inboxes (``sys_read_inbox``); None when not available.
    inbox: Inbox | None = None
    #: Background calls (``sys_call_async`` / ``sys_cancel_async``); None when not available.
    async_calls: AsyncCalls | None = None
    #: The tools actor's tmux terminals (``sys_terminal_*``); None when not available.
    terminals: Terminals | None = None
    #: Records the process groups tools start; None: not tracked.
    processes: ProcessTracker | None = None
    #: The server of the session's runner, for the tools that answer by asking it (T-26);
    #: None when the host knows no server for it.
    server: ServerClient | None = None
    #: Runs another tool of the table, with this context.
    run_tool: RunTool | None = None
    #: Registers a dispatched child's work (``sys_session_send``); None when not available.
    register_work: RegisterWork | None = None
    #: Looks up (and ends) the caller's sub-agent work (``sys_cancel_task``); None when not
    #: available.
    cancel_work: CancelWork | None = None
    #: Tells dispatch the caller took sub-agent results (``sys_read_inbox``); None when not
    #: available.
    work_drained: WorkDrained | None = None
    #: Largest output a tool returns before it is cut with a marker.
    max_output_chars: int = 100_000


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One runner-local tool: its model-facing schema and its implementation."""

    name: str
    description: str
    #: JSON schema of the arguments object.
    parameters: JsonObject
    run: Callable[[ToolContext, JsonObject], Awaitable[str]]
    family: ToolFamily
    #: Publishes ``session.changed_files.invalidated`` after it runs (T-20).
    mutates_files: bool = False
