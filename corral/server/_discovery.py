"""The read routes a runner's session tools ask, in the shapes of the omnigent 0.19.1 server.

A runner answers ``sys_agent_list``, ``sys_agent_get``, ``sys_session_list`` and
``sys_session_get_info`` by asking its server (T-26). The control plane serves the same
routes as the real server does, so the tools read one shape whichever server they run
against:

======================================  ======================================================
``GET /v1/agents``                      list page of agent objects (``id, object: "agent",
                                        name, version, description, harness, mcp_servers,
                                        policies``); it keeps the ``agents`` key
                                        ``corral agents`` reads, and ``invalid``: the
                                        agent files not served (``path, name, error,
                                        problems``)
``GET /v1/sessions``                    list page of sessions; ``agent_name`` filters
``GET /v1/sessions/{id}/agent``         the session's agent object
``GET /v1/sessions/{id}/child_sessions`` list page of its child sessions (``_session_writes``)
``GET /v1/runners/{id}/status``         ``{"runner_id", "online"}``
======================================  ======================================================

Each route lets in the runner and clients alike (``corral agents`` reads ``/v1/agents`` too).
The children of a session are ``_children.py``'s (a runner's ``sys_session_send`` creates
them, PROTOCOL_0_19.md §J).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .._jsonlines import JsonObject
from ._agents import Agent
from ._endpoint import Api, endpoint, int_param
from ._plane import Refused

__all__ = [
    "agent_object",
    "agents",
    "list_page",
    "list_sessions",
    "policy_summary",
    "runner_status",
    "session_agent",
]


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


@endpoint("any")
async def agents(api: Api, request: Request) -> Response:
    """``GET /v1/agents``, sorted by name: the real server's list page (a runner's
    ``sys_agent_list`` reads it) with the ``agents`` of ``corral agents``."""
    loaded = await api.plane.agents()
    names = sorted(loaded)
    listing = [loaded[name].listing() for name in names]
    objects = [agent_object(loaded[name]) for name in names]
    invalid = [s.listing() for _, s in sorted(api.plane.catalog.skipped.items())]
    return JSONResponse(list_page(objects, agents=listing, invalid=invalid))


@endpoint("any")
async def runner_status(api: Api, request: Request) -> Response:
    """``GET /v1/runners/{id}/status``: whether that runner's tunnel is open."""
    runner_id = request.path_params["runner_id"]
    online = runner_id == api.plane.runner_id and api.plane.link is not None
    return JSONResponse({"runner_id": runner_id, "online": online})


@endpoint("any")
async def list_sessions(api: Api, request: Request) -> Response:
    """``GET /v1/sessions``: newest first; ``agent_name`` filters."""
    limit = int_param(request, "limit", 100, 1, 1000)
    wanted = request.query_params.get("agent_name")
    rows = await api.plane.store.list_sessions(limit)
    data = [
        {
            **api.plane.session_object(r),
            "agent_name": r.agent,
            "parent_session_id": r.parent_session_id,
        }
        for r in rows
        if not wanted or r.agent == wanted
    ]
    return JSONResponse(list_page(data))


@endpoint("any")
async def session_agent(api: Api, request: Request) -> Response:
    """``GET .../agent``: the session's agent object."""
    row = await api.plane.session(request.path_params["session_id"])
    agent = (await api.plane.agents()).get(row.agent)
    if agent is None:
        raise Refused(404, "not_found", f"The agent {row.agent!r} is not loaded.")
    return JSONResponse(agent_object(agent))
