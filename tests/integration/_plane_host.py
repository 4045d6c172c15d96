"""A real host with its embedded control plane and scripted agents, for the tests of running
corral as a service (test_drain.py, test_service.py): start it, stop it, start another on the
same state dir, and read a session's events back through the client API. What is left of a
host after a test: ``tests.conftest.kill_host``."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import Any

import trio

from corral.cli._client import ControlPlane, StreamEvent
from tests.conftest import FAST_LIVENESS, HostProcess, wait_until

#: Terminal edges of a turn on the client's stream.
TERMINAL = ("idle", "failed")


def write_agents(root: Path, agents: dict[str, str]) -> Path:
    directory = root / "agents"
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in agents.items():
        (directory / f"{name}.yaml").write_text(textwrap.dedent(text))
    return directory


def plane_host(root: Path, agents: dict[str, str], extra: str = "") -> HostProcess:
    """A host (not started) on ``root/state`` whose control plane offers ``agents``."""
    directory = write_agents(root, agents)
    config = (
        FAST_LIVENESS
        + "[actors.gateway.options]\nbackoff_base_s = 0.05\nbackoff_cap_s = 0.2\n"
        + f"[server]\nagents_dirs = [{json.dumps(str(directory))}]\n"
        + extra
        + os.environ.get("CORRAL_TEST_EXTRA_CONFIG", "")
    )
    return HostProcess(root / "state", config)


def start(host: HostProcess, **env: str) -> HostProcess:
    """Start ``host`` and wait for its control plane and the runner's tunnel."""
    host.start(env=env or None)
    host.wait_for(lambda s: s["server"] and s["server"]["state"] == "running", 30, "plane")
    wait_until(
        lambda: any(t["state"] == "connected" for t in host.status()["tunnels"]), 30, "tunnel"
    )
    return host


async def session_events(
    api: ControlPlane, session_id: str, *, turns: int = 1, timeout: float = 60
) -> list[StreamEvent]:
    """Every event the control plane stored for the session, read through the client's
    stream from the start: until ``turns`` terminal edges were seen, and then on to the
    session's ``last_event_id`` (so a second edge of a turn stored meanwhile is seen too)."""
    seen: list[StreamEvent] = []
    last: list[str] = []

    async def on_event(event: StreamEvent) -> bool:
        seen.append(event)
        if last:
            return event.id == last[0]
        return sum(_is_edge(e) for e in seen) >= turns

    with trio.fail_after(timeout):
        await api.follow(session_id, "0", on_event)
        last.append(str((await api.session(session_id))["last_event_id"]))
        if seen[-1].id != last[0]:
            await api.follow(session_id, seen[-1].id, on_event)
    return seen


def _is_edge(event: StreamEvent) -> bool:
    return event.type == "session.status" and event.data.get("status") in TERMINAL


def edges(events: list[StreamEvent]) -> list[dict[str, Any]]:
    """The ``session.status`` events, in order."""
    return [e.data for e in events if e.type == "session.status"]


def text(events: list[StreamEvent]) -> str:
    return "".join(
        str(e.data.get("delta", "")) for e in events if e.type == "response.output_text.delta"
    )
