"""``corral bench scale``, and what an idle session holds in a real host (issue #20)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from typing import Any

import pytest
import trio

from corral.actors._control import request
from corral.bench import relay, scale
from corral.instance import Instance


def test_every_session_turn_of_the_script_is_a_wake_then_a_paced_turn() -> None:
    """A session runs its first turn, then per step a wake (one delta) and a paced turn; the
    script holds all of them, so it never cycles back to a wrong kind."""
    sizes = scale.Sizes.quick()
    turns = sizes.turns()
    paced = [{"text": "y", "repeat": sizes.paced_deltas, "delay_ms": sizes.paced_delay_ms}]
    assert turns[0] == relay.WARM_TURN
    assert turns[1:] == [relay.WARM_TURN, paced] * len(sizes.steps)


def _gateway(inst: Instance) -> dict[str, Any]:
    state: dict[str, Any] = request(inst.control_path, "inspect", actor="gateway")["state"]
    return state


@pytest.mark.chaos
@pytest.mark.timeout(240)
async def test_a_session_whose_stream_ended_leaves_no_stream_state_in_the_gateway() -> None:
    """H-08's counterpart for the gateway: once the server's streams of some sessions ended
    (here by deleting them, §I.1), the gateway keeps no lock or change event for them; the
    sessions still streaming are all it holds."""
    async with relay.relay_host([relay.WARM_TURN]) as host:
        ids = [f"scale-{n}" for n in range(6)]
        await relay.bind_all(host.peer, ids)
        await relay.run_turn(host.peer, ids, relay.WARM_DELTAS, 120)
        for sid in ids[2:]:
            reply = await host.peer.request("DELETE", f"/v1/sessions/{sid}")
            assert reply.status in (200, 204), reply.body
        with trio.fail_after(60):
            while (state := await trio.to_thread.run_sync(_gateway, host.inst))["streams"] > 2:
                await trio.sleep(0.05)
        assert state["stream_sessions"] == 2, state


@pytest.mark.chaos
@pytest.mark.timeout(420)
def test_bench_scale_quick_json_and_idle_sessions_hold_no_task() -> None:
    """``corral bench scale --quick --json``: the document, each step's figures against the
    first step's, and the audit of issue #20 — with 3, 10 and 30 known sessions idle (their
    workers reaped, H-08) no actor holds a task, a file or a process more: the gateway keeps
    each stream the server holds open as a record, with no task."""
    done = subprocess.run(
        [sys.executable, "-m", "corral", "bench", "scale", "--quick", "--json"],
        capture_output=True,
        text=True,
        timeout=400,
        check=True,
    )
    doc = json.loads(done.stdout)
    assert set(doc) == {"benchmark", "baseline", "results", "params"}
    assert doc["benchmark"] == "scale"
    assert doc["baseline"]["unit"] == "ms" and doc["baseline"]["value"] > 0
    steps = doc["params"]["steps"]
    assert steps == [3, 10, 30] and doc["params"]["active"] == 5
    rows = {r["name"]: r for r in doc["results"]}
    assert len(rows) == len(doc["results"]), "figure names are unique"
    for row in doc["results"]:
        assert set(row) == {"name", "value", "unit", "ratio_to_baseline"}
        assert math.isfinite(row["value"]), row
        # A difference between steps may fall below zero at the quick run's few sessions
        # (one full run's 3 -> 10 was -0.29 MB: pages shared anew, a collection); the rest
        # are amounts.
        assert row["value"] >= 0 or row["name"].startswith("PSS per added"), row
    for known, active in ((3, 3), (10, 5), (30, 5)):
        busy = f"{known} sessions, {active} active"
        for name in (
            f"host tree PSS, {known} sessions idle",
            f"host tree PSS per known session, {known} sessions idle",
            f"deltas/s, {busy}",
            f"host tree CPU during the paced turns, {busy}",
            f"paced delta latency p50, {busy}",
            f"paced delta latency p99, {busy}",
        ):
            assert rows[name]["value"] > 0, name
        p50 = rows[f"paced delta latency p50, {busy}"]
        assert p50["value"] <= rows[f"paced delta latency p99, {busy}"]["value"]
    first = rows["paced delta latency p50, 3 sessions, 3 active"]
    assert first["value"] == pytest.approx(doc["baseline"]["value"], rel=1e-3)
    assert first["ratio_to_baseline"] == 1
    assert rows["PSS per added idle session, 10 -> 30"]["unit"] == "MB"

    by_step = doc["params"]["by_step"]
    assert [s["known"] for s in by_step] == steps
    idle = [s["idle"] for s in by_step]
    for state, known in zip(idle, steps, strict=True):
        assert state["live_workers"] == 0 and state["held"]["harness workers"] == 0
        assert state["held"]["gateway streams"] == known
    for state in idle[1:]:
        assert state["processes"] == idle[0]["processes"]
        assert state["open_files"] == idle[0]["open_files"]
        for actor, tasks in state["tasks"].items():
            assert tasks == idle[0]["tasks"][actor], (actor, state["tasks"])
    # Active sessions are what costs processes: their workers, alive.
    for s in by_step:
        assert s["busy"]["live_workers"] == s["active"]
        assert s["busy"]["processes"] == s["idle"]["processes"] + s["active"]
