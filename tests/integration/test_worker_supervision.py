"""The harness actor supervises its workers as the host does its actors: one supervisor,
restart intensity, backoff and liveness from data (docs/supervision.md), one heartbeat."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import trio
import zmq

from corral.bus import Broker, open_peer
from corral.config import BusSettings, LivenessSettings
from tests.conftest import FAST_LIVENESS, HostProcess, wait_until
from tests.integration._dispatch import fake_dispatch, scripted

#: The harness actor alone: a stand-in dispatch (``fake_dispatch``) drives it.
HOST_ACTORS = frozenset({"harness"})


def _state(host: HostProcess) -> dict:
    return host.ask("inspect", actor="harness")["state"]


async def test_a_worker_crash_loop_is_stopped_by_restart_intensity(host_factory) -> None:
    """More than ``worker_intensity`` restarts of a session's worker in ``worker_period_s``
    and the supervisor gives up on it, by the host's own accounting (no special number);
    the session's next turn fails at once, and the other sessions are not touched."""
    host = host_factory(
        FAST_LIVENESS
        + "[actors.harness.options]\n"
        + "worker_intensity = 2\nworker_period_s = 60\ncrash_backoff_s = 0.05\n"
    ).start()
    async with fake_dispatch(host.endpoint) as d:
        # Each crash is a restart, whichever turn it ends: a worker that dies as a turn reaches
        # it is replaced within that turn (and the replacement counted) — so count spawns.
        ends = []
        while len(ends) < 5 and (not ends or ends[-1].error["code"] == "harness_crashed"):
            turn = await d.start_turn("s-loop", scripted({"crash": 7}))
            ends.append(await d.terminal(turn))
        end = ends[-1]
        assert end.error["code"] == "harness_unavailable", ends
        assert "restarted more than 2 times in 60s" in end.error["message"]
        assert "last exit: exited with code 7" in end.error["message"]
        assert _state(host)["spawned"] == 3, "spawned, restarted twice, then given up"
        turn = await d.start_turn("s-fine", scripted({"text": "ok"}))
        assert (await d.terminal(turn)).__struct_config__.tag == "response.completed"
    host.stop()


async def test_h08_exited_workers_leave_no_records(host_factory) -> None:
    """Reaped workers are forgotten at once, crashed ones once their restarts no longer
    count: over many sessions the harness actor's maps stay bounded."""
    host = host_factory(
        FAST_LIVENESS + "[actors.harness.options]\nidle_timeout_s = 0.3\nworker_period_s = 0.5\n"
    ).start()
    async with fake_dispatch(host.endpoint) as d:
        for i in range(4):
            turn = await d.start_turn(f"s-rec-{i}", scripted({"text": "ok"}))
            await d.terminal(turn)
        turn = await d.start_turn("s-rec-crash", scripted({"crash": 3}))
        assert (await d.terminal(turn)).error["code"] == "harness_crashed"
    await trio.to_thread.run_sync(
        lambda: wait_until(
            lambda: _state(host)["records"] == {"workers": 0, "children": 0},
            10,
            "every exited worker's records reclaimed",
        )
    )
    state = _state(host)
    assert (state["reaped"], state["workers"]) == (4, [])
    host.stop()


async def test_a_silent_turn_is_kept_alive_by_the_one_heartbeat(host: HostProcess) -> None:
    """A turn that sends nothing for longer than the liveness window is not killed: its
    worker's WorkerAlive (its only heartbeat) keeps it alive."""
    async with fake_dispatch(host.endpoint) as d:
        turn = await d.start_turn("s-quiet", scripted({"sleep_ms": 2500}, {"text": "done"}))
        end = await d.terminal(turn, timeout=20)
    assert end.__struct_config__.tag == "response.completed", end
    assert _state(host)["crashed"] == 0


async def test_a_peer_without_the_bus_heartbeat_sends_none(tmp_path: Path) -> None:
    """``heartbeat=False`` (a harness worker) sends no bus heartbeat when idle; a peer with
    it does, every interval."""
    endpoint = f"ipc://{tmp_path}/bus.sock"
    live = LivenessSettings(interval_s=0.05, liveness=3)
    broker = Broker([endpoint], tmp_path / "mb.log", BusSettings(), ctx=zmq.Context.instance())
    async with trio.open_nursery() as nursery:
        await nursery.start(broker.run)
        async with (
            open_peer("quiet", endpoint, liveness=live, heartbeat=False),
            open_peer("loud", endpoint, liveness=live),
        ):
            quiet, loud = broker.last_seen("quiet"), broker.last_seen("loud")
            assert quiet is not None and loud is not None
            # Absence can only be seen over time: six intervals.
            await trio.sleep(0.3)
            assert broker.last_seen("quiet") == quiet
            assert (broker.last_seen("loud") or 0.0) > loud
        nursery.cancel_scope.cancel()


async def test_a_worker_killed_while_it_starts_is_replaced_and_its_turn_runs(
    host_factory,
) -> None:
    """A worker ``kill -9``-ed while it starts (here: while it imports its harness) is
    replaced by a new one for the same turn, a restart within the session's budget, and the
    turn runs (it used to end ``harness_unavailable``, "exited at start")."""
    host = host_factory(
        FAST_LIVENESS
        + "[actors.harness.options]\ncrash_backoff_s = 0.05\n"
        + "[actors.harness.options.harnesses]\n"
        + 'slow = "tests.integration._slow_start_harness:SlowStart"\n'
    ).start()
    # The marker the first worker leaves as it starts to hang (named after its parent).
    marker = Path(f"/tmp/corral-slow-start-{host.actor('harness')['pid']}")
    try:
        async with fake_dispatch(host.endpoint) as d:
            turn = await d.start_turn("s-slow", {"name": "slow", "executor": {"harness": "slow"}})

            def starting_pid() -> int | None:
                workers = [w for w in _state(host)["workers"] if w["session_id"] == "s-slow"]
                return workers[0]["pid"] if workers and marker.exists() else None

            pid = await trio.to_thread.run_sync(
                lambda: wait_until(starting_pid, 15, "the worker importing its harness")
            )
            os.kill(pid, signal.SIGKILL)
            end = await d.terminal(turn, timeout=30)
        assert end.__struct_config__.tag == "response.completed", end
        state = _state(host)
        assert (state["spawned"], state["crashed"]) == (2, 1)
    finally:
        marker.unlink(missing_ok=True)
    host.stop()
