"""``ChildSupervisor.adopt``: a live process the supervisor did not spawn, supervised as one
of its own (#15: a restarted harness actor adopts its predecessor's workers)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import trio

from corral.actors._child_state import ChildState
from corral.actors._children import ChildEvent, ChildSupervisor, Exited, Ready
from corral.actors._process import start_time, write_pidfile
from corral.actors._specs import ChildSpec, Liveness, SupFlags

#: Which host a pid file names (what the harness actor's supervisor records).
HOST = {"host_pid": 1, "host_start": 2}


def _orphan() -> int:
    """A process that is not our child: its parent exits at once, leaving it to init."""
    out = subprocess.run(
        ["sh", "-c", "sleep 60 </dev/null >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout)


def _spec(name: str) -> ChildSpec:
    return ChildSpec(
        name=name,
        argv=[sys.executable, "-c", "pass"],
        env={},
        restart="transient",
        restart_on="demand",
        shutdown_timeout_s=1.0,
    )


def _supervisor(tmp_path: Path, events: list[ChildEvent]) -> ChildSupervisor:
    return ChildSupervisor(
        SupFlags(
            intensity=5,
            period_s=60,
            intensity_per="child",
            liveness=Liveness(window_s=1.0, check_s=0.25),
        ),
        run_dir=tmp_path,
        on_event=events.append,
        record=HOST,
    )


async def test_an_adopted_process_runs_is_watched_for_liveness_and_its_exit_is_unknown(
    tmp_path: Path,
) -> None:
    """Adopted: ``running`` at once, its pid shown; silent past the window it is killed
    like any child, its exit seen through a pidfd with the status unknown (``code`` None,
    said in the reason), counted as a crash: ``restarting``, for its owner to start again."""
    pid = _orphan()
    assert os.getppid() != pid and start_time(pid) is not None
    write_pidfile(tmp_path / "harness__s.pid", pid, **HOST, session_id="s")
    events: list[ChildEvent] = []
    sup = _supervisor(tmp_path, events)
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        child = sup.adopt(_spec("harness/s"), pid, start_time(pid), record={"session_id": "s"})
        assert child is not None
        assert (child.state, child.pid, child.ready.is_set()) == (ChildState.RUNNING, pid, True)
        assert sup.statistics()[0]["pid"] == pid
        assert events == [Ready("harness/s")]
        sup.check_liveness(lambda name: None, time.monotonic() + 2.0)
        with trio.fail_after(10):
            await child.exited.wait()
        assert child.last_exit is not None
        assert child.last_exit["code"] is None
        assert child.last_exit["reason"].startswith("no heartbeat for ")
        assert "status unknown: adopted, not our child" in child.last_exit["reason"]
        assert child.last_exit["pid"] == pid
        assert child.state is ChildState.RESTARTING
        assert events[-1] == Exited("harness/s", child.last_exit)
        assert not (tmp_path / "harness__s.pid").exists()
        nursery.cancel_scope.cancel()


async def test_an_adopted_process_is_stopped_like_a_spawned_one(tmp_path: Path) -> None:
    pid = _orphan()
    sup = _supervisor(tmp_path, [])
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        child = sup.adopt(_spec("w"), pid, start_time(pid), record={})
        assert child is not None
        with trio.fail_after(10):
            await sup.stop_child("w")
        assert child.state is ChildState.STOPPED
        assert child.pid is None
        nursery.cancel_scope.cancel()


async def test_a_gone_or_reused_pid_is_not_adopted(tmp_path: Path) -> None:
    """A pid whose start time is not the recorded one is another process: not adopted, and
    its pid file goes."""
    pid = _orphan()
    started = start_time(pid)
    assert started is not None
    write_pidfile(tmp_path / "w.pid", pid)
    sup = _supervisor(tmp_path, [])
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        assert sup.adopt(_spec("w"), pid, started + 1, record={}) is None
        assert not (tmp_path / "w.pid").exists()
        assert sup.children == {}
        os.kill(pid, 9)
        nursery.cancel_scope.cancel()
