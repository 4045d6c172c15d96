"""Policy rules of the embedded control plane (``[[server.policies]]``), as pure functions.

The first rule whose ``tool`` and ``phase`` patterns both match (``fnmatch``, case-sensitive)
decides; with no match the answer is ALLOW. The same rules answer the runner's
``/policies/evaluate`` (PROTOCOL_FACTS §iii.8) and gate its ``/mcp`` tool calls (§iii.9), so a
rule means one thing wherever a tool call is checked.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any, Literal

import msgspec

from ..config import PolicyRule

__all__ = ["ACTIONS", "TOOL_CALL", "Decision", "decide", "tool_name_of"]

#: The phase of a tool call, as the harness names it.
TOOL_CALL = "PHASE_TOOL_CALL"
#: Rule action → the ``result`` of ``/policies/evaluate``.
ACTIONS = {
    "allow": "POLICY_ACTION_ALLOW",
    "deny": "POLICY_ACTION_DENY",
    "ask": "POLICY_ACTION_ASK",
}


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """What the rules say about one call: the action and the deciding rule's message."""

    action: Literal["allow", "deny", "ask"]
    reason: str | None = None
    #: Index of the deciding rule in ``[[server.policies]]``; None when no rule matched.
    rule: int | None = None

    @property
    def result(self) -> str:
        """The ``POLICY_ACTION_*`` name of the action."""
        return ACTIONS[self.action]


def decide(rules: list[PolicyRule], phase: str, tool: str | None) -> Decision:
    """The first matching rule's decision; ALLOW when none matches.

    A call without a tool name (an LLM-request phase) is matched as the empty name, so only a
    ``tool = "*"`` rule can catch it.
    """
    name = tool or ""
    for index, rule in enumerate(rules):
        if fnmatchcase(name, rule.tool) and fnmatchcase(phase, rule.phase):
            return Decision(action=rule.action, reason=rule.message, rule=index)
    return Decision(action="allow")


def tool_name_of(data: Any) -> str | None:
    """The tool name of an evaluation's ``data``: ``name``, else ``tool_name``, else ``tool``."""
    if not isinstance(data, dict):
        return None
    for key in ("name", "tool_name", "tool"):
        value = data.get(key)
        if isinstance(value, str) and value:
            return value
    return None
