"""The ChildSupervisor with real processes: typed events, giving up, restarts on demand."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
import trio

from corral._exceptions import RestartIntensityExceeded
from corral.actors._child_state import ChildState
from corral.actors._children import ChildEvent, ChildSupervisor, Exited, GaveUp, Spawning
from corral.actors._specs import Backoff, ChildSpec, SupFlags


def _spec(name: str, code: int, **fields: object) -> ChildSpec:
    return ChildSpec(
        name=name,
        argv=[sys.executable, "-c", f"raise SystemExit({code})"],
        env=dict(os.environ),
        bus_peer=False,
        **fields,  # type: ignore[arg-type]
    )


async def test_a_crash_loop_is_reported_as_typed_events_until_the_supervisor_gives_up(
    tmp_path: Path,
) -> None:
    events: list[ChildEvent] = []
    sup = ChildSupervisor(
        SupFlags(intensity=2, period_s=60), run_dir=tmp_path, on_event=events.append
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        child = await sup.start_child(_spec("c", 3))
        with trio.fail_after(30):
            await child.exited.wait()
        assert (child.state, child.restarts) == (ChildState.FAILED, 2)
        assert [type(e) for e in events] == [Spawning, Exited] * 3 + [GaveUp]
        assert events[-2] == Exited("c", child.last_exit)  # type: ignore[arg-type]
        gave_up = events[-1]
        assert isinstance(gave_up, GaveUp)
        assert gave_up.message("child 'c'") == (
            "child 'c' restarted more than 2 times in 60s; last exit: exited with code 3"
        )
        with pytest.raises(RestartIntensityExceeded, match="restarted more than 2 times"):
            await sup.start_child(_spec("c", 3))
        assert sup.statistics()[0]["state"] == "failed"
        nursery.cancel_scope.cancel()


async def test_a_child_restarted_on_demand_waits_for_its_owner_then_its_backoff(
    tmp_path: Path,
) -> None:
    sup = ChildSupervisor(
        SupFlags(intensity=5, period_s=60, intensity_per="child", backoff=Backoff(first_s=0.3)),
        run_dir=tmp_path,
    )
    spec = _spec("w", 7, restart="transient", restart_on="demand")
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        first = await sup.start_child(spec)
        with trio.fail_after(30):
            assert await first.settled() is False, "it exited before it was ready"
        assert first.state is ChildState.RESTARTING and first.pid is None, "not respawned"
        second = await sup.start_child(spec)  # the first restart in the period: at once
        with trio.fail_after(30):
            await second.exited.wait()
        crashed = time.monotonic()
        third = await sup.start_child(spec)  # the second: after first_s
        assert time.monotonic() - crashed >= 0.3
        assert third.restarts == 2
        with trio.fail_after(30):
            await third.exited.wait()
        # A normal exit of a transient child is no restart: it stops, and can be forgotten.
        done = await sup.start_child(_spec("ok", 0, restart="transient", restart_on="demand"))
        with trio.fail_after(30):
            await done.exited.wait()
        assert done.state is ChildState.STOPPED
        sup.forget("ok")
        sup.forget("w")
        assert sup.children == {}
        nursery.cancel_scope.cancel()


async def test_a_child_is_running_once_marked_ready(tmp_path: Path) -> None:
    sup = ChildSupervisor(SupFlags(), run_dir=tmp_path)
    spec = ChildSpec(
        name="s",
        argv=[sys.executable, "-c", "import time; time.sleep(60)"],
        env=dict(os.environ),
        shutdown_timeout_s=1.0,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        child = await sup.start_child(spec)
        assert child.state is ChildState.STARTING
        with pytest.raises(ValueError, match="already running"):
            await sup.start_child(spec)
        sup.mark_ready("s")
        assert await child.settled() is True
        assert child.state is ChildState.RUNNING
        assert sup.statistics()[0]["uptime_s"] is not None
        await sup.stop_all()
        assert child.state is ChildState.STOPPED
        nursery.cancel_scope.cancel()
