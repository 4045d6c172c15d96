"""The HTTP and WebSocket surface of the control plane, as a Starlette app: the route table.

Three kinds of callers share it:

* the runner's tunnel, ``GET /v1/runners/{runner_id}/tunnel`` (WebSocket, PROTOCOL_FACTS §i);
* the runner's own HTTP calls (§iii), authenticated by ``X-Omnigent-Runner-Tunnel-Token``;
* clients (``corral chat/send/agents``): agents, sessions, events, approvals, the event stream
  (``docs/control-plane.md``), authenticated by ``Authorization: Bearer <client token>``.

Every route but ``GET /api/version`` (a liveness probe that shows the protocol version only)
needs a credential, on loopback too: a loopback port is open to every user of the machine,
and the agents run commands as the user who runs corral. Each route names who may call it
(``@endpoint(access)``, ``_endpoint.py``); ``GET /v1/sessions/{id}``, ``.../items`` and
``.../labels`` serve both sides, and so do the reads and writes of a runner's session tools
(``_discovery.py``, ``_session_writes.py``); ``POST /v1/sessions`` is a client's session or the
runner's child; on ``POST /v1/sessions/{id}/events`` the runner posts
``external_conversation_item`` and messages, clients messages and the other types.

The handlers live by concept, one module each, and :data:`ROUTES` lists them all in one
place; a route is one row ``(path, handler, methods)``. Two rows may share a path with
different methods (``GET``/``POST /v1/sessions``): Starlette tries them in order.
"""

from __future__ import annotations

import functools

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute

from .. import __version__
from . import _discovery as discovery
from . import _event_routes as events
from . import _runner_routes as runner
from . import _session_routes as sessions
from . import _session_writes as writes
from ._endpoint import Api, Handler, endpoint, http_exception
from ._plane import SERVER_VERSION, ControlPlane
from ._tunnel_handshake import tunnel

__all__ = ["ROUTES", "build_app"]


@endpoint("open")
async def version(api: Api, request: Request) -> Response:
    """``GET /api/version`` (§iii.2)."""
    return JSONResponse({"version": SERVER_VERSION, "corral_version": __version__})


@endpoint("any")
async def health(api: Api, request: Request) -> Response:
    """``GET /healthz``: is the runner connected, and how the tunnel fares."""
    return JSONResponse(api.plane.health())


_S = "/v1/sessions/{session_id}"

#: Every HTTP route: ``(path, handler, methods)``.
ROUTES: list[tuple[str, Handler, list[str]]] = [
    ("/api/version", version, ["GET"]),
    ("/healthz", health, ["GET"]),
    # the session tools' reads
    ("/v1/agents", discovery.agents, ["GET"]),
    ("/v1/runners/{runner_id}/status", discovery.runner_status, ["GET"]),
    ("/v1/sessions", discovery.list_sessions, ["GET"]),
    (f"{_S}/agent", discovery.session_agent, ["GET"]),
    # a session's record
    ("/v1/sessions", sessions.create_session, ["POST"]),
    (_S, sessions.read_session, ["GET"]),
    (_S, sessions.patch_session, ["PATCH"]),
    (_S, sessions.delete_session, ["DELETE"]),
    (f"{_S}/items", sessions.items, ["GET"]),
    (f"{_S}/labels", sessions.labels, ["GET"]),
    # what the session tools' writes make: children, grants
    (f"{_S}/child_sessions", writes.child_sessions, ["GET"]),
    (f"{_S}/permissions", writes.permissions, ["GET", "PUT"]),
    # the runner's own calls
    ("/v1/runners/{runner_id}/token", runner.runner_token, ["POST"]),
    (f"{_S}/agent/contents", runner.agent_contents, ["GET"]),
    (f"{_S}/policies/evaluate", runner.evaluate, ["POST"]),
    (f"{_S}/mcp", runner.mcp, ["POST"]),
    # a session's events
    (f"{_S}/events", events.events, ["POST"]),
    (f"{_S}/elicitations/{{elicitation_id}}/resolve", events.resolve, ["POST"]),
    (f"{_S}/stream", events.stream, ["GET"]),
]


def build_app(plane: ControlPlane) -> Starlette:
    """The Starlette app serving ``plane``: :data:`ROUTES` and the runner's tunnel."""
    api = Api(plane)
    routes: list[Route | WebSocketRoute] = [
        Route(path, functools.partial(handler, api), methods=methods)
        for path, handler, methods in ROUTES
    ]
    routes.append(WebSocketRoute("/v1/runners/{runner_id}/tunnel", functools.partial(tunnel, api)))
    return Starlette(routes=routes, exception_handlers={HTTPException: http_exception})
