"""The control plane's fixed answers to clients, as TypedDicts.

They stay dicts that the HTTP layer encodes as they are, so keys and their order are the
ones built here. The snapshot follows the real server's session object (§iii.4): the fields
this plane has no notion of are present and null, so a client reads it as it reads the
real one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NotRequired, TypedDict

from ..._jsonlines import JsonObject
from .._store import PendingElicitation


class SessionObject(TypedDict):
    """A session as the client API lists it."""

    id: str
    object: Literal["session"]
    agent: str
    agent_id: str
    runner_id: str | None
    status: str
    title: str | None
    created_at: int
    updated_at: int
    last_event_id: int
    runner_online: bool


class SessionSnapshot(SessionObject):
    """The session object plus the full snapshot of §iii.4."""

    agent_name: str
    background_task_count: None
    labels: JsonObject
    host_id: None
    host_online: None
    host_resumable: bool
    reasoning_effort: None
    items: list[Any]
    items_count: int
    permission_level: None
    sub_agent_name: str | None
    kind: Literal["default", "sub_agent"]
    parent_session_id: str | None
    root_conversation_id: str
    llm_model: str | None
    harness: str | None
    model_override: None
    cost_control_mode_override: None
    subagent_routing_override: None
    context_window: None
    last_total_tokens: None
    total_cost_usd: None
    usage_by_model: None
    last_task_error: None
    external_session_id: None
    terminal_launch_args: None
    pending_elicitations: list[PendingElicitation]
    pending_elicitation_count: int
    pending_inputs: list[Any]
    workspace: None
    git_branch: None
    archived: bool
    todos: list[Any]
    skills: list[Any]
    model_options: list[Any]
    terminal_pending: bool
    sandbox_status: None
    mcp_startup: None
    active_response_id: None
    project_id: None


class MessagePosted(TypedDict):
    """A user message stored (and queued for the runner)."""

    queued: bool
    item_id: str


class SessionDeleted(TypedDict):
    """A session deleted."""

    id: str
    object: Literal["conversation.deleted"]
    deleted: Literal[True]


class Resolved(TypedDict):
    """A verdict stored; ``runner_status`` once the runner answered its forward."""

    queued: bool
    elicitation_id: str
    runner_status: NotRequired[int | None]


class ControlForwarded(TypedDict):
    """A control event the runner answered."""

    queued: Literal[False]
    runner_status: int


class Health(TypedDict):
    """``GET /healthz``; ``runner`` holds the link's counters besides the fields it names."""

    ok: Literal[True]
    version: str
    runner_id: str
    runner_online: bool
    runner: Mapping[str, object] | None
