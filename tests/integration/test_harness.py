"""The harness actor and scripted workers through a real host (H-*, E-*, J-20..J-31)."""

from __future__ import annotations

import os
import signal

import pytest
import trio

from corral.harnesses.protocol import (
    Approval,
    InputAccepted,
    Interrupt,
    ToolResult,
)
from tests.conftest import DETECT_LIVENESS, HostProcess
from tests.integration._dispatch import fake_dispatch, scripted

#: The tests share one host (tests/conftest.py); each runs its own session ids, and those that
#: kill, stop or hang a worker are marked chaos and get a host of their own.
SHARE_HOST = True
#: The harness actor alone: a stand-in dispatch (``fake_dispatch``) drives it.
HOST_ACTORS = frozenset({"harness"})


def _worker_pid(host: HostProcess, session_id: str) -> int:
    state = host.ask("inspect", actor="harness")["state"]
    (w,) = [w for w in state["workers"] if w["session_id"] == session_id]
    return w["pid"]


async def test_h03_scripted_turn_streams_in_order_and_completes(host: HostProcess) -> None:
    async with fake_dispatch(host.endpoint) as d:
        turn = await d.start_turn("s1", scripted({"text": "hello world", "chunk": 3}))
        end = await d.terminal(turn)
        assert end.__struct_config__.tag == "response.completed"
        types = d.types(turn)
        assert types[:2] == ["response.created", "response.in_progress"]
        assert types[-1] == "response.completed"
        deltas = [e.delta for e in d.of_turn(turn) if hasattr(e, "delta")]
        assert "".join(deltas) == "hello world"
        assert deltas[0] == "hel"
        seqs = [e.sequence_number for e in d.of_turn(turn)]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        # The worker is reused for the next turn of the session (H-03).
        pid = _worker_pid(host, "s1")
        turn2 = await d.start_turn("s1", scripted({"text": "again"}))
        await d.terminal(turn2)
        assert _worker_pid(host, "s1") == pid


async def test_tool_call_round_trip(host: HostProcess) -> None:
    spec = scripted({"tool": "sys_os_shell", "arguments": {"command": "echo hi"}}, {"text": "done"})
    async with fake_dispatch(host.endpoint) as d:
        turn = await d.start_turn("s-tool", spec)
        call = await d.wait_for(lambda e: getattr(e, "item", {}).get("status") == "action_required")
        assert call.item["name"] == "sys_os_shell"
        reply = await d.send(
            ToolResult(session_id="s-tool", call_id=call.item["call_id"], output='{"stdout": "hi"}')
        )
        assert reply == InputAccepted(status=204)
        assert (await d.terminal(turn)).__struct_config__.tag == "response.completed"
        items = [e.item for e in d.of_turn(turn) if hasattr(e, "item")]
        assert [i.get("status", i["type"]) for i in items] == [
            "in_progress",
            "action_required",
            "completed",
            "function_call_output",
            "completed",
        ]
        assert items[3]["output"] == '{"stdout": "hi"}'
        # The text streamed after the call, whole, as the assistant message the server saves.
        assert (items[-1]["type"], items[-1]["content"][0]["text"]) == ("message", "done")


@pytest.mark.fresh_host  # it checks the host's whole list of elicitations and parked count
async def test_e01_elicitation_parked_then_accepted(host: HostProcess) -> None:
    spec = scripted(
        {"elicit": {"message": "May I deploy?"}},
        {"text": "Deployed.", "on_decline": "Not deployed."},
    )
    async with fake_dispatch(host.endpoint) as d:
        turn = await d.start_turn("s-el", spec)
        req = await d.wait_type("response.elicitation_request")
        rows = await trio.to_thread.run_sync(host.elicitations, req.elicitation_id)
        assert [(r["elicitation_id"], r["state"], r["session_id"], r["turn_id"]) for r in rows] == [
            (req.elicitation_id, "parked", "s-el", turn)
        ]
        assert rows[0]["params"] == {"message": "May I deploy?"}
        assert host.ask("mailboxes", actor="harness")["mailboxes"][0]["parked"] == 1
        reply = await d.send(
            Approval(
                session_id="s-el",
                elicitation_id=req.elicitation_id,
                action="accept",
                content={"note": "ok"},
            ),
            durable=True,
        )
        assert reply == InputAccepted(status=204)
        await d.terminal(turn)
        assert "".join(e.delta for e in d.of_turn(turn) if hasattr(e, "delta")) == "Deployed."
        assert host.ask("elicitations")["elicitations"][0]["state"] == "resolved"
        # A verdict for a resolved elicitation is a typed not-found and disturbs nothing.
        again = await d.send(
            Approval(session_id="s-el", elicitation_id=req.elicitation_id, action="accept"),
            durable=True,
        )
        assert isinstance(again, InputAccepted) and again.status == 404
        assert again.error["code"] == "not_found"


