"""Session and agent tools: their table entries, in the order they are advertised.

``sys_session_*``, ``sys_agent_*``, ``sys_list_models`` and ``sys_cancel_task`` are
runner-local (T-26): the runner answers them, talking to the server for the caller. The
read-only ones are :mod:`corral.tools.session_reads`; ``sys_session_close``,
``sys_session_share``, ``sys_session_create`` and ``sys_list_models`` are
:mod:`corral.tools.session_writes`; ``sys_session_send`` is :mod:`corral.tools.session_send`
and ``sys_cancel_task`` :mod:`corral.tools.session_cancel`. A tool whose table entry has no
implementation answers ``{"error": "<name> is not available on this runner yet"}``.

:data:`READY` and :data:`PENDING` are read off the table, so it is the one list of which
tools work; the registry keeps :data:`PENDING` out of advertised schemas so models are not
offered tools that always fail.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from .._jsonlines import JsonObject
from ._api import ToolContext, ToolError, ToolFamily, ToolSpec
from .session_cancel import sys_cancel_task
from .session_reads import (
    sys_agent_download,
    sys_agent_get,
    sys_agent_list,
    sys_session_get_history,
    sys_session_get_info,
    sys_session_list,
)
from .session_send import sys_session_send
from .session_writes import (
    EXACTLY_ONE_MODE_MESSAGE,
    sys_list_models,
    sys_session_close,
    sys_session_create,
    sys_session_share,
)

__all__ = ["EXACTLY_ONE_MODE_MESSAGE", "PENDING", "READY", "TOOLS", "not_available"]


def not_available(name: str) -> ToolError:
    """The error of a tool whose server side is not on this runner yet."""
    return ToolError(f"{name} is not available on this runner yet")


_Run = Callable[[ToolContext, JsonObject], Awaitable[str]]


def _pending(name: str) -> _Run:
    async def run(ctx: ToolContext, args: JsonObject) -> str:
        raise not_available(name)

    run.__name__ = name
    run.__doc__ = f"``{name}``: not available on this runner yet."
    return run


def _object(properties: JsonObject, required: tuple[str, ...] = ()) -> JsonObject:
    schema: JsonObject = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    return schema


def _text(description: str) -> JsonObject:
    return {"type": "string", "description": description}


_SESSION_ID = _text("Id of the session.")

# name, family, description, parameters, gated implementation (None: not available yet)
_DEFINITIONS: list[tuple[str, ToolFamily, str, JsonObject, _Run | None]] = [
    (
        "sys_session_list",
        "session",
        "List your sub-agent sessions (sub_agents: children; for a sub-agent also main and "
        "its siblings) and every session you may see (sessions), with status and whether "
        "its runner is online.",
        _object({"agent_name": _text("Only sessions of this agent (the sessions view).")}),
        sys_session_list,
    ),
    (
        "sys_session_get_history",
        "session",
        "Read the recent items of another session's conversation, oldest first, and the "
        "prompts it is waiting on.",
        _object(
            {
                "conversation_id": _text("Id of the session to read."),
                "tail_items": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 50,
                    "description": "Recent items to return (default 10, at most 50).",
                },
                "content_max_chars": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 100_000,
                    "description": "Characters shown of each item (default 2000; smaller "
                    "when needed to keep the whole read within 100000).",
                },
                "content_offset_chars": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "Characters skipped at the start of each item: with "
                    "tail_items=1, step it by content_max_chars to read a long item.",
                },
            },
            ("conversation_id",),
        ),
        sys_session_get_history,
    ),
    (
        "sys_session_get_info",
        "session",
        "Get a session's metadata (default: this session): agent, title, status, model, "
        "parent, runner connectivity and the prompts it is waiting on.",
        _object({"session_id": _text("Id of the session; default this session.")}),
        sys_session_get_info,
    ),
    (
        "sys_session_create",
        "session",
        "Create a child session from an existing agent (agent_id) or a local agent config "
        "file (config_path), and send it a first message.",
        _object(
            {
                "agent_id": _text("Id of an existing agent."),
                "config_path": _text("Agent YAML file, relative to the working directory."),
                "title": _text("Title of the new session."),
                "message": _text("First message for the new session."),
                "model": _text("Model for the new session (agent_id mode)."),
            }
        ),
        sys_session_create,
    ),
    (
        "sys_session_send",
        "session",
        "Send a message to a sub-agent: start or continue a named one (agent, title) or "
        "continue a child session by session_id. Returns at once; the result arrives in the "
        "inbox.",
        _object(
            {
                "agent": _text("Declared sub-agent to start or continue."),
                "title": _text("Label of this instance of the sub-agent."),
                "session_id": _text("Child session to continue (instead of agent and title)."),
                "args": {
                    "description": 'The message: a string, or {"input": <message>}.',
                    "anyOf": [{"type": "string"}, {"type": "object"}],
                },
            },
            ("args",),
        ),
        sys_session_send,
    ),
    (
        "sys_session_close",
        "session",
        "Close a sub-agent session of your tree: it is marked closed, its processes are "
        "stopped, and a later send to the same agent and title starts a fresh one.",
        _object({"conversation_id": _text("Id of the child session.")}, ("conversation_id",)),
        sys_session_close,
    ),
    (
        "sys_session_share",
        "session",
        "Share a session with a user (read, edit or manage).",
        _object(
            {
                "session_id": _text("Session to share; default this session."),
                "user_id": _text("User to grant access to."),
                "level": {
                    "type": "string",
                    "enum": ["read", "edit", "manage"],
                    "description": "Access to grant (default read).",
                },
            },
            ("user_id",),
        ),
        sys_session_share,
    ),
    (
        "sys_agent_get",
        "agent",
        "Get the agent behind a session: name, version, harness, MCP servers, policies.",
        _object({"session_id": _SESSION_ID}, ("session_id",)),
        sys_agent_get,
    ),
    (
        "sys_agent_download",
        "agent",
        "Download the agent bundle of a session into the working directory.",
        _object(
            {
                "session_id": _SESSION_ID,
                "dest_filename": _text(
                    "Bare file name to write; default <name>-v<version>.tar.gz."
                ),
            },
            ("session_id",),
        ),
        sys_agent_download,
    ),
    (
        "sys_agent_list",
        "agent",
        "List built-in agents, agents of sessions, and local agent configs.",
        _object({}),
        sys_agent_list,
    ),
    (
        "sys_list_models",
        "session",
        "List the models each sub-agent (and this agent, under 'self') can run: "
        "{source, verified, models: [{id, family}], note} per worker.",
        _object({}),
        sys_list_models,
    ),
    (
        "sys_cancel_task",
        "session",
        "Cancel a background task or a sub-agent's work by its id.",
        _object({"task_id": _text("Handle or child session id.")}, ("task_id",)),
        sys_cancel_task,
    ),
]

#: The session and agent tools, in the order they are advertised.
TOOLS: list[ToolSpec] = [
    ToolSpec(
        name=name,
        description=description,
        parameters=parameters,
        run=run if run is not None else _pending(name),
        family=family,
    )
    for name, family, description, parameters, run in _DEFINITIONS
]

#: The tools of :data:`TOOLS` that work: those the table gives an implementation.
READY: frozenset[str] = frozenset(name for name, *_, run in _DEFINITIONS if run is not None)
#: Tools of :data:`TOOLS` whose server side is not on this runner yet.
PENDING: frozenset[str] = frozenset(tool.name for tool in TOOLS) - READY
