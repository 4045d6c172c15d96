"""``sys_cancel_task``: stop a background call or a sub-agent's work (S-49..S-52).

The id is looked up where the runner keeps work, in this order (S-52): the session's own
background calls (``sys_call_async`` handles), then the sub-agent work registry in dispatch,
by child session id — only the caller's work: another session's child, or an id nobody
knows, is ``Error: no in-flight task with task_id <id>``. Work that has already ended answers
its status and nothing is posted.

Open sub-agent work is stopped through the child's server, as its harness allows:

* a child whose create answer carried the wrapper label ``claude-code-native-ui`` (a Claude
  Code terminal) gets a hard stop, ``{"type": "stop_session", "data": {}}`` (``data`` is
  required: older servers refuse a bare control event), and its work ends ``cancelled`` at
  once (S-49); a completion that comes later is ignored by the registry;
* ``codex-native-ui`` gets an interrupt, best effort: nothing confirms it (S-50);
* any other child (in-process harnesses, corral's own) is interrupted, never stopped, since
  those runners take a stop as a no-op (S-51); its interrupted turn then ends ``cancelled``
  and the result reaches the parent's inbox like any other.
"""

from __future__ import annotations

import json

from .._exceptions import ServerError, ServerRejected
from .._jsonlines import JsonObject
from ._api import ToolContext, ToolError
from .server_reads import SessionSnapshot, read, server_of, session_path

__all__ = ["sys_cancel_task"]

TOOL = "sys_cancel_task"
#: The label a child's create answer carries for a native CLI wrapper.
WRAPPER_LABEL = "omnigent.wrapper"
CLAUDE_NATIVE, CODEX_NATIVE = "claude-code-native-ui", "codex-native-ui"
TERMINAL = frozenset({"completed", "failed", "cancelled"})
BEST_EFFORT = (
    "Interrupt forwarded, but a runner-side hard-stop is not wired for codex-native workers "
    "yet; the child may keep running and no terminal inbox status is guaranteed."
)
REQUESTED = (
    "Cancel requested; cancellation has not been confirmed yet. Use sys_read_inbox to observe "
    "terminal status."
)


def _dumps(value: object) -> str:
    return json.dumps(value)


async def sys_cancel_task(ctx: ToolContext, args: JsonObject) -> str:
    """Cancel ``task_id`` (``handle_id`` too): a background call, else the caller's
    sub-agent work (S-52)."""
    task = args.get("task_id") or args.get("handle_id")
    if not isinstance(task, str) or not task:
        raise ToolError(f"{TOOL} requires 'task_id': a handle or a child session id")
    if ctx.async_calls is not None:
        answer = await ctx.async_calls.cancel(ctx.session_id, task)
        if answer.get("status") != "unknown":
            return _dumps(answer)
    if ctx.cancel_work is None:
        raise ToolError(f"{TOOL}: this runner cannot track sub-agent work here")
    found, status = await ctx.cancel_work(task, False)
    if not found:
        return f"Error: no in-flight task with task_id {task}"
    if status in TERMINAL:
        return _dumps({"cancelled": status == "cancelled", "task_id": task, "status": status})
    server = server_of(ctx, TOOL)
    snapshot = await read(server, TOOL, session_path(task), SessionSnapshot)
    wrapper = (snapshot.labels or {}).get(WRAPPER_LABEL)
    control = "stop_session" if wrapper == CLAUDE_NATIVE else "interrupt"
    try:
        await server.post_event(task, {"type": control, "data": {}})
    except ServerRejected as exc:
        raise ToolError(f"{TOOL}: the server refused the {control} ({exc.status})") from None
    except ServerError:
        raise ToolError(f"{TOOL}: the server could not be reached") from None
    if wrapper == CLAUDE_NATIVE:
        _found, status = await ctx.cancel_work(task, True)
        return _dumps({"cancelled": True, "task_id": task, "status": status or "cancelled"})
    if wrapper == CODEX_NATIVE:
        return _dumps(
            {
                "cancel_requested": True,
                "cancel_confirmed": False,
                "best_effort": True,
                "task_id": task,
                "status": status,
                "message": BEST_EFFORT,
            }
        )
    return _dumps(
        {
            "cancel_requested": True,
            "cancel_confirmed": False,
            "task_id": task,
            "status": status,
            "message": REQUESTED,
        }
    )
