"""The runner-local tool table: which tool names the runner answers itself, and for whom.

Three questions, three answers:

* **Is a name runner-local?** (:func:`is_runner_local`, T-26, T-27) The runner answers
  the ``sys_os_*``, ``sys_terminal_*``, inbox and async tools, ``sys_session_*``,
  ``sys_agent_*``, ``sys_list_models`` and ``sys_cancel_task`` itself; such a name is never
  resolved as a spec-declared callable. ``list_tasks`` is *not* one of them: users may
  define a tool of that name.
* **Which tools run for a session?** (:func:`tool_table`) Every runner-local tool, minus
  the grants the spec does not give: ``sys_terminal_*`` need a non-empty ``terminals:``
  block; ``sys_session_send`` and ``sys_session_close`` need ``tools.agents`` (declared
  sub-agents) or ``spawn: true``; ``sys_session_create`` needs ``spawn: true``. A model
  that calls a tool it was not granted (a prompt injection naming it) gets
  :func:`not_enabled_error`, so a grant is enforced where the call runs, not only where the
  tool is advertised. ``sys_session_share`` and ``sys_list_models`` stay in the table:
  their own first check answers the ungranted call with its specified error (P-05, S-48).
* **What does a harness see?** :func:`tool_schemas` for harnesses that run tools through
  the runner; :func:`relayed_builtins` for native harnesses (``claude-native``,
  ``codex-native``) whose only tool surface is the relay (P-23 to P-27). The relayed set
  never holds the ``sys_os_*`` tools: they travel on a separate, unconditional path
  (P-26).

Grants, read from the spec dict (``spec_to_dict``):

* always: the OS, inbox and async tools, the session reads, the agent tools and
  ``sys_cancel_task``;
* a non-empty ``terminals:`` block: the five ``sys_terminal_*``;
* a non-empty ``tools.agents`` list: ``sys_session_send``, ``sys_session_close`` and
  ``sys_list_models``;
* ``spawn: true``: those three, plus ``sys_session_create``;
* ``agent_session_sharing: non-public`` or ``public``: ``sys_session_share``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Literal, TypedDict

from .._jsonlines import JsonObject
from . import async_calls, os_tools, session_tools, terminals
from ._api import ToolSpec

__all__ = [
    "AGENT_TOOL_NAMES",
    "ALWAYS_RELAYED",
    "ASYNC_TOOL_NAMES",
    "COMMENT_TOOL_NAMES",
    "LOCAL_TOOL_NAMES",
    "OS_TOOL_NAMES",
    "SESSION_READ_TOOL_NAMES",
    "SPAWN_WRITE_TOOL_NAMES",
    "TERMINAL_TOOL_NAMES",
    "all_tools",
    "declares_terminals",
    "grants_send",
    "grants_spawn",
    "is_runner_local",
    "not_enabled_error",
    "not_in_table_error",
    "relayed_builtins",
    "sharing_enabled",
    "tool_schemas",
    "tool_table",
]

OS_TOOL_NAMES = frozenset({"sys_os_read", "sys_os_write", "sys_os_edit", "sys_os_shell"})
TERMINAL_TOOL_NAMES = frozenset(
    {
        "sys_terminal_launch",
        "sys_terminal_send",
        "sys_terminal_read",
        "sys_terminal_list",
        "sys_terminal_close",
    }
)
ASYNC_TOOL_NAMES = frozenset({"sys_call_async", "sys_read_inbox", "sys_cancel_async"})
SESSION_READ_TOOL_NAMES = frozenset(
    {"sys_session_list", "sys_session_get_history", "sys_session_get_info"}
)
AGENT_TOOL_NAMES = frozenset({"sys_agent_get", "sys_agent_download", "sys_agent_list"})
#: Granted by ``tools.agents`` or ``spawn: true``.
_SEND_TOOL_NAMES = frozenset({"sys_session_send", "sys_session_close"})
#: Granted by ``spawn: true`` only.
_CREATE_TOOL_NAMES = frozenset({"sys_session_create"})
#: The spawn-write tools of P-24.
SPAWN_WRITE_TOOL_NAMES = _SEND_TOOL_NAMES | _CREATE_TOOL_NAMES
_LIST_MODELS = "sys_list_models"
_SHARE = "sys_session_share"
_CANCEL_TASK = "sys_cancel_task"
#: Review-comment tools: relayed to native harnesses, answered by the server, not the runner.
COMMENT_TOOL_NAMES = frozenset({"list_comments", "update_comment"})

#: Every tool name the runner answers itself (T-26). ``list_tasks`` is not one (T-27).
LOCAL_TOOL_NAMES: frozenset[str] = (
    OS_TOOL_NAMES
    | TERMINAL_TOOL_NAMES
    | ASYNC_TOOL_NAMES
    | SESSION_READ_TOOL_NAMES
    | AGENT_TOOL_NAMES
    | SPAWN_WRITE_TOOL_NAMES
    | {_LIST_MODELS, _SHARE, _CANCEL_TASK}
)

#: Relayed to native harnesses for every spec (P-23).
ALWAYS_RELAYED: frozenset[str] = (
    AGENT_TOOL_NAMES
    | SESSION_READ_TOOL_NAMES
    | ASYNC_TOOL_NAMES
    | {_CANCEL_TASK}
    | COMMENT_TOOL_NAMES
)


def is_runner_local(name: str) -> bool:
    """Whether the runner answers tool ``name`` itself (T-26, T-27)."""
    return name in LOCAL_TOOL_NAMES


def not_in_table_error(name: str) -> str:
    """The output for a tool that is not runner-local when no agent spec can resolve it."""
    return f"Error: {name} not in local dispatch table (no agent spec)"


def not_enabled_error(name: str) -> str:
    """The output for a runner-local tool the session's spec does not grant."""
    return f"Error: {name} is not enabled for this agent"


