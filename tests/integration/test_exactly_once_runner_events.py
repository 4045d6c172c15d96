"""The runner's own events of a turn whose worker died together with dispatch (#15).

The new dispatch cannot learn from the dead worker how far its events went: what the
killed dispatch had published of them is numbered past its last save. The harness actor
then cancels the parked elicitation (``response.elicitation_resolved``) and ends the turn;
both must be numbered past anything the worker could have sent, or the gateway drops them
as seen.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fake_server import FakeOmnigentServer
from tests.fake_tunnel_server import FakeTunnelServer
from tests.integration.test_exactly_once import (
    RUNNER,
    _config,
    _kill9_dispatch_and_worker,
    _post,
    _streaming_agent,
)
from tests.integration.test_gateway import bind, message, running


@pytest.mark.chaos
async def test_d08_e03_kill9_of_dispatch_and_its_worker_at_an_elicitation_keeps_its_cancel(
    host_factory, tunnels: FakeTunnelServer, server: FakeOmnigentServer, tmp_path: Path
) -> None:
    """The worker streams, runs a tool and parks an elicitation; dispatch and the worker
    are killed together. The server gets the elicitation's cancel and the turn's ``failed``
    edge, each once. Without the change the cancel was numbered below the elicitation's
    request (saved before it was published) and the gateway dropped it."""
    agent_id, sid = _streaming_agent(server, tmp_path, {"elicit": {"message": "Deploy?"}})
    host = host_factory(_config(tunnels, server, ""))
    async with running(host):
        t = await tunnels.wait_tunnel(RUNNER)
        await bind(t, sid, agent_id)
        assert await _post(t, sid, message("first", agent_id, "streams")) == 202

        def of(kind: str) -> list[dict]:
            return [e for e in tunnels.events.get(sid, []) if e.get("type") == kind]

        await tunnels.until(lambda: of("response.elicitation_request"), 60, "the elicitation")
        await _kill9_dispatch_and_worker(host, sid)
        await tunnels.until_status(sid, "failed", timeout=60)
        assert tunnels.statuses(sid) == ["running", "failed"]
        resolved = await tunnels.until(
            lambda: of("response.elicitation_resolved"), 10, "the elicitation's cancel"
        )
        assert len(resolved) == 1 and resolved[0]["action"] == "cancel", resolved
