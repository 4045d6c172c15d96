"""``sys_session_send``: give a sub-agent work, in a child session, and return at once.

The tool runs in the runner (T-26) and asks the session's server with the calls omnigent
0.19.1's own runner makes (PROTOCOL_0_19.md §J), so it works on the real server and on the
embedded control plane alike:

* **Named mode** ``{"agent", "title", "args"}`` (S-01..S-06): the caller's snapshot, then
  ``GET .../child_sessions?limit=1&order=desc&tool=<agent>&session_name=<title>``; an open
  child that matches is continued — never a second one (S-03) — else exactly one
  ``POST /v1/sessions`` creates it (S-06: ``agent_id`` of the caller's bundle,
  ``parent_session_id``, title ``<agent>:<title>``, ``sub_agent_name``, the dispatch id label).
* **By-id mode** ``{"session_id", "args"}`` (S-11..S-13, P-19): only a direct child of the
  caller, and not a closed one; refusals are answers, and nothing is posted then.
* Both modes (P-17: never both) register the work with dispatch (``ctx.register_work``), whose
  registry delivers the child's result to the caller's inbox exactly once
  (``corral.actors.dispatch._subagents``), publish the child's ``launching`` state on the
  caller's stream (S-05; a new child's ``session.created`` first), post the message to
  ``POST /v1/sessions/{child}/events`` and return the handle with status ``launching``
  (S-04): the child's answer is never in it.

``args`` is the message: a string, or ``{"input": <text>}``; ``message`` is taken too.
``args.model`` asks for the child's model (``model_override`` in the create body), checked by
:mod:`corral.tools.send_gates` before anything reaches the server: its shape before any
request (P-09), refused by id before the lookup (P-10), and after the lookup refused for an
existing child (P-11), a harness with no override plumbing or of another family (P-12..P-14),
then spelled for the child's provider (P-15). A fresh dispatch to a harness whose CLI is not
on this host (:mod:`corral.clis`) is refused before the create (S-08; :data:`CLI_PROBE` is
the probe, S-09).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from typing import Any

from .. import clis
from .._exceptions import ServerError, ServerRejected
from .._jsonlines import JsonObject
from ._api import ToolContext, ToolError
from .send_gates import (
    ModelError,
    check_model,
    harness_of,
    localise_model,
    missing_cli,
    model_refusal,
    provider_kind,
    sub_agent,
)
from .server_reads import (
    ChildRow,
    Page,
    ReadFailed,
    SessionSnapshot,
    read,
    rows,
    server_of,
    session_path,
)
from .session_reads import CLOSED_LABEL, CLOSED_TITLE_INFIX, agent_and_title

__all__ = ["BOTH_MODES", "dispatch_id", "sys_session_send"]

TOOL = "sys_session_send"
#: P-17: both addressing modes in one call.
BOTH_MODES = (
    "Error: sys_session_send received both 'session_id' and 'agent'/'title' — supply exactly "
    "one addressing mode"
)
NOT_A_CHILD = (
    "target is not a direct child of the calling session; sys_session_send by session_id is "
    "child-only."
)
#: The label a created child carries (§J step 2).
DISPATCH_LABEL = "omnigent.subagent.dispatch_id"
#: How a fresh dispatch looks for its harness's CLI (S-08); tests stand in for it (S-09).
CLI_PROBE: Callable[[str], str | None] = clis.find


def dispatch_id() -> str:
    """A new dispatch id, ``subagent_<12 hex>`` (§J step 2)."""
    return f"subagent_{secrets.token_hex(6)}"


def _text(args: JsonObject, name: str) -> str | None:
    value = args.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ToolError(f"{TOOL}: '{name}' must be a string")
    return value


def _message(args: JsonObject) -> str:
    """S-01: ``args`` as a string or ``{"input": ...}`` (``message`` as a fallback)."""
    raw: Any = args.get("args", args.get("message"))
    if isinstance(raw, dict):
        raw = raw.get("input")
    if not isinstance(raw, str) or not raw.strip():
        raise ToolError(f"{TOOL} requires 'args': the message, a string or {{\"input\": ...}}")
    return raw


def _model(args: JsonObject) -> str | None:
    """``args.model`` checked for shape (P-09); None when not asked for.

    Raises:
        ModelError: a malformed model id.
    """
    raw: Any = args.get("args")
    return check_model(raw.get("model") if isinstance(raw, dict) else None)


def _closed(labels: dict[str, Any] | None, title: str | None) -> bool:
    closed = (labels or {}).get(CLOSED_LABEL[0]) == CLOSED_LABEL[1]
    return closed or CLOSED_TITLE_INFIX in (title or "")


def _matches(row: ChildRow, agent: str, title: str) -> bool:
    """S-02: rows carry ``tool``/``session_name``, or only the ``<agent>:<title>`` title."""
    return (row.tool, row.session_name) == (agent, title) or row.title == f"{agent}:{title}"


def _dumps(value: object) -> str:
    return json.dumps(value)


async def sys_session_send(ctx: ToolContext, args: JsonObject) -> str:
    """Start or continue a sub-agent; its result arrives in the inbox (S-01..S-06, S-11..S-13,
    P-17, P-19)."""
    target = _text(args, "session_id")
    agent, title = _text(args, "agent"), _text(args, "title")
    if target is not None and (agent is not None or title is not None):
        raise ToolError(BOTH_MODES)
    message = _message(args)
    try:
        model = _model(args)
    except ModelError as exc:
        return exc.line
    if target is not None:
        if model is not None:
            return model_refusal(model, mode="by_id", harness=None) or ""
        return await _send_by_id(ctx, target, message)
    if agent is None or title is None:
        raise ToolError(f"{TOOL} requires 'agent' and 'title' (or a child's 'session_id')")
    _check_declared(ctx, agent)
    return await _send_named(ctx, agent, title, message, model)


def _check_declared(ctx: ToolContext, agent: str) -> None:
    """The spec's ``tools.agents`` names the sub-agents this agent may start."""
    tools = ctx.spec.get("tools")
    declared = tools.get("agents") if isinstance(tools, dict) else None
    if isinstance(declared, list) and declared and agent not in declared:
        names = ", ".join(str(a) for a in declared)
        raise ToolError(f"{TOOL}: '{agent}' is not a sub-agent of this agent (declared: {names})")


