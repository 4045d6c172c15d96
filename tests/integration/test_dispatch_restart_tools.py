"""A turn with tool calls in flight survives ``kill -9`` of dispatch and still knows about them.

A restarted dispatch resumes the active turn (its worker keeps streaming), so the turn must
still know which calls it sent to policy and which were answered: TurnEnded must reach
policy when the turn ends (a parked ASK is cancelled, not left hanging), and the idle
watchdog must spare a turn while a human decides but not afterwards.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.conftest import FAST_LIVENESS, HostProcess, wait_until
from tests.fake_server import FakeOmnigentServer
from tests.integration._gateway import FakeGateway, fake_gateway, scripted_yaml
from tests.integration.test_tools_policy import (
    _ask,
    _verdict,
    agent,
    of_type,
    outputs,
    phase_policy,
    restarted,
    tool,
)

#: Short enough for a test to watch the idle watchdog act, long enough for a worker to start.
IDLE_TIMEOUT_S = 3


def _host(host_factory, server: FakeOmnigentServer, dispatch_extra: str = "") -> HostProcess:
    url = json.dumps(server.base_url)
    return host_factory(
        FAST_LIVENESS
        + f"[actors.dispatch.options]\nserver_url = {url}\n"
        + 'subscribers = ["test-gateway"]\n'
        + dispatch_extra
        + f"[actors.policy.options]\nserver_url = {url}\n"
    ).start()


async def _kill9_dispatch(host: HostProcess) -> None:
    before = host.actor("dispatch")
    os.kill(before["pid"], signal.SIGKILL)
    await restarted(host, "dispatch", before)


async def _elicitation_state(host: HostProcess, eid: str, *states: str) -> dict[str, Any]:
    """Wait until the elicitation ``eid`` is in one of ``states``; its row."""

    def row(answer: dict[str, Any]) -> dict[str, Any] | None:
        rows = answer["elicitations"]
        return next((r for r in rows if r["elicitation_id"] == eid and r["state"] in states), None)

    return await trio.to_thread.run_sync(
        lambda: host.wait_for(row, 20, f"elicitation {eid} in state {states}", op="elicitations")
    )


@pytest.mark.chaos
async def test_d18_kill9_dispatch_during_an_ask_then_ending_the_turn_cancels_the_ask(
    host_factory, server, tmp_path: Path
) -> None:
    """The resumed turn still sends TurnEnded: policy cancels the ASK it parked for it."""
    host = _host(host_factory, server)
    server.policy = phase_policy(PHASE_TOOL_CALL="POLICY_ACTION_ASK")
    agent_id, sid = agent(server, tmp_path, [tool("sys_os_write", path="no.txt", content="x")])
    async with fake_gateway(host.endpoint) as gw:
        await gw.init(sid, agent_id)
        await gw.message(sid, "go")
        eid = (await _ask(gw, sid))["elicitation_id"]
        await _kill9_dispatch(host)
        reply = await gw.request("POST", f"/v1/sessions/{sid}/events", {"type": "interrupt"})
        assert (reply.status, reply.body) == (204, b"")
        assert await gw.until_status(sid, timeout=30) == ["running", "idle"]
        row = await _elicitation_state(host, eid, "cancelled", "resolved")
        assert (row["state"], row["reason"]) == ("cancelled", "turn_ended")
        # Nobody waits on it any more: a late verdict finds nothing and runs nothing.
        late = {"type": "approval", "data": {"elicitation_id": eid, "action": "accept"}}
        reply = await gw.request("POST", f"/v1/sessions/{sid}/events", late)
        assert reply.status == 404
    assert not (tmp_path / "no.txt").exists()
    host.stop()


async def _ended_by_watchdog(gw: FakeGateway, sid: str) -> None:
    assert await gw.until_status(sid, timeout=30) == ["running", "failed"]
    assert gw.events[sid][-1]["error"]["code"] == "turn_watchdog"


@pytest.mark.chaos
async def test_d22_kill9_dispatch_the_watchdog_spares_a_turn_only_while_it_waits(
    host_factory, server, tmp_path: Path
) -> None:
    """After a restart the idle watchdog leaves a turn waiting on an approval alone, and
    ends it once every call it made has been answered and it goes silent."""
    host = _host(host_factory, server, f"turn_idle_timeout_s = {IDLE_TIMEOUT_S}\n")
    server.policy = lambda _sid, body: {
        "result": "POLICY_ACTION_ASK"
        if body["event"]["type"] == "PHASE_TOOL_CALL"
        and body["event"]["data"]["name"] == "sys_os_write"
        else "POLICY_ACTION_ALLOW"
    }
    agent_id, sid = agent(
        server,
        tmp_path,
        [
            tool("sys_os_write", path="approved.txt", content="approved"),
            tool("sys_os_read", path="approved.txt"),
            # Not silent until well after the next restart, then silent for good.
            '{text: ".", repeat: 20, delay_ms: 100}',
            "{sleep_ms: 60000}",
        ],
    )
    # A turn that goes silent after the restart. The round of the watchdog that ends it has
    # judged the waiting turn first: recovered at the restart, that one precedes the new
    # session in dispatch's table and has been silent for longer.
    silent_agent = server.add_agent(scripted_yaml("silent", "{sleep_ms: 60000}"))
    silent = server.add_session(silent_agent)["id"]
    async with fake_gateway(host.endpoint) as gw:
        await gw.init(sid, agent_id)
        await gw.message(sid, "go")
        eid = (await _ask(gw, sid))["elicitation_id"]
        await _kill9_dispatch(host)
        await gw.init(silent, silent_agent)
        await gw.message(silent, "hush")
        await _ended_by_watchdog(gw, silent)
        assert gw.statuses(sid) == ["running"], "a turn waiting on a human is not silent"
        await _verdict(gw, sid, eid, "accept")
        await gw.wait(lambda: len(outputs(gw, sid)) == 2, timeout=30)
        wrote, read = (json.loads(o) for o in outputs(gw, sid))
        assert wrote["created"] is True
        # The resumed turn's calls carry the agent's spec: they run in its cwd.
        assert read["content"] == "approved"
        # Both calls answered: after one more restart nothing is in flight, so the silence
        # that follows the streamed text ends the turn.
        assert gw.statuses(sid) == ["running"]
        await _kill9_dispatch(host)
        await _ended_by_watchdog(gw, sid)
        assert [e["action"] for e in of_type(gw, sid, "response.elicitation_resolved")] == [
            "accept"
        ]
    assert (tmp_path / "approved.txt").read_text() == "approved"
    host.stop()


@pytest.mark.chaos
async def test_d18_kill9_dispatch_while_it_prepares_a_tool_call_loses_nothing(
    host_factory, server, tmp_path: Path
) -> None:
    """The worker's tool request is acked only once the call is on its way to policy: a
    dispatch killed while it prepares the call (here: fetching the agent's spec, which a
    restart forgot) gets the request again and the call runs once."""
    host = _host(host_factory, server)
    # The model waits on a human before its call, so the kill, the restart and the hang below
    # all come first however long a restart takes (a 2 s think time raced it under load).
    agent_id, sid = agent(
        server,
        tmp_path,
        [
            '{elicit: {message: "go on?"}}',
            tool("sys_os_write", path="once.txt", content="x"),
            '{text: "ok"}',
        ],
    )
    async with fake_gateway(host.endpoint) as gw:
        await gw.init(sid, agent_id)
        await gw.message(sid, "go")
        eid = (await _ask(gw, sid))["elicitation_id"]
        await _kill9_dispatch(host)
        # The restarted dispatch fetches the spec before the call: that request hangs.
        hang = server.fail("GET", r".*/agent/contents", mode="hang")
        await _verdict(gw, sid, eid, "accept")
        await trio.to_thread.run_sync(
            lambda: wait_until(lambda: hang.times == 0, 20, "the spec fetch")
        )
        # What hangs is the call's preparation: the call is out, and nothing has run.
        calls = lambda: [  # noqa: E731
            e
            for e in of_type(gw, sid, "response.output_item.done")
            if e["item"]["type"] == "function_call"
        ]
        await gw.wait(calls, timeout=10)
        assert outputs(gw, sid) == [] and not (tmp_path / "once.txt").exists()
        await _kill9_dispatch(host)
        assert await gw.until_status(sid, timeout=30) == ["running", "idle"]
        (wrote,) = (json.loads(o) for o in outputs(gw, sid))
        assert wrote["created"] is True
    assert (tmp_path / "once.txt").read_text() == "x"
    host.stop()


@pytest.mark.chaos
async def test_h07_a_tool_result_the_harness_actor_died_holding_still_reaches_the_worker(
    host_factory, server, tmp_path: Path
) -> None:
    """Dispatch hands a call's output to the harness actor, which dies before it has
    forwarded it to the worker (stopped, then killed): the result is durable, so the next
    incarnation gets it and the turn completes, the tool run once. It used to be a stream
    call, lost with the actor, and the worker waited on it until the turn's watchdog."""
    host = _host(host_factory, server)
    server.policy = phase_policy(PHASE_TOOL_CALL="POLICY_ACTION_ASK")
    agent_id, sid = agent(server, tmp_path, [tool("sys_os_write", path="ok.txt", content="once")])
    async with fake_gateway(host.endpoint) as gw:
        await gw.init(sid, agent_id)
        await gw.message(sid, "go")
        eid = (await _ask(gw, sid))["elicitation_id"]
        harness = host.actor("harness")
        os.kill(harness["pid"], signal.SIGSTOP)
        await _verdict(gw, sid, eid, "accept")
        await trio.to_thread.run_sync(
            lambda: wait_until((tmp_path / "ok.txt").exists, 20, "the tool run")
        )
        # Its outcome in dispatch's hands, on its way to the stopped harness actor.
        in_hand = lambda: host.ask("inspect", actor="dispatch")["state"]["deferred"] == 1  # noqa: E731
        await trio.to_thread.run_sync(lambda: wait_until(in_hand, 20, "the outcome in hand"))
        # A stopped process dies of SIGKILL as it is; a SIGCONT after it raced the host's
        # reaping of the pid (ProcessLookupError, a CI flake).
        os.kill(harness["pid"], signal.SIGKILL)
        assert await gw.until_status(sid, timeout=30) == ["running", "idle"]
        assert json.loads(outputs(gw, sid)[0])["created"] is True
    assert (tmp_path / "ok.txt").read_text() == "once"
    host.stop()
