"""A harness actor's crash leaves its workers to its next incarnation (#15, H-07).

Workers die with the host, not with the harness actor: the host is a child subreaper, so a
dead harness actor's workers become the host's children, and the actor's next incarnation
adopts them (tests/integration/test_harness_supervision.py has the turn that completes
across the restart and the elicitation that stays parked). These are the other cases:
workers that die with their harness actor, a turn that ends while no harness actor runs,
and a host that dies with its workers.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import trio

from corral.actors._process import start_time
from corral.harnesses.protocol import is_terminal
from tests.conftest import FAST_LIVENESS, HostProcess, process_gone, processes_of, wait_until
from tests.integration._dispatch import fake_dispatch, scripted

#: The harness actor alone: a stand-in dispatch (``fake_dispatch``) drives it.
HOST_ACTORS = frozenset({"harness"})

pytestmark = pytest.mark.chaos


def _pids(host: HostProcess) -> dict[str, int]:
    workers = host.ask("inspect", actor="harness")["state"]["workers"]
    return {w["session_id"]: w["pid"] for w in workers}


def _held(host: HostProcess) -> int:
    """How many messages the harness actor has said it holds (its turns' starts)."""
    (row,) = [m for m in host.ask("mailboxes")["mailboxes"] if m["actor"] == "harness"]
    return int(row["held"])


def _terminals(events: list) -> list:
    return [e for e in events if is_terminal(e)]


async def _no_second_end(d, turns: tuple[str, ...]) -> None:
    """No turn of ``turns`` gets a second terminal within a second (a late one would)."""
    with pytest.raises(trio.TooSlowError):
        await d.wait_for(lambda _: any(len(_terminals(d.of_turn(t))) > 1 for t in turns), 1)


async def test_h07_workers_killed_with_their_harness_actor_end_their_turns_once(
    host: HostProcess,
) -> None:
    """The harness actor is killed, and two of its three workers while it is down: the
    streaming turn and the parked one of the dead workers end ``harness_restarted`` once (the
    parked elicitation cancelled first), and the third worker's turn completes."""
    long = scripted({"text": "x", "repeat": 600, "delay_ms": 5})
    async with fake_dispatch(host.endpoint) as d:
        streaming = await d.start_turn("s-dead-stream", long)
        parked = await d.start_turn("s-dead-parked", scripted({"elicit": {"message": "?"}}))
        survivor = await d.start_turn("s-alive", long)
        req = await d.wait_type("response.elicitation_request", turn_id=parked)
        await d.wait_type("response.output_text.delta", turn_id=streaming)
        await d.wait_type("response.output_text.delta", turn_id=survivor)
        pids = _pids(host)
        before = host.actor("harness")
        os.kill(before["pid"], signal.SIGKILL)
        os.kill(pids["s-dead-stream"], signal.SIGKILL)
        os.kill(pids["s-dead-parked"], signal.SIGKILL)
        await trio.to_thread.run_sync(lambda: host.restarted("harness", before))
        for turn in (streaming, parked):
            end = await d.terminal(turn, timeout=20)
            assert end.error["code"] == "harness_restarted", end
        tag = "response.elicitation_resolved"
        resolved = [e for e in d.of_turn(parked) if e.__struct_config__.tag == tag]
        assert [(e.elicitation_id, e.action, e.reason) for e in resolved] == [
            (req.elicitation_id, "cancel", "harness_restarted")
        ]
        tags = [e.__struct_config__.tag for e in d.of_turn(parked)]
        assert tags.index(tag) < tags.index("response.failed"), "the prompt closes first"
        end = await d.terminal(survivor, timeout=30)
        assert end.__struct_config__.tag == "response.completed", end
        await _no_second_end(d, (streaming, parked, survivor))
        row = host.ask("elicitations")["elicitations"][0]
        assert (row["state"], row["reason"]) == ("cancelled", "harness_restarted")


async def test_h07_a_turn_its_worker_ends_while_no_harness_actor_runs_ends_once(
    host: HostProcess,
) -> None:
    """The worker ends its turn while its harness actor is stopped and then killed: its
    terminal waits in the actor's mailbox behind the turn's start. The next incarnation
    owns the redelivered start again (its adopted worker says it ended that turn, or the
    terminal comes first) and the terminal ends it: completed, once, no hang, the start
    acked once the terminal is out. The start's own job used to ack it while the terminal
    was still being sent (a crash then lost the turn's end), and the terminal acked it
    again."""
    async with fake_dispatch(host.endpoint) as d:
        turn = await d.start_turn("s-ended", scripted({"text": "y", "repeat": 20, "delay_ms": 10}))
        await d.wait_type("response.output_text.delta", turn_id=turn)
        before = host.actor("harness")
        os.kill(before["pid"], signal.SIGSTOP)
        try:
            # The assistant message goes out whole just before the terminal (to the actor).
            await d.wait_for(
                lambda e: e.turn_id == turn and getattr(e, "item", {}).get("type") == "message"
            )
        finally:
            os.kill(before["pid"], signal.SIGKILL)
        await trio.to_thread.run_sync(lambda: host.restarted("harness", before))
        end = await d.terminal(turn, timeout=20)
        assert end.__struct_config__.tag == "response.completed", end
        await _no_second_end(d, (turn,))
    assert "resolved twice" not in host.log(), "its start acked once, after its terminal"


async def test_h07_kill9_of_the_host_leaves_no_worker_and_the_next_host_kills_a_stopped_one(
    host_factory,
) -> None:
    """A worker dies with its host, watched through a pidfd (not with its harness actor):
    ``kill -9`` of the host leaves none running. A worker that was stopped then cannot see
    its host go; the next host's harness actor finds it by its pid file, which names the
    dead host, and kills it instead of adopting it."""
    host = host_factory().start()
    async with fake_dispatch(host.endpoint) as d:
        turn = await d.start_turn("s-busy", scripted({"text": "z", "repeat": 3000, "delay_ms": 5}))
        await d.wait_type("response.output_text.delta", turn_id=turn)
        idle = await d.start_turn("s-stopped", scripted({"text": "ok"}))
        await d.terminal(idle)
        pids = _pids(host)
    stopped = pids["s-stopped"]
    stopped_start = start_time(stopped)
    os.kill(stopped, signal.SIGSTOP)
    host.kill9()
    await trio.to_thread.run_sync(
        lambda: wait_until(
            lambda: processes_of(host.state_dir) == [stopped], 10, "only the stopped worker"
        )
    )
    host.start()
    await trio.to_thread.run_sync(
        lambda: wait_until(lambda: process_gone(stopped, stopped_start), 10, "killed at start")
    )
    assert host.stop() == 0
    assert processes_of(host.state_dir) == []


async def test_e01_a_turn_held_by_its_worker_outlives_its_actors_restarts(
    host_factory,
) -> None:
    """A turn's start stays in flight for the whole turn, and its harness actor says it
    holds it once the worker runs it: the actor's restarts are not charged to it. With
    ``max_attempts = 1`` the broker used to dead-letter the start at the first restart (each
    restart was charged to the oldest unacked message), leaving a turn nobody would end if
    its worker went. Here, after two restarts, nothing is dead-lettered, the elicitation its
    worker waits on stays parked, and the interrupted turn closes it ``turn_ended`` and ends
    once."""
    from corral.harnesses.protocol import Interrupt

    host = host_factory(FAST_LIVENESS + "[bus]\nmax_attempts = 1\n").start()
    async with fake_dispatch(host.endpoint) as d:
        turn = await d.start_turn("s-lost", scripted({"elicit": {"message": "?"}}))
        req = await d.wait_type("response.elicitation_request", turn_id=turn)
        for _ in range(2):
            await trio.to_thread.run_sync(
                lambda: wait_until(lambda: _held(host) == 1, 10, "the start held")
            )
            before = host.actor("harness")
            os.kill(before["pid"], signal.SIGKILL)
            await trio.to_thread.run_sync(host.restarted, "harness", before)
        assert host.ask("dead_letters")["dead_letters"] == []
        assert host.ask("elicitations")["elicitations"][0]["state"] == "parked"
        reply = await d.send(Interrupt(session_id="s-lost"))
        assert reply.status == 204, reply
        resolved = await d.wait_type("response.elicitation_resolved", turn_id=turn)
        assert (resolved.elicitation_id, resolved.reason) == (req.elicitation_id, "turn_ended")
        row = host.ask("elicitations")["elicitations"][0]
        assert (row["state"], row["reason"]) == ("cancelled", "turn_ended")
        end = await d.terminal(turn)
        assert end.__struct_config__.tag == "response.cancelled", end
        await _no_second_end(d, (turn,))
    host.stop()


async def test_h07_an_adopted_worker_that_does_not_say_what_it_holds_is_killed(
    host: HostProcess,
) -> None:
    """A worker stopped across its harness actor's restart cannot answer the new
    incarnation's inventory: it is killed once its liveness window is over and its turn ends
    ``harness_restarted``, once; a worker that answered runs its turn to the end."""
    long = scripted({"text": "x", "repeat": 800, "delay_ms": 5})
    async with fake_dispatch(host.endpoint) as d:
        stuck = await d.start_turn("s-stuck", long)
        fine = await d.start_turn("s-fine", long)
        await d.wait_type("response.output_text.delta", turn_id=stuck)
        await d.wait_type("response.output_text.delta", turn_id=fine)
        pids = _pids(host)
        stopped_start = start_time(pids["s-stuck"])
        before = host.actor("harness")
        os.kill(pids["s-stuck"], signal.SIGSTOP)
        os.kill(before["pid"], signal.SIGKILL)
        end = await d.terminal(stuck, timeout=20)
        assert end.error["code"] == "harness_restarted", end
        gone = lambda: process_gone(pids["s-stuck"], stopped_start)  # noqa: E731
        await trio.to_thread.run_sync(lambda: wait_until(gone, 10, "the stopped worker killed"))
        end = await d.terminal(fine, timeout=30)
        assert end.__struct_config__.tag == "response.completed", end
        assert _pids(host)["s-fine"] == pids["s-fine"]
        await _no_second_end(d, (stuck, fine))
    assert "did not say what it holds" in host.log()


async def test_h07_a_worker_its_dead_actor_wrote_no_pid_file_of_is_killed(
    host: HostProcess,
) -> None:
    """A harness actor killed between a worker's spawn and its pid file's write leaves a
    worker nobody knows of: reparented to the host, it would live as long as the host. The
    next incarnation finds it among the host's children and kills it; its turn ends
    ``harness_restarted``, once. (The pid file is removed by hand: the race is a few ms.)"""
    long = scripted({"text": "x", "repeat": 3000, "delay_ms": 5})
    async with fake_dispatch(host.endpoint) as d:
        turn = await d.start_turn("s-unrecorded", long)
        await d.wait_type("response.output_text.delta", turn_id=turn)
        worker = _pids(host)["s-unrecorded"]
        worker_start = start_time(worker)
        (pidfile,) = [
            f for f in host.state_dir.rglob("*.pid") if f'"pid": {worker},' in f.read_text()
        ]
        pidfile.unlink()
        before = host.actor("harness")
        os.kill(before["pid"], signal.SIGKILL)
        gone = lambda: process_gone(worker, worker_start)  # noqa: E731
        await trio.to_thread.run_sync(lambda: wait_until(gone, 15, "the unrecorded worker killed"))
        end = await d.terminal(turn, timeout=20)
        assert end.error["code"] == "harness_restarted", end
        await _no_second_end(d, (turn,))
    assert "workers with no pid file" in host.log()


async def test_h07_a_start_on_its_last_delivery_fails_the_turn_instead_of_trying_again(
    host_factory,
) -> None:
    """A start its harness actor keeps dying on (here: killed while the worker it spawned
    hangs importing its harness, twice would do it) is charged an attempt each time; on the
    broker's last delivery (``max_attempts = 2``) the turn ends ``harness_crashed`` at once
    instead of being tried again — a last failure would dead-letter the start and leave a
    turn nobody ends, hung until dispatch's watchdog (15 minutes)."""
    host = host_factory(
        FAST_LIVENESS
        + "[bus]\nmax_attempts = 2\n"
        + "[actors.harness.options.harnesses]\n"
        + 'slow = "tests.integration._slow_start_harness:SlowStart"\n'
    ).start()
    before = host.actor("harness")
    marker = Path(f"/tmp/corral-slow-start-{before['pid']}")
    try:
        async with fake_dispatch(host.endpoint) as d:
            turn = await d.start_turn("s-poison", {"name": "slow", "executor": {"harness": "slow"}})
            await trio.to_thread.run_sync(
                lambda: wait_until(marker.exists, 15, "the worker importing its harness")
            )
            os.kill(before["pid"], signal.SIGKILL)
            end = await d.terminal(turn, timeout=20)
            assert end.error["code"] == "harness_crashed", end
            assert "failed to start this turn once" in end.error["message"], end
            await _no_second_end(d, (turn,))
        assert host.ask("dead_letters")["dead_letters"] == []
    finally:
        marker.unlink(missing_ok=True)
    host.stop()


async def test_a_tool_result_after_a_harness_restart_reaches_the_adopted_worker(
    host: HostProcess,
) -> None:
    """Inputs for an adopted worker's session are forwarded as for any worker: a tool
    result sent after its harness actor's restart reaches the worker waiting on it, and the
    turn completes once (it used to be a 404 ``no_worker``, the turn failed)."""
    from corral.harnesses.protocol import InputAccepted, ToolResult

    spec = scripted({"tool": "sys_os_shell", "arguments": {"command": "echo hi"}}, {"text": "ok"})
    async with fake_dispatch(host.endpoint) as d:
        turn = await d.start_turn("s-tool-adopted", spec)
        call = await d.wait_for(lambda e: getattr(e, "item", {}).get("status") == "action_required")
        before = host.actor("harness")
        os.kill(before["pid"], signal.SIGKILL)
        await trio.to_thread.run_sync(lambda: host.restarted("harness", before))
        result = ToolResult(
            session_id="s-tool-adopted", call_id=call.item["call_id"], output='{"stdout": "hi"}'
        )
        assert await d.send(result) == InputAccepted(status=204)
        end = await d.terminal(turn, timeout=15)
        assert end.__struct_config__.tag == "response.completed", end
        await _no_second_end(d, (turn,))