async def _send_named(
    ctx: ToolContext, agent: str, title: str, message: str, model: str | None
) -> str:
    server = server_of(ctx, TOOL)
    caller = await read(server, TOOL, session_path(ctx.session_id), SessionSnapshot)
    params = {
        "limit": "1",
        "order": "desc",
        "tool": agent,
        "session_name": title,
    }
    page = await read(server, TOOL, f"{session_path(ctx.session_id)}/child_sessions", Page, params)
    found = [
        row
        for row in rows(page, ChildRow) or []
        if _matches(row, agent, title) and not _closed(row.labels, row.title)
    ]
    sub_agents = ctx.spec.get("sub_agents")
    harness = harness_of(sub_agents, agent)
    if model is not None:
        existing = found[0].id if found else None
        refusal = model_refusal(model, mode="named", harness=harness, existing_child=existing)
        if refusal is not None:
            return refusal
    work = dispatch_id()
    events: list[JsonObject] = []
    if found:
        child = found[0].id
    else:
        missing = missing_cli(agent, harness, which=CLI_PROBE)
        if missing is not None:
            return missing
        body = {
            "agent_id": caller.agent_id,
            "parent_session_id": ctx.session_id,
            "title": f"{agent}:{title}",
            "sub_agent_name": agent,
            "labels": {DISPATCH_LABEL: work},
        }
        if model is not None:
            executor = (sub_agent(sub_agents, agent) or {}).get("executor")
            auth = executor.get("auth") if isinstance(executor, dict) else None
            kind = provider_kind(auth if isinstance(auth, dict) else None)
            body["model_override"] = localise_model(model, kind)
        try:
            created = await server.create_session(body)
        except ServerRejected as exc:
            raise ToolError(
                f"{TOOL}: the server refused to create the child ({exc.status})"
            ) from None
        except ServerError:
            raise ToolError(f"{TOOL}: the server could not be reached") from None
        child_id = created.get("id") or created.get("session_id")
        if not isinstance(child_id, str) or not child_id:
            raise ToolError(f"{TOOL}: the server's answer was not understood")
        child = child_id
        events.append(
            {
                "sequence_number": None,
                "type": "session.created",
                "conversation_id": ctx.session_id,
                "child_session_id": child,
                "agent_id": caller.agent_id,
                "parent_session_id": ctx.session_id,
            }
        )
    return await _dispatch(ctx, work, child, agent, title, message, events)


