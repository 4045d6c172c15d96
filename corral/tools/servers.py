"""The servers the session tools ask, one client per runner id the host serves.

A session belongs to the runner id it was first bound through, and runner ids of one host
may belong to different servers (``[[runners]]``), so a tool asks the server of the call's
runner id (:func:`~corral.server_client.pick_server`), never one server for all sessions.
The clients are made once per tools-actor incarnation and closed with it; each keeps its
pooled connection, so the many small reads of a listing share one.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..config import RunnerSettings
from ..server_client import ServerClient, pick_server

__all__ = ["Servers"]


class Servers:
    """Clients of the servers of the host's runners (and of an explicit server, tests)."""

    def __init__(
        self,
        runners: Sequence[RunnerSettings],
        *,
        server_url: str | None = None,
        token: str | None = None,
    ) -> None:
        self.explicit = ServerClient(server_url, token=token) if server_url else None
        self.by_runner = {
            runner.id: ServerClient(runner.server, token=runner.token)
            for runner in runners
            if runner.id is not None
        }

    def for_runner(self, runner_id: str | None) -> ServerClient | None:
        """The server of sessions bound through ``runner_id``; None when there is none."""
        return pick_server(self.explicit, self.by_runner, runner_id)

    async def aclose(self) -> None:
        for client in (self.explicit, *self.by_runner.values()):
            if client is not None:
                await client.aclose()
