"""The read routes a runner's session tools ask, in the shapes of the omnigent 0.19.1 server.

A runner answers ``sys_agent_list``, ``sys_agent_get``, ``sys_session_list`` and
``sys_session_get_info`` by asking its server (T-26). The control plane serves the same
routes as the real server does, so the tools read one shape whichever server they run
against:

======================================  ======================================================
``GET /v1/agents``                      list page of agent objects (``id, object: "agent",
                                        name, version, description, harness, mcp_servers,
                                        policies``); it keeps the ``agents`` key
                                        ``corral agents`` reads
``GET /v1/sessions``                    list page of sessions; ``agent_name`` filters
``GET /v1/sessions/{id}/agent``         the session's agent object
``GET /v1/sessions/{id}/child_sessions`` list page of its child sessions
``GET /v1/runners/{id}/status``         ``{"runner_id", "online"}``
======================================  ======================================================

The children of a session are ``_children.py``'s (a runner's ``sys_session_send`` creates
them, PROTOCOL_0_19.md §J).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .._jsonlines import JsonObject
from ._agents import Agent

__all__ = ["agent_object", "list_page", "policy_summary"]


def list_page(data: Sequence[Mapping[str, Any]], **extra: Any) -> JsonObject:
    """``{"object": "list", "data", "first_id", "last_id", "has_more": false}``: one page
    holding every row (the plane's lists are small)."""
    ids = [row.get("id") for row in data]
    return {
        "object": "list",
        "data": list(data),
        "first_id": ids[0] if ids else None,
        "last_id": ids[-1] if ids else None,
        "has_more": False,
        **extra,
    }


def policy_summary(name: str, path: str) -> JsonObject:
    """One of an agent's policies as the agent object lists it."""
    return {"name": name, "type": "function", "description": path}


def agent_object(agent: Agent) -> JsonObject:
    """An agent as ``GET /v1/agents`` and ``GET /v1/sessions/{id}/agent`` show it."""
    description = agent.spec.extra.get("description")
    servers = agent.spec.extra.get("mcp_servers")
    return {
        "id": agent.agent_id,
        "object": "agent",
        "name": agent.name,
        "version": agent.version,
        "description": description if isinstance(description, str) else None,
        "harness": agent.spec.harness,
        "mcp_servers": [
            {"name": s.get("name"), "transport": s.get("transport")}
            for s in (servers if isinstance(servers, list) else [])
            if isinstance(s, dict)
        ],
        "mcp_servers_editable": False,
        "mcp_registry_editable": False,
        "policies": [policy_summary(p.name, p.path) for p in agent.policies],
        "skills": [],
        "terminals": [],
        "builtin": False,
    }