async def _send_by_id(ctx: ToolContext, target: str, message: str) -> str:
    server = server_of(ctx, TOOL)
    try:
        snap = await read(server, TOOL, session_path(target), SessionSnapshot)
    except ReadFailed as exc:
        if exc.status == 404:
            return _dumps({"error": "session_not_found", "conversation_id": target})
        if exc.status in (401, 403):
            return _dumps(
                {"error": "session_out_of_tree", "conversation_id": target, "message": NOT_A_CHILD}
            )
        raise
    if snap.parent_session_id != ctx.session_id:
        return _dumps(
            {"error": "session_out_of_tree", "conversation_id": target, "message": NOT_A_CHILD}
        )
    if _closed(snap.labels, snap.title):
        return _dumps(
            {
                "error": "session_closed",
                "conversation_id": target,
                "message": "the child session is closed; start a new one by agent and title.",
            }
        )
    agent, title = agent_and_title(snap.title)
    agent = snap.sub_agent_name or agent or "sub-agent"
    return await _dispatch(ctx, dispatch_id(), target, agent, title or target, message, [])


async def _dispatch(
    ctx: ToolContext,
    work: str,
    child: str,
    agent: str,
    title: str,
    message: str,
    events: list[JsonObject],
) -> str:
    """Register the work, tell the caller's stream, post the message; the handle (S-04)."""
    if ctx.register_work is None:
        raise ToolError(f"{TOOL}: this runner cannot track sub-agent work here")
    # Before the message: the child's turn cannot end before its parent waits for it.
    await ctx.register_work(work, child, agent, title, False)
    events.append(
        {
            "type": "session.child_session.updated",
            "conversation_id": ctx.session_id,
            "child_session_id": child,
            "child": {
                "id": child,
                "title": f"{agent}:{title}",
                "tool": agent,
                "session_name": title,
                "busy": False,
                "current_task_status": "launching",
            },
        }
    )
    for event in events:
        await ctx.publish(event)
    body = {
        "type": "message",
        "data": {"role": "user", "content": [{"type": "input_text", "text": message}]},
    }
    server = server_of(ctx, TOOL)
    try:
        await server.post_event(child, body, idempotency_key=f"{work}-message")
    except ServerError as exc:
        # No result will come: the entry is closed, and this error is what the caller sees.
        await ctx.register_work(work, child, agent, title, True)
        if isinstance(exc, ServerRejected):
            raise ToolError(
                f"{TOOL}: the server refused the child's message ({exc.status})"
            ) from None
        raise ToolError(f"{TOOL}: the server could not be reached") from None
    return _dumps(
        {
            "task_id": child,
            "handle_id": child,
            "conversation_id": child,
            "kind": "sub_agent",
            "agent": agent,
            "title": title,
            "status": "launching",
            "message": (
                f"[System: sub-agent {agent} title '{title}' launching as task {child}. Result "
                "will appear in your inbox; call sys_read_inbox to check or sys_cancel_task to "
                "interrupt it.]"
            ),
        }
    )
