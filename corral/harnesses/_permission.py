"""A coding-agent CLI asks to run one of its own tools: corral's policy, then a person.

Claude Code, Codex and pi run their tools themselves (a shell command, a file edit); corral
sees the call only when the CLI asks permission for it (docs/harnesses.md). Every such
request is decided here, the same way for every kind:

1. **Policy** — a ``PHASE_TOOL_CALL`` evaluation (``policy_evaluation.requested``, answered
   by the policy actor from the server's policies; PROTOCOL_0_19 §F): a ``DENY`` refuses the
   call without asking anyone and publishes ``response.policy_denied``; a verdict the runner
   could not get refuses it too (fail closed, P-03).
2. **A person** — otherwise the request becomes a corral elicitation
   (``response.elicitation_request``, parked until the server's approval event, visible in
   ``corral elicitations``): the CLI asked, so a person decides. An ``ASK`` handed back by a
   server that does not hold it is asked the same way, once. A kind whose agent is configured
   to run without asking (``ask_person=False``) takes ``ALLOW`` as the answer.

Known limit: a server that holds an ``ASK`` until a person answers (the real 0.19.1 server
does, §F.3) answers ``ALLOW`` once they accepted, and the CLI's request is then put to a
person a second time, since an ``ALLOW`` after a held prompt looks like any other.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from ._turn import APPROVAL_SCHEMA, TurnContext
from .protocol import PolicyDenied

TOOL_CALL = "PHASE_TOOL_CALL"
POLICY_FAILED = "The policy check failed, so the tool call was not run."
DECLINED = "The user declined this tool call."
#: How much of the arguments the prompt quotes.
PREVIEW_CHARS = 200


@dataclass(frozen=True, slots=True)
class Decision:
    """Whether the CLI may run the call; ``reason`` is what the model is told when not."""

    allowed: bool
    reason: str = ""
    #: The person's answer's content, when one answered (a kind may pass edits on).
    content: dict[str, Any] | None = None


async def decide(
    turn: TurnContext,
    *,
    tool: str,
    arguments: dict[str, Any],
    call_id: str | None = None,
    ask_person: bool = True,
) -> Decision:
    """Decide a CLI's request to run ``tool`` with ``arguments`` (see the module docstring)."""
    call_id = call_id or f"call_{uuid.uuid4().hex[:12]}"
    data = {"name": tool, "arguments": arguments, "call_id": call_id}
    verdict = await turn.policy(TOOL_CALL, data)
    if verdict.failed:
        return Decision(False, POLICY_FAILED)
    action = verdict.action.upper().removeprefix("POLICY_ACTION_")
    if action == "DENY":
        reason = verdict.reason or "no reason given"
        await turn.emit(
            PolicyDenied(conversation_id=turn.session_id, reason=reason, phase="tool_call")
        )
        return Decision(False, f"The tool call was denied by policy: {reason}")
    if action != "ASK" and not ask_person:
        return Decision(True)
    preview = json.dumps(arguments, ensure_ascii=False)
    if len(preview) > PREVIEW_CHARS:
        preview = preview[:PREVIEW_CHARS] + "…"
    message = (verdict.reason if action == "ASK" else None) or (
        f"The agent wants to run {tool}({preview}). Approve?"
    )
    answer = await turn.elicit(
        {
            "message": message,
            "requestedSchema": APPROVAL_SCHEMA,
            "phase": "tool_call",
            "tool": {"name": tool, "call_id": call_id, "arguments": arguments},
        }
    )
    if answer.accepted:
        return Decision(True, content=answer.content)
    return Decision(False, DECLINED)