# -- grants ---------------------------------------------------------------------------------


def _non_empty(value: object) -> bool:
    return isinstance(value, list | dict) and len(value) > 0


def declares_terminals(spec: Mapping[str, object]) -> bool:
    """Whether the spec has a non-empty ``terminals:`` block (P-27)."""
    return _non_empty(spec.get("terminals"))


def grants_spawn(spec: Mapping[str, object]) -> bool:
    """Whether the spec says ``spawn: true`` (P-24)."""
    return spec.get("spawn") is True


def grants_send(spec: Mapping[str, object]) -> bool:
    """Whether the spec may drive sub-agents: ``tools.agents`` non-empty, or ``spawn: true``."""
    tools = spec.get("tools")
    declared = isinstance(tools, dict) and _non_empty(tools.get("agents"))
    return declared or grants_spawn(spec)


def sharing_enabled(spec: Mapping[str, object]) -> bool:
    """Whether ``agent_session_sharing`` is ``non-public`` or ``public`` (P-05)."""
    return spec.get("agent_session_sharing") in ("non-public", "public")


def _withheld(spec: Mapping[str, object]) -> frozenset[str]:
    """Runner-local tools this spec does not grant."""
    withheld: set[str] = set()
    if not declares_terminals(spec):
        withheld |= TERMINAL_TOOL_NAMES
    if not grants_send(spec):
        withheld |= _SEND_TOOL_NAMES
    if not grants_spawn(spec):
        withheld |= _CREATE_TOOL_NAMES
    return frozenset(withheld)


def relayed_builtins(spec: Mapping[str, object]) -> set[str]:
    """The built-in tools relayed to a native harness for this spec (P-23 to P-27).

    The P-23 set always; ``sys_session_send``/``sys_session_close`` with the send grant and
    ``sys_session_create`` only with ``spawn: true`` (P-24); ``sys_list_models`` exactly when
    ``sys_session_send`` (P-25); the five terminal tools iff ``terminals:`` is non-empty
    (P-27); ``sys_session_share`` when sharing is enabled. Never an OS tool (P-26).
    """
    names = set(ALWAYS_RELAYED)
    if grants_send(spec):
        names |= _SEND_TOOL_NAMES | {_LIST_MODELS}
    if grants_spawn(spec):
        names |= _CREATE_TOOL_NAMES
    if declares_terminals(spec):
        names |= TERMINAL_TOOL_NAMES
    if sharing_enabled(spec):
        names.add(_SHARE)
    return names


# -- the table ------------------------------------------------------------------------------


@functools.cache
def all_tools() -> dict[str, ToolSpec]:
    """Every runner-local tool by name, before any grant is applied.

    Raises:
        RuntimeError: two modules define a tool of the same name.
    """
    table: dict[str, ToolSpec] = {}
    for tool in [*os_tools.TOOLS, *terminals.TOOLS, *async_calls.TOOLS, *session_tools.TOOLS]:
        if tool.name in table:
            raise RuntimeError(f"runner-local tool {tool.name!r} is defined twice")
        table[tool.name] = tool
    return table


def tool_table(spec: Mapping[str, object]) -> dict[str, ToolSpec]:
    """The tools the runner runs for a session with this spec (``{}``: spec unknown)."""
    withheld = _withheld(spec)
    return {name: tool for name, tool in all_tools().items() if name not in withheld}


class FunctionTool(TypedDict):
    """A runner-local tool as a harness is offered it."""

    type: Literal["function"]
    name: str
    description: str
    #: JSON schema of the arguments object.
    parameters: JsonObject


def tool_schemas(spec: Mapping[str, object]) -> list[FunctionTool]:
    """Function-tool schemas for a harness that runs its tools through the runner.

    Each is ``{"type": "function", "name", "description", "parameters"}``. These are the
    tools of :func:`tool_table`, except ``sys_list_models`` without the send grant,
    ``sys_session_share`` without sharing enabled, and tools whose server side is not on
    this runner yet (:data:`corral.tools.session_tools.PENDING`).
    """
    hidden = set(session_tools.PENDING)
    if not grants_send(spec):
        hidden.add(_LIST_MODELS)
    if not sharing_enabled(spec):
        hidden.add(_SHARE)
    return [
        {
            "type": "function",
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        }
        for tool in tool_table(spec).values()
        if tool.name not in hidden
    ]