async def test_e02_decline_takes_the_on_decline_text(host: HostProcess) -> None:
    spec = scripted(
        {"elicit": {"message": "?"}}, {"text": "Deployed.", "on_decline": "Not deployed."}
    )
    async with fake_dispatch(host.endpoint) as d:
        turn = await d.start_turn("s-dec", spec)
        req = await d.wait_type("response.elicitation_request")
        reply = await d.send(
            Approval(session_id="s-dec", elicitation_id=req.elicitation_id, action="decline"),
            durable=True,
        )
        assert reply == InputAccepted(status=204)
        await d.terminal(turn)
        assert "".join(e.delta for e in d.of_turn(turn) if hasattr(e, "delta")) == "Not deployed."


@pytest.mark.chaos
async def test_kill9_worker_mid_stream_fails_the_turn_then_a_fresh_worker_serves(
    host: HostProcess,
) -> None:
    spec = scripted({"text": "x", "repeat": 1000, "delay_ms": 5})
    async with fake_dispatch(host.endpoint) as d:
        turn = await d.start_turn("s-k", spec)
        await d.wait_type("response.output_text.delta")
        pid = _worker_pid(host, "s-k")
        os.kill(pid, signal.SIGKILL)
        end = await d.terminal(turn, timeout=5)
        assert end.__struct_config__.tag == "response.failed"
        assert end.error["code"] == "harness_crashed"
        assert "killed by signal 9" in end.error["message"]
        turn2 = await d.start_turn("s-k", scripted({"text": "fresh"}))
        assert (await d.terminal(turn2)).__struct_config__.tag == "response.completed"
        assert _worker_pid(host, "s-k") != pid
        assert [e.__struct_config__.tag for e in d.of_turn(turn)].count("response.failed") == 1


@pytest.mark.chaos
async def test_kill9_worker_while_parked_cancels_the_elicitation(host: HostProcess) -> None:
    spec = scripted({"elicit": {"message": "wait"}}, {"text": "never"})
    async with fake_dispatch(host.endpoint) as d:
        turn = await d.start_turn("s-p", spec)
        req = await d.wait_type("response.elicitation_request")
        os.kill(_worker_pid(host, "s-p"), signal.SIGKILL)
        resolved = await d.wait_type("response.elicitation_resolved")
        assert resolved.elicitation_id == req.elicitation_id
        assert (resolved.action, resolved.reason) == ("cancel", "harness_restarted")
        end = await d.terminal(turn)
        assert end.error["code"] == "harness_restarted"
        row = host.ask("elicitations")["elicitations"][0]
        assert (row["state"], row["reason"]) == ("cancelled", "harness_restarted")
        late = await d.send(
            Approval(session_id="s-p", elicitation_id=req.elicitation_id, action="accept"),
            durable=True,
        )
        assert isinstance(late, InputAccepted) and late.status == 404


@pytest.mark.chaos
async def test_hung_worker_fails_the_turn_within_its_liveness_window(host_factory) -> None:
    host = host_factory(DETECT_LIVENESS).start()
    async with fake_dispatch(host.endpoint) as d:
        turn = await d.start_turn("s-h", scripted({"text": "a"}, {"hang": True}))
        await d.wait_type("response.output_text.delta")
        with trio.fail_after(3):
            end = await d.terminal(turn)
        assert end.error["code"] == "harness_crashed", end
        assert "no heartbeat" in end.error["message"], end


async def test_scripted_fail_and_crash(host: HostProcess) -> None:
    async with fake_dispatch(host.endpoint) as d:
        turn = await d.start_turn(
            "s-f", scripted({"text": "partial"}, {"fail": {"code": "boom", "message": "it broke"}})
        )
        end = await d.terminal(turn)
        assert end.error == {"code": "boom", "message": "it broke"}
        turn = await d.start_turn("s-c", scripted({"crash": 7}))
        end = await d.terminal(turn)
        assert end.error["code"] == "harness_crashed"
        assert "exited with code 7" in end.error["message"]


async def test_unknown_harness_fails_once_with_a_clear_error(host: HostProcess) -> None:
    async with fake_dispatch(host.endpoint) as d:
        turn = await d.start_turn("s-u", {"executor": {"harness": "nope"}})
        end = await d.terminal(turn)
        assert end.error == {"code": "unknown_harness", "message": "no harness named 'nope'"}


