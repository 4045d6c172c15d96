"""A turn that outruns the server arrives whole: flow control, not bounds that drop.

A worker can produce deltas faster than dispatch, the gateway and the server take them. Each
hop had a bound that dropped the oldest past it, meant for a peer that is down: the gateway's
buffer of undelivered events per session (``max_buffered_events``), the worker's unconfirmed
events (``HELD_MAX``, 65,536 then). With every peer up and merely slower, a 200,000-delta
turn through ``corral bench relay``'s host lost 6 to 20 % of its deltas at the server, and
the journal's rounds of one run grew past the bus's message limit (7 to 32 MB against 4 MiB)
and lost most of the run (21,840 of 200,005 events stored). A slower peer now slows the turn.

The host here is a real ``corral up`` behind the benchmark's tunnel peer (the server's end of
the runner tunnel). The first test makes its bounds small, so that a short flood goes far past
them: the gateway keeps 2,000 undelivered events per session, the bus carries 128 KiB a
message. The second kills dispatch mid-flood, so that the worker's unconfirmed events pass
HELD_MAX while no dispatch confirms them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from typing import Any

import pytest
import trio

from corral.actors._control import request
from corral.bench import relay
from tests.conftest import wait_for

DELTAS = 60_000
BOUND = 2_000
EXTRA = f"""
[bus]
max_message_bytes = 131072

[actors.gateway.options]
max_buffered_events = {BOUND}
"""


def _journal(state_dir: str, *args: str) -> Any:
    out = subprocess.run(
        [sys.executable, "-m", "corral", "journal", *args, "--state-dir", state_dir, "--json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out)


@pytest.mark.timeout(180)
async def test_j32_a_flood_past_every_bound_reaches_the_server_and_the_journal_whole() -> None:
    """J-32 under a flood: the server gets every delta once and in order, the journal every
    event of the run, and nothing is dropped on the way (the gateway's ``buffer.dropped``).
    The turn is slowed instead: the gateway's buffer filled to its bound and waited."""
    turns = [relay.WARM_TURN, [{"text": "y", "repeat": DELTAS}]]
    async with relay.relay_host(turns, extra=EXTRA) as host:
        sid = uuid.uuid4().hex
        await relay.bind_all(host.peer, [sid])
        await relay.run_turn(host.peer, [sid], relay.WARM_DELTAS, 60)
        # check_turn inside: every delta once, in order, or PeerError.
        flooded = await relay.run_turn(host.peer, [sid], DELTAS, 150)
        assert len(flooded[sid]) == DELTAS
        gateway = await trio.to_thread.run_sync(
            lambda: request(host.inst.control_path, "inspect", actor="gateway")
        )
        state = gateway.get("state", gateway)
        assert state["buffer"]["dropped"] == 0
        assert state["buffer"]["events"] > BOUND  # the flood did go past the bound
        state_dir = str(host.inst.state_dir)
        runs = await trio.to_thread.run_sync(_journal, state_dir, "ls", sid)
        counts = []
        for run in runs["runs"]:
            summary = await trio.to_thread.run_sync(
                _journal, state_dir, "summary", sid, run["run_id"]
            )
            assert summary["terminal"] is True
            counts.append(summary["event_count"])
        # The flood's run: every delta, and the few events around them (created, the item...).
        assert max(counts) >= DELTAS and max(counts) - DELTAS < 20


@pytest.mark.timeout(240)
async def test_d08_dispatch_killed_mid_flood_the_worker_waits_and_nothing_is_lost() -> None:
    """kill -9 of dispatch while a worker floods: the worker's unconfirmed events pile up
    while dispatch is gone, past HELD_MAX (8,192) at a flood's pace. It waits there for the
    next dispatch's confirmations, and that dispatch asks it for what it missed: the server
    gets every delta once and in order. Dropping the oldest past HELD_MAX, as the worker did,
    left them out of that resend for good."""
    deltas = 250_000
    turns = [relay.WARM_TURN, [{"text": "z", "repeat": deltas}]]
    async with relay.relay_host(turns) as host:
        sid = uuid.uuid4().hex
        await relay.bind_all(host.peer, [sid])
        await relay.run_turn(host.peer, [sid], relay.WARM_DELTAS, 60)
        stream = host.peer.streams[sid]
        before = len(stream.deltas)

        async def kill_dispatch_once_flooding() -> None:
            await wait_for(
                lambda: _arrived(stream, before + 20_000), "the flood under way", timeout=60
            )
            status = await trio.to_thread.run_sync(
                lambda: request(host.inst.control_path, "status")
            )
            (dispatch,) = [a for a in status["actors"] if a["name"] == "dispatch"]
            os.kill(dispatch["pid"], signal.SIGKILL)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(kill_dispatch_once_flooding)
            flooded = await relay.run_turn(host.peer, [sid], deltas, 180)
        assert len(flooded[sid]) == deltas


async def _arrived(stream: Any, n: int) -> bool:
    await trio.lowlevel.checkpoint()
    return len(stream.deltas) >= n


@pytest.mark.timeout(120)
async def test_an_assistant_message_larger_than_the_bus_carries_fails_its_turn_typed() -> None:
    """A turn whose whole assistant message is larger than a bus message may be (128 KiB
    here) ends ``failed`` with ``output_too_large``, its deltas all delivered first, and its
    worker lives on to run the next turn. The item's send failed in the worker's outbox task
    and took the worker down: the turn ended ``harness_crashed`` and the worker restarted."""
    deltas = 40_000  # "abcd" each: 160,000 characters in the message
    turns = [relay.WARM_TURN, [{"text": "abcd", "repeat": deltas}], relay.WARM_TURN]
    async with relay.relay_host(turns, extra=EXTRA) as host:
        sid = uuid.uuid4().hex
        await relay.bind_all(host.peer, [sid])
        await relay.run_turn(host.peer, [sid], relay.WARM_DELTAS, 60)
        pids = await _worker_pids(host)
        with pytest.raises(relay.PeerError, match="output_too_large") as failed:
            await relay.run_turn(host.peer, [sid], deltas, 60)
        assert "larger than a bus message may be" in str(failed.value)
        stream = host.peer.streams[sid]
        assert len(stream.deltas) == relay.WARM_DELTAS + deltas
        # The next turn, on the same worker (wait_ends raises for the failed one before).
        reply = await host.peer.send_message(sid, relay.AGENT_ID, "go")
        await reply.wait(60)
        with pytest.raises(relay.PeerError, match="output_too_large"):
            await stream.wait_ends(3, 60)
        assert [status for status, _ in stream.ends] == ["idle", "failed", "idle"]
        assert len(stream.deltas) == 2 * relay.WARM_DELTAS + deltas
        assert await _worker_pids(host) == pids


async def _worker_pids(host: Any) -> list[int]:
    status = await trio.to_thread.run_sync(lambda: request(host.inst.control_path, "status"))
    return sorted(w["pid"] for w in status["workers"])
