"""Dispatch's memory stays bounded: idle sessions leave it, and come back from the store.

A real host recovers 10,000 sessions from ``sessions.log``; with ``session_idle_s`` short,
every one of them is reclaimed, and a session needed again is read back with its record.
Counted in entries (sessions held, in-order queues), not in RSS, so the test cannot flake.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import msgspec
import trio

from corral.actors.dispatch._session import SessionRecord
from corral.bus import InspectRequest, Peer
from tests.conftest import FAST_LIVENESS, HostProcess
from tests.integration._gateway import fake_gateway

SESSIONS = 10_000


async def _state(peer: Peer) -> dict[str, Any]:
    reply = await peer.call("dispatch", InspectRequest(), timeout=5)
    state: dict[str, Any] = reply.state
    return state


async def test_idle_sessions_are_reclaimed_and_read_back_on_next_use(
    host_factory: Callable[..., HostProcess],
) -> None:
    host = host_factory(
        FAST_LIVENESS
        + '[actors.dispatch.options]\nsession_idle_s = 0.5\nsubscribers = ["test-gateway"]\n'
    )
    log = host.instance.actor_dir("dispatch") / "sessions.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_bytes(
        b"".join(
            msgspec.json.encode(SessionRecord(id=f"s-{n}", agent_id=f"agent-{n}", seq=n)) + b"\n"
            for n in range(SESSIONS)
        )
    )
    host.start()
    async with fake_gateway(host.endpoint) as gw:
        with trio.fail_after(30):
            while (state := await _state(gw.peer))["sessions"]:
                await trio.sleep(0.2)
        assert state["reclaimed"] == SESSIONS
        assert state["queues"] == 0
        got = await gw.request("GET", "/v1/sessions/s-42")
        assert got.status == 200
        assert json.loads(got.body)["agent_id"] == "agent-42"
        gone = await gw.request("DELETE", "/v1/sessions/s-43")
        assert gone.status == 200
        assert (await gw.request("GET", "/v1/sessions/s-43")).status == 404
        assert (await gw.request("GET", "/v1/sessions/never-was")).status == 404
        state = await _state(gw.peer)
        assert state["revived"] == 2
