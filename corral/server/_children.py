"""Child sessions: the server side of a runner's ``sys_session_send`` (PROTOCOL_0_19.md §J).

A runner gives a sub-agent work by asking its server, so the control plane answers the same
calls as the real omnigent 0.19.1 server:

======================================  ======================================================
``POST /v1/sessions`` (the runner's)    creates a child: ``agent_id`` (the parent's bundle),
                                        ``parent_session_id``, ``title`` (``<agent>:<label>``),
                                        ``sub_agent_name``, ``labels``; 201 with the session;
                                        bound to the same runner at once
``GET /v1/sessions/{id}/child_sessions`` list page of §J step 8 rows; ``tool``,
                                        ``session_name``, ``limit``, ``order`` filter
======================================  ======================================================

A child runs its parent's agent: it is served the parent's whole bundle and its init names
the sub-agent (``sub_agent_name``), whose ``agents/<name>/config.yaml`` the runner runs —
as the real server serves a child (``GET .../agent/contents`` is the parent agent's). A
``sub_agent_name`` the parent agent does not declare is refused (422), as there. The
runner's other calls (its first message to the child, the parent's wake) are ordinary
``POST .../events`` messages.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Annotated, Any

import msgspec

from .._jsonlines import JsonObject
from ._conversation import new_id
from ._discovery import list_page
from ._plane import ControlPlane, Refused
from ._store import SessionRow

__all__ = [
    "CLOSED_LABEL",
    "CLOSED_TITLE_INFIX",
    "CreateChild",
    "child_page",
    "child_row",
    "create_child",
    "is_closed",
]

#: What ``sys_session_close`` writes on a child (S-29).
CLOSED_LABEL = "omnigent.closed"
CLOSED_TITLE_INFIX = ":closed:"
#: S-22 as a child row shows its session's status.
_TASK_STATUS = {"running": "in_progress", "waiting": "in_progress", "idle": "completed"}


class CreateChild(msgspec.Struct, kw_only=True):
    """The runner's ``POST /v1/sessions`` (§J step 2)."""

    parent_session_id: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    sub_agent_name: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    agent_id: str | None = None
    title: Annotated[str, msgspec.Meta(max_length=1000)] | None = None
    labels: dict[str, str] = {}


async def create_child(plane: ControlPlane, raw: Any) -> SessionRow:
    """Create a child session of ``raw["parent_session_id"]`` and bind it to the runner.

    Raises:
        Refused: 422 for a body not of §J's shape or a sub-agent the parent's agent does not
            declare, 404 for an unknown parent or agent.
    """
    try:
        body = msgspec.convert(raw, CreateChild)
    except msgspec.ValidationError as exc:
        raise Refused(422, "invalid_request", str(exc).replace("`", "")) from None
    parent = await plane.session(body.parent_session_id)
    agents = await plane.agents()
    agent = next((a for a in agents.values() if a.agent_id == body.agent_id), None)
    agent = agent or agents.get(parent.agent)
    if agent is None:
        raise Refused(404, "unknown_agent", f"The agent of session {parent.id!r} is not loaded.")
    if body.sub_agent_name not in agent.sub_agents:
        raise Refused(
            422,
            "invalid_request",
            f"Sub-agent not declared in parent spec: {body.sub_agent_name!r}",
        )
    now = time.time()
    row = SessionRow(
        id=new_id(),
        agent=agent.name,
        agent_id=agent.agent_id,
        agent_yaml=agent.yaml_text,
        runner_id=parent.runner_id or plane.runner_id,
        title=body.title,
        labels=dict(body.labels),
        created_at=now,
        updated_at=now,
        parent_session_id=parent.id,
        sub_agent_name=body.sub_agent_name,
    )
    stored = await plane.store.create_session(row)
    plane.bind_child(stored.id)
    return stored


def _tool_and_label(row: SessionRow) -> tuple[str | None, str | None]:
    """The sub-agent and instance label of a child: its ``sub_agent_name`` and the title after
    ``<agent>:`` (a ``sys_session_send`` child), else both read off an ``<agent>:<name>`` title
    (``ui:<agent>:<name>`` too: a ``sys_session_create`` child)."""
    title = row.title or ""
    if row.sub_agent_name:
        prefix = f"{row.sub_agent_name}:"
        return row.sub_agent_name, title[len(prefix) :] if title.startswith(prefix) else title
    tool, _, name = title.partition(":")
    if tool == "ui" and ":" in name:
        tool, _, name = name.partition(":")
    return (tool, name) if name else (None, None)


def is_closed(row: SessionRow) -> bool:
    """Closed by ``sys_session_close`` (its label, or its tombstone title)."""
    return row.labels.get(CLOSED_LABEL) == "true" or CLOSED_TITLE_INFIX in (row.title or "")


def child_row(row: SessionRow) -> JsonObject:
    """One row of ``GET .../child_sessions`` (§J step 8)."""
    # A child whose runner has reported nothing yet is still launching.
    status = "launching" if row.last_event_id == 0 else _TASK_STATUS.get(row.status, row.status)
    tool, label = _tool_and_label(row)
    return {
        "id": row.id,
        "object": "child_session",
        "parent_session_id": row.parent_session_id,
        "title": row.title,
        "task_summary": None,
        "tool": tool,
        "session_name": label,
        "kind": "sub_agent",
        "created_at": int(row.created_at),
        "updated_at": int(row.updated_at),
        "agent_id": row.agent_id,
        "agent_name": row.sub_agent_name or row.agent,
        "current_task_id": None,
        "current_task_status": status,
        "busy": row.status in ("running", "waiting"),
        "labels": row.labels,
    }


def _limit(query: Mapping[str, str]) -> int:
    text = query.get("limit", "100")
    if not text.isdigit() or len(text) > 9:
        raise Refused(422, "invalid_request", "limit must be an integer.")
    return max(1, min(int(text), 1000))


async def child_page(plane: ControlPlane, parent_id: str, query: Mapping[str, str]) -> JsonObject:
    """``GET .../child_sessions?limit&order&tool&session_name``: the parent's children.

    Raises:
        Refused: 404 for an unknown parent, 422 for a bad ``limit`` or ``order``.
    """
    await plane.session(parent_id)
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise Refused(422, "invalid_request", "order must be 'asc' or 'desc'.")
    tool, name = query.get("tool"), query.get("session_name")
    # Filtered before the limit: ``limit=1&tool=x&session_name=y`` is the runner's reuse check.
    rows = await plane.store.list_children(parent_id, 1000, newest_first=order == "desc")
    # A closed child is left out, as the real server leaves out an archived one (a named
    # send then makes a fresh child).
    found = [
        child_row(r)
        for r in rows
        if not is_closed(r)
        and (tool is None or _tool_and_label(r)[0] == tool)
        and (name is None or _tool_and_label(r)[1] == name)
    ]
    return list_page(found[: _limit(query)])
