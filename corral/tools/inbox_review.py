"""The tool-result policy on a sub-agent's delayed output, applied when the inbox is drained
(BEHAVIOURS.md P-01..P-04).

A child's answer reaches its parent's model through ``sys_read_inbox``, long after the
``sys_session_send`` call it belongs to returned: the server's ``PHASE_TOOL_RESULT`` policies
see it then. Each drained ``sub_agent`` item that ``completed`` or ``failed`` is evaluated
exactly once (P-01) — a drain answered again for the same call id is the recorded text, not
a second evaluation — with the body the 0.19.1 server validates (§F.2), naming the call it
answers::

    {"event": {"type": "PHASE_TOOL_RESULT", "target": "sys_session_send",
               "request_data": {"name": "sys_session_send", "tool": "sys_session_send",
                                "arguments": A, "args": A},
               "data": {"result": <the child's raw output>}}}

with ``A = {"agent", "title", "conversation_id": <child>}``. The verdict (P-02): DENY, and
ASK (no one can be asked about a result already produced), render ``[Result suppressed by
policy: <reason or "no reason given">]``; ALLOW with ``data`` renders that data in place of
the output; anything else leaves it. A failed evaluation — no server, a transport error, an
error status, an answer with no known action — **fails closed** (P-03): the model sees
``[Result suppressed by policy: policy evaluation failed]`` and the original item stays
queued, so a later drain evaluates it again. Cancelled items have no output and other items
are not tool results: neither is evaluated (P-04).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

from .._exceptions import ServerError
from ._api import ToolContext
from .inbox import Review, Reviewed

__all__ = ["EVALUATION_FAILED", "subagent_review", "suppressed"]

log = logging.getLogger("corral.tools.inbox")

TOOL_RESULT = "PHASE_TOOL_RESULT"
SEND = "sys_session_send"
EVALUATION_FAILED = "policy evaluation failed"
_ACTIONS = ("ALLOW", "DENY", "ASK", "UNSPECIFIED")


def suppressed(reason: str) -> str:
    """P-02: what the model sees of an output a policy withheld."""
    return f"[Result suppressed by policy: {reason}]"


class _NoVerdict(Exception):
    """The evaluation gave no usable verdict (P-03)."""


def _verdict(answer: object) -> tuple[str, str | None, object]:
    """``(action, reason, data)`` of a ``/policies/evaluate`` answer.

    Raises:
        _NoVerdict: it names no known action.
    """
    if not isinstance(answer, dict):
        raise _NoVerdict("the answer is not an object")
    raw = answer.get("result", answer.get("action"))
    action = raw.upper().removeprefix("POLICY_ACTION_") if isinstance(raw, str) else None
    if action not in _ACTIONS:
        raise _NoVerdict(f"unknown action {raw!r}")
    reason = answer.get("reason")
    return action, reason if isinstance(reason, str) and reason else None, answer.get("data")


def subagent_review(ctx: ToolContext) -> Review:
    """The drain's review of the caller's inbox items: the policy on sub-agent output."""

    async def review(item: Mapping[str, object]) -> Reviewed | None:
        if item.get("type") != "sub_agent" or item.get("status") not in ("completed", "failed"):
            return None  # P-04
        output = item.get("output")
        arguments = {
            "agent": item.get("agent"),
            "title": item.get("title"),
            "conversation_id": item.get("conversation_id"),
        }
        body = {
            "event": {
                "type": TOOL_RESULT,
                "target": SEND,
                "request_data": {
                    "name": SEND,
                    "tool": SEND,
                    "arguments": arguments,
                    "args": arguments,
                },
                "data": {"result": output if isinstance(output, str) else json.dumps(output)},
            }
        }
        try:
            if ctx.server is None:
                raise _NoVerdict("no server connection")
            action, reason, data = _verdict(await ctx.server.evaluate_policy(ctx.session_id, body))
        except (ServerError, _NoVerdict) as exc:
            log.warning(
                "session %s: the policy on sub-agent output %s could not be evaluated (%s); "
                "kept for the next drain",
                ctx.session_id,
                item.get("work_id"),
                exc,
            )
            return Reviewed({**item, "output": suppressed(EVALUATION_FAILED)}, keep=True)
        if action in ("DENY", "ASK"):
            return Reviewed({**item, "output": suppressed(reason or "no reason given")})
        if action == "ALLOW" and data is not None:
            shown = data if isinstance(data, str) else json.dumps(data)
            return Reviewed({**item, "output": shown})
        return None

    return review
