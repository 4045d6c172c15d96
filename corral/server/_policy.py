"""Policies of the embedded control plane, as pure functions.

Two sources decide together:

* **Server rules** (``[[server.policies]]``): the first rule whose ``tool`` and ``phase``
  patterns both match (``fnmatch``, case-sensitive) decides; with no match, ALLOW.
* **The agent's own policies** (the spec's ``policies:`` / ``guardrails.policies``, as
  omnigent agent YAMLs write them). The control plane runs no Python from agent files: it
  knows omnigent's builtins listed in :data:`BUILTINS` by their dotted path and maps each to
  what it does. An agent naming any other function is refused when it is loaded
  (:class:`UnknownPolicy`), never served with the policy silently dropped.

As omnigent's engine composes policies, DENY wins over ASK and ASK over ALLOW; the first
asking source gives the reason. The same decision answers the runner's
``/policies/evaluate`` (PROTOCOL_FACTS §iii.8) and gates its ``/mcp`` tool calls (§iii.9), so a
policy means one thing wherever a tool call is checked.
"""

from __future__ import annotations

from collections.abc import Callable
from fnmatch import fnmatchcase
from typing import Any, Literal

import msgspec

from .._exceptions import SpecError
from ..config import PolicyRule
from ..spec import AgentSpec, PolicyRef, agent_policies

__all__ = [
    "ACTIONS",
    "BUILTINS",
    "OS_TOOLS",
    "TOOL_CALL",
    "TOOL_RESULT",
    "AgentPolicy",
    "Decision",
    "UnknownPolicy",
    "combine",
    "decide",
    "policies_of",
    "tool_name_of",
]

#: The phase of a tool call, as the harness names it.
TOOL_CALL = "PHASE_TOOL_CALL"
#: The phase of a tool's result.
TOOL_RESULT = "PHASE_TOOL_RESULT"
#: Rule action → the ``result`` of ``/policies/evaluate``.
ACTIONS = {
    "allow": "POLICY_ACTION_ALLOW",
    "deny": "POLICY_ACTION_DENY",
    "ask": "POLICY_ACTION_ASK",
}
_STRICTNESS = {"allow": 0, "ask": 1, "deny": 2}
#: The runner's file and shell tools: the ones omnigent's ``ask_on_os_tools`` gates under
#: these names (it also lists other harnesses' native names, which corral's never use).
OS_TOOLS = frozenset({"sys_os_read", "sys_os_write", "sys_os_edit", "sys_os_shell"})


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """What the policies say about one call: the action, the deciding reason, and where it
    came from.

    ``prompt`` is the whole approval message when an agent policy asks (omnigent shows
    ``"<policy>: <reason>"``); a server rule's ask is worded by the ``/mcp`` gate.
    """

    action: Literal["allow", "deny", "ask"]
    reason: str | None = None
    #: Index of the deciding rule in ``[[server.policies]]``; None when no rule decided.
    rule: int | None = None
    #: Name of the deciding agent policy; None when none decided.
    policy: str | None = None
    prompt: str | None = None

    @property
    def result(self) -> str:
        """The ``POLICY_ACTION_*`` name of the action."""
        return ACTIONS[self.action]


class UnknownPolicy(SpecError):
    """An agent names a policy function the control plane does not know."""


#: ``check(phase, tool, arguments) -> Decision | None`` (None: the policy abstains).
Check = Callable[[str, str | None, Any], Decision | None]


class AgentPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """One of an agent's policies, bound to the builtin it names."""

    name: str
    path: str
    check: Check


def decide(rules: list[PolicyRule], phase: str, tool: str | None) -> Decision:
    """The first matching server rule's decision; ALLOW when none matches.

    A call without a tool name (an LLM-request phase) is matched as the empty name, so only a
    ``tool = "*"`` rule can catch it.
    """
    name = tool or ""
    for index, rule in enumerate(rules):
        if fnmatchcase(name, rule.tool) and fnmatchcase(phase, rule.phase):
            return Decision(action=rule.action, reason=rule.message, rule=index)
    return Decision(action="allow")


def combine(
    server: Decision, policies: list[AgentPolicy], phase: str, tool: str | None, arguments: Any
) -> Decision:
    """The server rules' decision and the agent's policies together: the strictest wins,
    the first of equal strictness gives the reason (server rules first)."""
    decision = server
    for policy in policies:
        if decision.action == "deny":
            break
        verdict = policy.check(phase, tool, arguments)
        if verdict is not None and _STRICTNESS[verdict.action] > _STRICTNESS[decision.action]:
            decision = msgspec.structs.replace(verdict, policy=policy.name)
    if decision.policy is not None and decision.action == "ask" and decision.reason:
        decision = msgspec.structs.replace(decision, prompt=f"{decision.policy}: {decision.reason}")
    return decision


def policies_of(spec: AgentSpec) -> list[AgentPolicy]:
    """The agent's policies bound to the builtins they name, in declaration order.

    Raises:
        UnknownPolicy: a policy names a function that is not in :data:`BUILTINS`, or gives
            arguments to one that takes none; the message names the policy and the function.
        SpecError: a policy is malformed (see :func:`corral.spec.agent_policies`).
    """
    return [_bind(ref) for ref in agent_policies(spec)]


def _bind(ref: PolicyRef) -> AgentPolicy:
    check = BUILTINS.get(ref.path)
    if check is None:
        known = ", ".join(sorted(BUILTINS))
        raise UnknownPolicy(
            f"policy {ref.name!r} calls {ref.path!r}, which this control plane cannot run "
            f"(it runs no code from agent files; it knows: {known})",
            path=ref.where,
        )
    if ref.arguments:
        raise UnknownPolicy(f"policy {ref.name!r}: {ref.path!r} takes no arguments", path=ref.where)
    return AgentPolicy(name=ref.name, path=ref.path, check=check)


def ask_on_os_tools(phase: str, tool: str | None, arguments: Any) -> Decision | None:
    """omnigent's ``safety.ask_on_os_tools``: ASK before a file or shell tool call.

    Only the tool-call phase, only :data:`OS_TOOLS`; the reason names the call with a short
    preview (the command of a shell, the path of a file tool), in omnigent's words.
    """
    if phase != TOOL_CALL or tool not in OS_TOOLS:
        return None
    args = arguments if isinstance(arguments, dict) else {}
    key = "command" if tool == "sys_os_shell" else "path"
    preview = args.get(key) or ""
    return Decision(action="ask", reason=f"Agent wants to call {tool}({preview!r}). Approve?")


#: omnigent builtin policies this control plane can run, by the dotted path agents name.
BUILTINS: dict[str, Check] = {
    "omnigent.policies.builtins.safety.ask_on_os_tools": ask_on_os_tools,
}


def tool_name_of(data: Any, request_data: Any = None, target: str | None = None) -> str | None:
    """The tool name of an evaluation: ``request_data.name`` or ``target`` (how a tool result
    names its call, §F.2), else ``data``'s ``name``, ``tool_name`` or ``tool``."""
    named = request_data.get("name") if isinstance(request_data, dict) else None
    if isinstance(named, str) and named:
        return named
    if isinstance(target, str) and target:
        return target
    if not isinstance(data, dict):
        return None
    for key in ("name", "tool_name", "tool"):
        value = data.get(key)
        if isinstance(value, str) and value:
            return value
    return None
