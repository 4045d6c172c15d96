"""corral's embedded control plane: the server side of the runner tunnel.

``corral up`` starts it (``python -m corral.server``) when no other server is configured, so
corral runs end to end on one machine. It speaks the omnigent server's side of PROTOCOL_FACTS
§i-iii to the runner (any omnigent-compatible runner, corral's gateway included) and offers a
small client API for ``corral chat``/``send``/``agents``; ``docs/control-plane.md`` describes
both.

It stays a separate program in spirit: it imports the floor (``config``, ``spec``,
``server_client`` for the runner id, ``logs``) and never ``corral.actors``; it talks to the
host only through the tunnel and HTTP, exactly as a foreign server would.

Modules: ``_serve`` (entry point, hypercorn), ``_http`` (the Starlette app and its route
table; the routes by concept in ``_discovery``, ``_session_routes``, ``_runner_routes``,
``_event_routes``, ``_tunnel_handshake``, what they share in ``_endpoint``), ``_plane``
(sessions, the runner binding, relays, the outbox), ``_mcp`` (tool calls and approvals),
``_tunnel`` (the WebSocket link), ``_store`` (SQLite), ``_conversation`` (items from the
runner's events), ``_agents`` (agent YAMLs), ``_policy`` (rules), ``_state`` (files in the
state dir).
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

# Imported on first use (corral._lazy): `corral agents validate` reads agent files with
# ``_agents`` and has no use for the server, hypercorn and Starlette.
if TYPE_CHECKING:
    from ._agents import PACKAGED_AGENTS as PACKAGED_AGENTS
    from ._plane import ControlPlane as ControlPlane
    from ._plane import PlaneOptions as PlaneOptions
    from ._serve import serve as serve
    from ._state import ServerInfo as ServerInfo
    from ._state import read_server_json as read_server_json

__getattr__, __dir__ = lazy_exports(__name__, __file__)