async def test_interrupt_cancels_the_turn(host: HostProcess) -> None:
    async with fake_dispatch(host.endpoint) as d:
        turn = await d.start_turn("s-i", scripted({"text": "x", "repeat": 1000, "delay_ms": 5}))
        await d.wait_type("response.output_text.delta")
        assert await d.send(Interrupt(session_id="s-i")) == InputAccepted(status=204)
        end = await d.terminal(turn)
        assert end.__struct_config__.tag == "response.cancelled"


async def test_j20_j25_runtime_model_observations(host: HostProcess) -> None:
    spec = scripted(
        {"serve": {"model": "primary", "provider": "anthropic", "fallback": False}},
        {"reasoning": "thinking"},
        {"serve": {"model": "backup", "provider": "custom", "fallback": True}},
        {"text": "answer"},
        {"status": "Switched to fallback: backup (custom)"},
    )
    async with fake_dispatch(host.endpoint) as d:
        turn = await d.start_turn("s-j", spec)
        await d.terminal(turn)
        types = d.types(turn)
        observed = [e for e in d.of_turn(turn) if e.__struct_config__.tag == "runtime_model"]
        assert [o.model for o in observed] == ["primary", "backup", "backup"]
        assert types.index("runtime_model") < types.index("response.reasoning_text.delta")
        last_rm = len(types) - 1 - types[::-1].index("runtime_model")
        assert types.index("warning") < last_rm
        o = observed[-1]
        assert (o.session_id, o.stream_id, o.model, o.provider, o.fallback_active, o.phase) == (
            "s-j",
            turn,
            "backup",
            "custom",
            True,
            "observed_output",
        )


async def test_j26_j28_no_observation_for_attempts_unknown_models_or_failures(
    host: HostProcess,
) -> None:
    async with fake_dispatch(host.endpoint) as d:
        turn = await d.start_turn(
            "s-j2",
            scripted(
                {"serve": {"model": "backup", "provider": "custom", "fallback": True}},
                {"status": "Trying fallback backup"},
                {"serve": {"model": None, "provider": "custom", "fallback": True}},
                {"text": "partial"},
                {"fail": {"code": "provider_unavailable", "message": "provider unavailable"}},
            ),
        )
        await d.terminal(turn)
        assert "runtime_model" not in d.types(turn)
        turn = await d.start_turn("s-j3", scripted({"text": "no model known"}))
        end = await d.terminal(turn)
        assert "runtime_model" not in d.types(turn)
        assert not end.response.get("usage", {}).get("used_model")


async def test_j31_nonstreaming_success_observes_once(host: HostProcess) -> None:
    async with fake_dispatch(host.endpoint) as d:
        turn = await d.start_turn(
            "s-j4", scripted({"serve": {"model": "backup", "provider": "custom", "fallback": True}})
        )
        await d.terminal(turn)
        assert [e.model for e in d.of_turn(turn) if e.__struct_config__.tag == "runtime_model"] == [
            "backup"
        ]


@pytest.mark.chaos
async def test_kill9_worker_mid_tool_call_fails_the_turn_and_late_results_are_404(
    host: HostProcess,
) -> None:
    spec = scripted(
        {"tool": "sys_os_shell", "arguments": {"command": "sleep 100"}}, {"text": "never"}
    )
    async with fake_dispatch(host.endpoint) as d:
        turn = await d.start_turn("s-kt", spec)
        call = await d.wait_for(lambda e: getattr(e, "item", {}).get("status") == "action_required")
        os.kill(_worker_pid(host, "s-kt"), signal.SIGKILL)
        end = await d.terminal(turn)
        assert end.error["code"] == "harness_crashed"
        late = await d.send(
            ToolResult(session_id="s-kt", call_id=call.item["call_id"], output="{}")
        )
        assert isinstance(late, InputAccepted) and late.status == 404


@pytest.mark.chaos
async def test_sigstopped_worker_is_killed_and_the_turn_fails_within_the_window(
    host_factory,
) -> None:
    host = host_factory(DETECT_LIVENESS).start()
    async with fake_dispatch(host.endpoint) as d:
        turn = await d.start_turn("s-stop", scripted({"text": "x", "repeat": 1000, "delay_ms": 5}))
        await d.wait_type("response.output_text.delta")
        pid = _worker_pid(host, "s-stop")
        os.kill(pid, signal.SIGSTOP)
        with trio.fail_after(3):
            end = await d.terminal(turn)
        assert end.error["code"] == "harness_crashed"
        assert "no heartbeat" in end.error["message"]
