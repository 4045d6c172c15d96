"""A host asked to stop (SIGTERM: ``systemctl restart``, a pod replaced) drains: it starts no
new turn, lets the turns in flight end within ``supervisor.drain_timeout_s``, and then stops.
A new host on the same state dir runs what came meanwhile; a turn still in flight at the
deadline ends ``failed`` (``harness_restarted``) there, once. Each turn has exactly one
terminal edge on the client's stream and its tool call ran once (a marker file's lines).
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio

from corral.cli._client import ControlPlane, StreamEvent
from tests.conftest import HostProcess, kill_host, wait_until

from ._plane_host import edges, plane_host, session_events, start, text


def _agents(root: Path) -> dict[str, str]:
    """``job`` (3 s after its tool call), ``stuck`` (a minute), ``quick``; each tool call
    appends a line to ``<root>/<agent>.ran``."""

    def agent(name: str, wait_ms: int, end: str) -> str:
        ran = f"echo ran >> {root}/{name}.ran"
        return f"""
            name: {name}
            executor:
              harness: scripted
              script:
                turns:
                  - - {{text: "starting. "}}
                    - {{tool: sys_os_shell, arguments: {{command: "{ran}"}}}}
                    - {{sleep_ms: {wait_ms}}}
                    - {{text: "{end}"}}
            """

    return {
        "job": agent("job", 3000, "done."),
        "stuck": agent("stuck", 60000, "never."),
        "quick": agent("quick", 0, "quick."),
    }


def _runs(root: Path, agent: str) -> int:
    path = root / f"{agent}.ran"
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[Callable[[str], HostProcess]]:
    """Hosts on ``tmp_path/state``, one after another, with the drain timeout given."""
    made: list[HostProcess] = []

    def make(drain: str) -> HostProcess:
        extra = f"[supervisor]\ndrain_timeout_s = {drain}\n"
        made.append(plane_host(tmp_path, _agents(tmp_path), extra))
        return made[-1]

    yield make
    for host in made:
        kill_host(host)


async def _post(host: HostProcess, agent: str, message: str) -> str:
    async with ControlPlane(host.state_dir) as api:
        session = await api.create_session(agent)
        await api.post_message(session["id"], message)
        return str(session["id"])


async def test_sigterm_mid_turn_drains_it_to_its_end_and_the_next_host_runs_what_came_meanwhile(
    hosts: Callable[[str], HostProcess], tmp_path: Path
) -> None:
    first = await trio.to_thread.run_sync(lambda: start(hosts("60")))
    job = await _post(first, "job", "go")
    await trio.to_thread.run_sync(lambda: wait_until(lambda: _runs(tmp_path, "job"), 30, "job"))
    assert first.proc is not None
    async with ControlPlane(first.state_dir) as api, trio.open_nursery() as nursery:
        # The job's turn is followed from before the SIGTERM: its end must reach the client
        # from this host, before it stops (a stream that cannot be reopened fails the test).
        statuses: list[str] = []

        async def on_status(event: StreamEvent) -> bool:
            if event.type == "session.status":
                statuses.append(str(event.data["status"]))
            return statuses[-1:] == ["idle"]

        nursery.start_soon(api.follow, job, "0", on_status)
        first.proc.send_signal(signal.SIGTERM)
        await trio.to_thread.run_sync(
            lambda: first.wait_for(lambda s: s["host"]["state"] == "draining", 10, "draining")
        )
        # A message while the host drains: taken (buffered, durably), not started here (a
        # new session's first message is buffered only by a stopping host).
        quick = str((await api.create_session("quick"))["id"])
        await api.post_message(quick, "meanwhile")
        consumed: list[str] = []

        async def on_event(event: StreamEvent) -> bool:
            if event.type == "session.input.consumed":
                consumed.append(str(event.data["data"].get("runner_status")))
            return bool(consumed)

        with trio.fail_after(30):
            await api.follow(quick, "0", on_event)
    assert consumed == ["buffered"]
    assert statuses == ["running", "idle"]
    assert _runs(tmp_path, "quick") == 0
    code = await trio.to_thread.run_sync(first.proc.wait, 60)
    assert code == 0
    assert "drained" in first.log()
    assert _runs(tmp_path, "quick") == 0, "no turn started while draining"

    second = await trio.to_thread.run_sync(lambda: start(hosts("60")))
    async with ControlPlane(second.state_dir) as api:
        job_events = await session_events(api, job)
        quick_events = await session_events(api, quick)
    assert [e["status"] for e in edges(job_events)] == ["running", "idle"]
    assert text(job_events) == "starting. done."
    assert [e["status"] for e in edges(quick_events)] == ["running", "idle"]
    assert text(quick_events) == "starting. quick."
    assert (_runs(tmp_path, "job"), _runs(tmp_path, "quick")) == (1, 1)


async def test_a_turn_still_running_at_the_drain_deadline_fails_once_on_the_next_host(
    hosts: Callable[[str], HostProcess], tmp_path: Path
) -> None:
    first = await trio.to_thread.run_sync(lambda: start(hosts("1")))
    stuck = await _post(first, "stuck", "go")
    await trio.to_thread.run_sync(
        lambda: wait_until(lambda: _runs(tmp_path, "stuck"), 30, "the stuck turn's tool call")
    )
    assert first.proc is not None
    first.proc.send_signal(signal.SIGTERM)
    code = await trio.to_thread.run_sync(first.proc.wait, 30)
    assert code == 0
    assert "drain timed out after 1s; still in flight: {'dispatch': 1}" in first.log()

    second = await trio.to_thread.run_sync(lambda: start(hosts("1")))
    async with ControlPlane(second.state_dir) as api:
        events = await session_events(api, stuck)
    statuses = edges(events)
    assert [e["status"] for e in statuses] == ["running", "failed"]
    assert statuses[-1]["error"]["code"] == "harness_restarted"
    assert text(events) == "starting. "
    assert _runs(tmp_path, "stuck") == 1, "the tool call was not run again"


def test_a_second_sigterm_stops_a_draining_host_at_once(
    hosts: Callable[[str], HostProcess], tmp_path: Path
) -> None:
    first = start(hosts("600"))
    trio.run(_post, first, "stuck", "go")
    wait_until(lambda: _runs(tmp_path, "stuck"), 30, "the stuck turn's tool call")
    assert first.proc is not None
    first.proc.send_signal(signal.SIGTERM)
    first.wait_for(lambda s: s["host"]["state"] == "draining", 10, "draining")
    first.proc.send_signal(signal.SIGTERM)
    assert first.proc.wait(30) == 0
    assert "drain timed out" not in first.log()
