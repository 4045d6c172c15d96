"""Worker supervision: the reaper, spawn env, start failures, and the harness actor's own crash."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import trio

from corral.actors._process import alive, start_time
from corral.harnesses.protocol import InputAccepted, is_terminal
from tests.conftest import FAST_LIVENESS, HostProcess, wait_until
from tests.integration._dispatch import fake_dispatch, scripted

#: The harness actor alone: a stand-in dispatch (``fake_dispatch``) drives it.
HOST_ACTORS = frozenset({"harness"})


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return False


def _workers(host: HostProcess) -> list[dict]:
    return host.ask("inspect", actor="harness")["state"]["workers"]


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


async def test_h09_spawn_env_has_the_harness_model_and_no_host_secrets(host_factory) -> None:
    os.environ["CORRAL_TEST_SECRET_TOKEN"] = "do-not-leak"
    try:
        host = host_factory().start()
    finally:
        del os.environ["CORRAL_TEST_SECRET_TOKEN"]
    spec = scripted({"text": "x"})
    spec["executor"]["model"] = "spec-model"
    async with fake_dispatch(host.endpoint) as d:
        turn = await d.start_turn("s-env", spec, model_override="override-model")
        await d.terminal(turn)
        (w,) = _workers(host)
        env = _environ(w["pid"])
    assert env["HARNESS_SCRIPTED_MODEL"] == "override-model"
    assert "CORRAL_TEST_SECRET_TOKEN" not in env
    host.stop()


async def test_h11_spawn_env_error_fails_the_turn(host: HostProcess) -> None:
    spec = scripted({"text": "x"})
    spec["executor"]["auth"] = {"type": "api_key", "api_key": "$CORRAL_TEST_UNSET_KEY"}
    async with fake_dispatch(host.endpoint) as d:
        turn = await d.start_turn("s-envfail", spec)
        end = await d.terminal(turn)
    assert end.error["code"] == "turn_setup_failed"
    assert end.error["message"].startswith("turn setup failed: ")
    assert "$CORRAL_TEST_UNSET_KEY" in end.error["message"]


async def test_worker_module_that_raises_on_import_fails_the_turn_once(host_factory) -> None:
    host = host_factory(
        FAST_LIVENESS
        + '[actors.harness.options.harnesses]\nbroken = "tests.integration._broken_harness:Nope"\n'
    ).start()
    async with fake_dispatch(host.endpoint) as d:
        turn = await d.start_turn("s-broken", {"executor": {"harness": "broken"}})
        end = await d.terminal(turn)
        assert end.error["code"] == "harness_unavailable"
        assert "could not be loaded" in end.error["message"]
        stats = host.ask("inspect", actor="harness")["state"]
        assert stats["spawned"] == 1, "one attempt, not a retry storm"
    host.stop()


async def test_h08_reaper_spares_in_flight_turns_and_reaps_idle_workers(host_factory) -> None:
    host = host_factory(FAST_LIVENESS + "[actors.harness.options]\nidle_timeout_s = 0.5\n").start()
    async with fake_dispatch(host.endpoint) as d:
        # A turn far longer than the idle timeout is never reaped.
        turn = await d.start_turn("s-long", scripted({"text": "x", "repeat": 20, "delay_ms": 100}))
        end = await d.terminal(turn, timeout=20)
        assert end.__struct_config__.tag == "response.completed"
        assert len([e for e in d.of_turn(turn) if hasattr(e, "delta")]) == 20
        # Idle afterwards: reaped.
        await trio.to_thread.run_sync(
            lambda: wait_until(lambda: not _workers(host), 10, "idle worker reaped")
        )
        assert host.ask("inspect", actor="harness")["state"]["reaped"] == 1
        # The next turn gets a new worker at once, even right at the reaper's moment.
        turn = await d.start_turn("s-long", scripted({"text": "again"}))
        end = await d.terminal(turn)
        assert end.__struct_config__.tag == "response.completed", end
    host.stop()


@pytest.mark.chaos
async def test_h03_kill9_harness_actor_mid_turn_its_adopted_worker_completes_the_turn(
    host: HostProcess,
) -> None:
    """#15: a harness actor's crash leaves its workers running (they die with the host, not
    with it); its next incarnation adopts the session's worker and owns the turn again from
    its redelivered start without sending it again. The turn completes, every delta once and
    in order, one terminal; the session's next turn runs on the same process (H-03). It used
    to end ``harness_restarted``, the worker killed with its harness actor."""
    async with fake_dispatch(host.endpoint) as d:
        turn = await d.start_turn("s-ha", scripted({"text": "x", "repeat": 1000, "delay_ms": 5}))
        await d.wait_type("response.output_text.delta")
        (w,) = _workers(host)
        worker_started = start_time(w["pid"])
        before = host.actor("harness")
        os.kill(before["pid"], signal.SIGKILL)
        await trio.to_thread.run_sync(lambda: host.restarted("harness", before))
        end = await d.terminal(turn, timeout=30)
        assert end.__struct_config__.tag == "response.completed", end
        events = d.of_turn(turn)
        assert [e.sequence_number for e in events] == list(range(len(events))), "once, in order"
        assert [e.delta for e in events if hasattr(e, "delta")] == ["x"] * 1000
        assert [is_terminal(e) for e in events].count(True) == 1
        (adopted,) = _workers(host)
        assert (adopted["pid"], start_time(adopted["pid"])) == (w["pid"], worker_started)
        turn2 = await d.start_turn("s-ha", scripted({"text": "after"}))
        assert (await d.terminal(turn2)).__struct_config__.tag == "response.completed"
        assert [x["pid"] for x in _workers(host)] == [w["pid"]], "the same worker"


async def test_inputs_for_a_session_without_worker_are_404(host: HostProcess) -> None:
    from corral.harnesses.protocol import Interrupt

    async with fake_dispatch(host.endpoint) as d:
        reply = await d.send(Interrupt(session_id="nobody"))
    assert reply.status == 404


async def test_h06_a_deep_state_dir_still_gets_short_socket_paths(host_factory) -> None:
    deep = "d" * 60 + "/" + "e" * 60
    host = host_factory(name=deep).start()
    assert len(str(host.instance.state_dir / "bus.sock")) > 107
    assert len(host.endpoint) - len("ipc://") <= 107
    async with fake_dispatch(host.endpoint) as d:
        turn = await d.start_turn("s-deep", scripted({"text": "ok"}))
        assert (await d.terminal(turn)).__struct_config__.tag == "response.completed"
    host.stop()


async def test_h07_workers_are_reaped_when_the_host_stops_and_shown_in_status(host_factory) -> None:
    from tests.conftest import processes_of

    host = host_factory().start()
    async with fake_dispatch(host.endpoint) as d:
        for i in range(3):
            turn = await d.start_turn(f"s-stop-{i}", scripted({"text": "ok"}))
            await d.terminal(turn)
    status = host.status()
    sessions = sorted(w["session_id"] for w in status["workers"])
    assert sessions == ["s-stop-0", "s-stop-1", "s-stop-2"]
    pids = {w["pid"]: start_time(w["pid"]) for w in status["workers"]}
    assert host.stop() == 0
    assert processes_of(host.state_dir) == []
    for pid, started in pids.items():
        assert not alive(pid, started) or _zombie(pid)


@pytest.mark.chaos
async def test_e01_kill9_harness_actor_while_parked_the_elicitation_stays_parked(
    host: HostProcess,
) -> None:
    """#15: the parked entry outlives the harness actor, and so does the worker waiting on
    it: the actor's next incarnation keeps the elicitation parked (no cancel), an Approval
    sent after the restart reaches the worker, and the turn completes with one terminal. It
    used to be cancelled ``harness_restarted`` and the turn failed."""
    from corral.harnesses.protocol import Approval

    spec = scripted({"elicit": {"message": "wait"}}, {"text": "accepted", "on_decline": "no"})
    async with fake_dispatch(host.endpoint) as d:
        turn = await d.start_turn("s-hp", spec)
        req = await d.wait_type("response.elicitation_request")
        # The request reaches dispatch and the park reaches the harness actor on their own
        # ways: the kill must come after the park (CI once asked in between).
        await trio.to_thread.run_sync(
            lambda: host.wait_for(
                lambda answer: [row["state"] for row in answer["elicitations"]] == ["parked"],
                10,
                "the elicitation parked",
                op="elicitations",
            )
        )
        before = host.actor("harness")
        os.kill(before["pid"], signal.SIGKILL)
        await trio.to_thread.run_sync(lambda: host.restarted("harness", before))
        assert host.ask("inspect", actor="harness")["state"]["parked"] == [req.elicitation_id]
        row = host.ask("elicitations")["elicitations"][0]
        assert row["state"] == "parked", row
        reply = await d.send(
            Approval(session_id="s-hp", elicitation_id=req.elicitation_id, action="accept"),
            durable=True,
        )
        assert reply == InputAccepted(status=204)
        end = await d.terminal(turn, timeout=15)
        assert end.__struct_config__.tag == "response.completed", end
        assert "".join(e.delta for e in d.of_turn(turn) if hasattr(e, "delta")) == "accepted"
        assert "response.elicitation_resolved" not in _tags(d.of_turn(turn)), "never cancelled"
        assert host.ask("elicitations")["elicitations"][0]["state"] == "resolved"
        assert [is_terminal(e) for e in d.of_turn(turn)].count(True) == 1


def _tags(events: list) -> list[str]:
    return [e.__struct_config__.tag for e in events]


async def test_d31_a_start_while_the_sessions_previous_turn_runs_supersedes_it(
    host: HostProcess,
) -> None:
    """Dispatch sends a turn's start only once the session's previous turn is over for it
    (its watchdog or a failed tool call ended it, or a restart): the harness actor may still
    hold that turn, its worker running it. The new turn used to fail ``turn_in_flight`` (6
    of 100 turns in a chaos run); it now waits while the worker is told to stop the stale
    one, and runs after that turn's end — never two turns at once in the worker."""
    async with fake_dispatch(host.endpoint) as d:
        stale = await d.start_turn("s-supersede", scripted({"sleep_ms": 30000}))
        await d.wait_type("response.in_progress", turn_id=stale)
        turn = await d.start_turn("s-supersede", scripted({"text": "second"}))
        end = await d.terminal(turn)
        assert end.__struct_config__.tag == "response.completed", end
        ended = await d.terminal(stale, timeout=1)
        assert ended.__struct_config__.tag == "response.cancelled", "interrupted, not refused"
        order = [(e.turn_id, is_terminal(e)) for e in d.events]
        assert order.index((stale, True)) < order.index((turn, False)), "one turn at a time"
        (w,) = _workers(host)
        assert host.ask("inspect", actor="harness")["state"]["spawned"] == 1, "one worker"
        assert w["in_flight"] is False


async def test_d31_a_start_queued_behind_a_stale_one_runs_and_the_stale_one_does_not(
    host: HostProcess,
) -> None:
    """Two starts of one session back to back (a restarted harness actor is handed the
    stale start again, and the new one behind it): the first is over for dispatch, so it
    ends without running and the second runs. The second used to fail ``turn_in_flight``."""
    async with fake_dispatch(host.endpoint) as d:
        stale = await d.start_turn("s-queued", scripted({"text": "stale"}))
        turn = await d.start_turn("s-queued", scripted({"text": "second"}))
        end = await d.terminal(turn)
        assert end.__struct_config__.tag == "response.completed", end
        ended = await d.terminal(stale, timeout=1)
        assert [is_terminal(e) for e in d.of_turn(stale)].count(True) == 1, "one end"
        if ended.__struct_config__.tag == "response.failed":
            assert ended.error["code"] == "superseded"
        order = [(e.turn_id, is_terminal(e)) for e in d.events]
        assert order.index((stale, True)) < order.index((turn, False)), "one turn at a time"
