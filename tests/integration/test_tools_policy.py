"""Tool calls end to end: worker → dispatch → policy → tools → policy → dispatch → worker.

A real host (harness, tools, policy, dispatch actors; scripted workers), the fake server for
policy verdicts and agent specs, and a stand-in gateway on the bus.
"""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from corral import __version__
from corral.actors._process import start_time
from corral.actors.tools.messages import ToolExec, ToolExecResult
from corral.routes import HttpRequest
from tests.conftest import FAST_LIVENESS, HostProcess, process_gone, shared_or_fresh, wait_until
from tests.fake_openai import FakeOpenAI, Reply, responses_events
from tests.fake_server import FakeOmnigentServer, evaluate_problem
from tests.integration._gateway import FakeGateway, fake_gateway


def _thost(factory, server: FakeOmnigentServer, policy: str = "") -> HostProcess:
    """A host of dispatch, policy and tools on ``server``; ``policy``: more policy options."""
    url = json.dumps(server.base_url)
    return factory(
        FAST_LIVENESS
        + f'[actors.dispatch.options]\nserver_url = {url}\nsubscribers = ["test-gateway"]\n'
        + f"[actors.policy.options]\nserver_url = {url}\n{policy}"
    ).start()


@pytest.fixture(scope="module")
def shared_thost(module_host_factory, module_server: FakeOmnigentServer) -> Iterator[HostProcess]:
    h = _thost(module_host_factory, module_server)
    yield h
    if h.proc is not None and h.proc.poll() is None:
        h.stop()


@pytest.fixture
def thost(request, host_factory, server: FakeOmnigentServer) -> Iterator[HostProcess]:
    """The module's host; its own for a test marked chaos or fresh_host."""
    yield from shared_or_fresh(request, "shared_thost", lambda: _thost(host_factory, server))


def agent(
    server: FakeOmnigentServer, cwd: Path, *turns: list[str], extra: str = ""
) -> tuple[str, str]:
    """An agent on the scripted harness whose OS env is ``cwd`` (T-07), and a session of it."""
    lines = [
        "name: toolsmith",
        "executor:",
        "  harness: scripted",
        "  model: scripted-model",
        "  script:",
        "    turns:",
    ]
    for steps in turns:
        lines.append("      -")
        lines += [f"        - {step}" for step in steps]
    lines.append(f"os_env: {{type: caller_process, cwd: {json.dumps(str(cwd))}}}")
    lines.append(extra)
    agent_id = server.add_agent("\n".join(lines) + "\n")
    return agent_id, server.add_session(agent_id)["id"]


def tool(name: str, **arguments: Any) -> str:
    return json.dumps({"tool": name, "arguments": arguments})


def outputs(gw: FakeGateway, sid: str) -> list[str]:
    return [
        e["item"]["output"]
        for e in gw.events.get(sid, [])
        if e["type"] == "response.output_item.done" and e["item"]["type"] == "function_call_output"
    ]


def of_type(gw: FakeGateway, sid: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in gw.events.get(sid, []) if e["type"] == kind]


def phase_policy(**actions: str):
    """A server policy answering per phase (ALLOW for phases not named)."""

    def policy(session_id: str, body: dict[str, Any]) -> dict[str, Any]:
        phase = body["event"]["type"]
        return {"result": actions.get(phase, "POLICY_ACTION_ALLOW"), "reason": f"rule for {phase}"}

    return policy


async def test_t01_t03_tools_write_edit_read_in_the_spec_cwd(thost, server, tmp_path) -> None:
    agent_id, sid = agent(
        server,
        tmp_path,
        [
            tool("sys_os_write", path="notes/a.txt", content="hello\nworld\n"),
            tool("sys_os_edit", path="notes/a.txt", oldText="world", newText="planet"),
            tool("sys_os_read", path="notes/a.txt"),
            tool("sys_os_read", path="../outside.txt"),
        ],
    )
    async with fake_gateway(thost.endpoint) as gw:
        await gw.init(sid, agent_id)
        await gw.message(sid, "go")
        assert await gw.until_status(sid, timeout=30) == ["running", "idle"]
        wrote, edited, read, escaped = (json.loads(o) for o in outputs(gw, sid))
    assert wrote["created"] is True
    assert edited["replacements"] == 1
    assert read["content"] == "hello\nplanet\n"
    assert "escapes the working directory" in escaped["error"]
    assert (tmp_path / "notes" / "a.txt").read_text() == "hello\nplanet\n"
    # Every call went through the server's gate, call and result phases, in the bodies the
    # 0.19.1 server validates (PROTOCOL_0_19 §F.2; the fake answers 400 to any other).
    evaluations = [r.json for r in server.received("POST", r".*/policies/evaluate")]
    calls = [b for b in evaluations if b["event"]["type"] == "PHASE_TOOL_CALL"]
    results = [b for b in evaluations if b["event"]["type"] == "PHASE_TOOL_RESULT"]
    assert len(calls) == len(results) == 4
    assert all(evaluate_problem(b) is None for b in evaluations)
    first_call, first_result = calls[0], results[0]
    assert set(first_call) == {"event", "_omnigent_elicitation_id"}
    assert re.fullmatch(r"elicit_evaluate_[0-9a-f]{32}", first_call["_omnigent_elicitation_id"])
    call_id = first_call["event"]["data"]["call_id"]
    assert first_call["event"] == {
        "type": "PHASE_TOOL_CALL",
        "data": {
            "name": "sys_os_write",
            "arguments": {"path": "notes/a.txt", "content": "hello\nworld\n"},
            "call_id": call_id,
        },
    }
    assert first_result == {
        "event": {
            "type": "PHASE_TOOL_RESULT",
            "request_data": {
                "name": "sys_os_write",
                "arguments": {"path": "notes/a.txt", "content": "hello\nworld\n"},
            },
            "target": "sys_os_write",
            "data": {"result": outputs(gw, sid)[0]},
        }
    }
    # Every runner call says who made it (the interop suite reads it in the access log).
    assert {r.headers["user-agent"] for r in server.requests} == {f"corral-runner/{__version__}"}


async def test_policy_deny_answers_the_model_and_runs_nothing(thost, server, tmp_path) -> None:
    server.policy = phase_policy(PHASE_TOOL_CALL="POLICY_ACTION_DENY")
    agent_id, sid = agent(
        server, tmp_path, [tool("sys_os_write", path="x.txt", content="no"), '{text: "ok"}']
    )
    async with fake_gateway(thost.endpoint) as gw:
        await gw.init(sid, agent_id)
        await gw.message(sid, "go")
        assert await gw.until_status(sid, timeout=30) == ["running", "idle"]
        (output,) = outputs(gw, sid)
    assert json.loads(output) == {"error": "rule for PHASE_TOOL_CALL"}
    assert not (tmp_path / "x.txt").exists()


async def test_policy_fails_closed_for_tool_calls_and_open_for_results(
    thost, server, tmp_path
) -> None:
    server.fail("POST", r"/v1/sessions/.*/policies/evaluate", status=500, times=1)
    agent_id, sid = agent(
        server,
        tmp_path,
        [tool("sys_os_write", path="x.txt", content="no")],
        [tool("sys_os_write", path="y.txt", content="yes")],
    )
    async with fake_gateway(thost.endpoint) as gw:
        await gw.init(sid, agent_id)
        await gw.message(sid, "first")
        assert await gw.until_status(sid, timeout=30) == ["running", "idle"]
        assert "policy check failed" in json.loads(outputs(gw, sid)[0])["error"]
        assert not (tmp_path / "x.txt").exists(), "fail closed: the call did not run"
        # A malformed answer for the result phase lets the output through (logged).
        server.policy = lambda sid_, body: (
            {"nonsense": 1}
            if body["event"]["type"] == "PHASE_TOOL_RESULT"
            else {"result": "POLICY_ACTION_ALLOW"}
        )
        await gw.message(sid, "second")
        assert await gw.until_status(sid, count=2, timeout=30) == ["running", "idle"] * 2
        assert json.loads(outputs(gw, sid)[1])["created"] is True
    assert (tmp_path / "y.txt").read_text() == "yes"


async def test_policy_result_deny_withholds_the_output(thost, server, tmp_path) -> None:
    """What-corral-did-wrong #8: with the tool name only in ``data`` the 0.19.1 server answers
    400 and corral let the output through; the body now names it where the server looks."""
    (tmp_path / "secret.txt").write_text("s3cret\n")
    server.policy = phase_policy(PHASE_TOOL_RESULT="POLICY_ACTION_DENY")
    agent_id, sid = agent(server, tmp_path, [tool("sys_os_read", path="secret.txt")])
    async with fake_gateway(thost.endpoint) as gw:
        await gw.init(sid, agent_id)
        await gw.message(sid, "go")
        assert await gw.until_status(sid, timeout=30) == ["running", "idle"]
        (output,) = outputs(gw, sid)
    assert "s3cret" not in output
    assert json.loads(output) == {"error": "rule for PHASE_TOOL_RESULT"}


async def restarted(host: HostProcess, name: str, before: dict[str, Any]) -> None:
    """Wait until actor ``name`` runs again, restarted since ``before`` (its status row)."""
    await trio.to_thread.run_sync(host.restarted, name, before)


def _tools_state(host: HostProcess) -> dict[str, Any]:
    return host.ask("inspect", actor="tools")["state"]


def _held(host: HostProcess, actor: str) -> int:
    """How many of ``actor``'s in-flight messages it holds (``corral mailboxes``)."""
    (row,) = [m for m in host.ask("mailboxes")["mailboxes"] if m["actor"] == actor]
    return int(row["held"])


async def _ask(gw: FakeGateway, sid: str) -> dict[str, Any]:
    await gw.wait(lambda: of_type(gw, sid, "response.elicitation_request"), timeout=30)
    return of_type(gw, sid, "response.elicitation_request")[0]


async def _verdict(gw: FakeGateway, sid: str, eid: str, action: str) -> Any:
    """Answer an elicitation through the session's events route; the 204 reply."""
    body = {"type": "approval", "data": {"elicitation_id": eid, "action": action}}
    reply = await gw.request("POST", f"/v1/sessions/{sid}/events", body)
    assert (reply.status, reply.body) == (204, b"")
    return reply


@pytest.mark.fresh_host  # it checks the host's whole list of parked elicitations
async def test_policy_ask_parks_until_accepted_then_runs(thost, server, tmp_path) -> None:
    server.policy = phase_policy(PHASE_TOOL_CALL="POLICY_ACTION_ASK")
    agent_id, sid = agent(
        server, tmp_path, [tool("sys_os_write", path="ok.txt", content="approved")]
    )
    async with fake_gateway(thost.endpoint) as gw:
        await gw.init(sid, agent_id)
        await gw.message(sid, "go")
        ask = await _ask(gw, sid)
        assert ask["params"]["message"] == "rule for PHASE_TOOL_CALL"
        assert ask["params"]["requestedSchema"]["required"] == ["approved"]
        # Announced while its park is committed (the broker delivers before the fsync).
        parked = await trio.to_thread.run_sync(
            lambda: thost.wait_for(lambda e: e["elicitations"], 10, "parked", op="elicitations")
        )
        assert [(e["elicitation_id"], e["owner"], e["state"]) for e in parked] == [
            (ask["elicitation_id"], "policy", "parked")
        ]
        assert not (tmp_path / "ok.txt").exists(), "nothing runs before the verdict"
        await _verdict(gw, sid, ask["elicitation_id"], "accept")
        assert await gw.until_status(sid, timeout=30) == ["running", "idle"]
        resolved = of_type(gw, sid, "response.elicitation_resolved")
        assert [(e["elicitation_id"], e["action"]) for e in resolved] == [
            (ask["elicitation_id"], "accept")
        ]
        assert json.loads(outputs(gw, sid)[0])["created"] is True
        # The verdict resolved the parked entry: an approval for it now finds nobody. The
        # policy actor lets go of it once the tool's outcome is durable, which can be after
        # the turn's idle reached us (the broker hands a message on before its commit ends);
        # till then a repeat of the verdict is answered 204, being acted on.
        eid = ask["elicitation_id"]
        await trio.to_thread.run_sync(
            lambda: thost.wait_for(
                lambda e: [
                    r
                    for r in e["elicitations"]
                    if r["elicitation_id"] == eid and r["state"] == "resolved"
                ],
                10,
                "the parked entry resolved",
                op="elicitations",
            )
        )
        late = {
            "type": "approval",
            "data": {"elicitation_id": ask["elicitation_id"], "action": "accept"},
        }
        reply = await gw.request("POST", f"/v1/sessions/{sid}/events", late)
        assert reply.status == 404
    assert (tmp_path / "ok.txt").read_text() == "approved"


async def test_policy_ask_declined_runs_nothing(thost, server, tmp_path) -> None:
    server.policy = phase_policy(PHASE_TOOL_CALL="POLICY_ACTION_ASK")
    agent_id, sid = agent(server, tmp_path, [tool("sys_os_write", path="no.txt", content="x")])
    async with fake_gateway(thost.endpoint) as gw:
        await gw.init(sid, agent_id)
        await gw.message(sid, "go")
        ask = await _ask(gw, sid)
        await _verdict(gw, sid, ask["elicitation_id"], "decline")
        assert await gw.until_status(sid, timeout=30) == ["running", "idle"]
        assert "declined" in json.loads(outputs(gw, sid)[0])["error"]
    assert not (tmp_path / "no.txt").exists()


@pytest.mark.chaos
async def test_kill9_policy_while_parked_the_verdict_still_lands(thost, server, tmp_path) -> None:
    server.policy = phase_policy(PHASE_TOOL_CALL="POLICY_ACTION_ASK")
    agent_id, sid = agent(
        server, tmp_path, [tool("sys_os_write", path="later.txt", content="landed")]
    )
    async with fake_gateway(thost.endpoint) as gw:
        await gw.init(sid, agent_id)
        await gw.message(sid, "go")
        ask = await _ask(gw, sid)
        await trio.to_thread.run_sync(
            lambda: thost.wait_for(lambda e: e["elicitations"], 10, "parked", op="elicitations")
        )
        before = thost.actor("policy")
        os.kill(before["pid"], signal.SIGKILL)
        await restarted(thost, "policy", before)
        await _verdict(gw, sid, ask["elicitation_id"], "accept")
        assert await gw.until_status(sid, timeout=30) == ["running", "idle"]
    assert (tmp_path / "later.txt").read_text() == "landed"


@pytest.mark.chaos
@pytest.mark.parametrize("second", ["POLICY_ACTION_ASK", "POLICY_ACTION_DENY"])
async def test_an_approval_for_a_prompt_whose_park_died_waits_for_the_call_to_park_again(
    host_factory, server, tmp_path, second: str
) -> None:
    """Policy publishes an ASK's prompt and dies before its park is committed (``crash_at =
    "asked"``). The person answers the prompt while the next incarnation is evaluating the
    redelivered call again: the approval must wait for the call's new park under the same id
    and resume it, not find nobody (404) and leave the re-asked prompt to a person who has
    already answered (seen in the chaos storm: 2 turns hung parked). The tool then runs
    exactly once. If the server's verdict changed meanwhile (DENY), that verdict decides and
    the approval is let go."""
    host = _thost(host_factory, server, 'crash_at = "asked"\n')
    server.policy = phase_policy(PHASE_TOOL_CALL="POLICY_ACTION_ASK")
    # The first evaluation answers at once; the next incarnation's is held until the test
    # has answered the prompt.
    held = server.fail("POST", r"/v1/sessions/.*/policies/evaluate", mode="hold", after=1)
    agent_id, sid = agent(server, tmp_path, [tool("sys_os_write", path="once.txt", content="x")])
    try:
        async with fake_gateway(host.endpoint) as gw:
            await gw.init(sid, agent_id)
            await gw.message(sid, "go")
            ask = await _ask(gw, sid)
            eid = ask["elicitation_id"]
            assert await trio.to_thread.run_sync(held.arrived.wait, 30), "no re-evaluation"
            assert host.log().count("crash_at asked: exiting now") == 1
            await _verdict(gw, sid, eid, "accept")  # 204, not 404
            server.policy = phase_policy(PHASE_TOOL_CALL=second)
            held.released.set()
            assert await gw.until_status(sid, timeout=30) == ["running", "idle"]
            prompts = of_type(gw, sid, "response.elicitation_request")
            assert {e["elicitation_id"] for e in prompts} == {eid}
            resolved = of_type(gw, sid, "response.elicitation_resolved")
            (output,) = outputs(gw, sid)
        listing = await trio.to_thread.run_sync(
            lambda: host.wait_for(lambda e: e, 10, "a listing", op="elicitations")
        )
        parks = [(e["elicitation_id"], e["state"], e["reason"]) for e in listing["elicitations"]]
    finally:
        held.released.set()
    if second == "POLICY_ACTION_ASK":
        assert [(e["elicitation_id"], e["action"]) for e in resolved] == [(eid, "accept")]
        assert json.loads(output)["created"] is True
        assert parks == [(eid, "resolved", "accept")], "one park, resolved by the answer"
        assert (tmp_path / "once.txt").read_text() == "x"
    else:
        assert resolved == []
        assert json.loads(output) == {"error": "rule for PHASE_TOOL_CALL"}
        assert parks == []
        assert not (tmp_path / "once.txt").exists()
    assert "Traceback" not in host.log()


async def test_a_call_asked_again_while_it_runs_is_answered_with_its_one_run(
    thost, tmp_path
) -> None:
    """A caller that restarted asks the tools actor for a call again while it still runs
    (the policy actor re-acting on an approval it held): each copy is answered with the
    one run's result, and the command runs once."""
    runs, go = tmp_path / "runs", tmp_path / "go"
    command = f"echo run >> {runs}; while [ ! -e {go} ]; do sleep 0.05; done; echo ran"
    call = ToolExec(
        session_id="s-joined",
        call_id=f"call_joined_{tmp_path.name}",
        name="sys_os_shell",
        arguments=json.dumps({"command": command}),
    )
    joined = _tools_state(thost)["joined"]
    replies: list[ToolExecResult] = []
    async with fake_gateway(thost.endpoint) as gw:

        async def ask() -> None:
            reply = await gw.peer.call("tools", call, durable=True, timeout=30)
            replies.append(reply)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask)
            await trio.to_thread.run_sync(lambda: wait_until(runs.exists, 20, "the run"))
            nursery.start_soon(ask)
            await trio.to_thread.run_sync(
                lambda: wait_until(
                    lambda: _tools_state(thost)["joined"] == joined + 1, 10, "the copy joined"
                )
            )
            go.touch()
    first, second = replies
    assert first == second
    assert first.status == "completed" and "ran" in first.output
    assert runs.read_text() == "run\n"


@pytest.mark.chaos
async def test_an_approved_call_outlives_its_policy_actors_restarts_while_it_runs(
    host_factory, server, tmp_path
) -> None:
    """E-01 for policy: an approved call runs in the tools actor while policy is killed
    twice. The approval and the call wait on other processes, so a restart is not a failed
    attempt of them: with ``max_attempts = 1`` the broker used to dead-letter the approval at
    the first restart and the turn waited on its park for good (the ``--kind policy`` storm:
    3 hung turns). The command runs once and the turn ends.

    Each incarnation asks the tools actor for the call again while it still runs; each
    copy must get the run's result. Only the first copy used to be answered, so the turn
    hung whenever the command outlived the last restart's copy (a CI failure): here it
    always does."""
    host = _thost(host_factory, server, "[bus]\nmax_attempts = 1\n")
    server.policy = phase_policy(PHASE_TOOL_CALL="POLICY_ACTION_ASK")
    command = "echo run >> runs; touch started; while [ ! -e go ]; do sleep 0.05; done; echo ran"
    agent_id, sid = agent(server, tmp_path, [tool("sys_os_shell", command=command)])
    async with fake_gateway(host.endpoint) as gw:
        await gw.init(sid, agent_id)
        await gw.message(sid, "go")
        ask = await _ask(gw, sid)
        await _verdict(gw, sid, ask["elicitation_id"], "accept")
        await trio.to_thread.run_sync(
            lambda: wait_until((tmp_path / "started").exists, 30, "the command started")
        )
        for restart in (1, 2):
            # Killed once each incarnation holds the approval again (a kill before that is
            # one attempt of it, as for any message in hand).
            await trio.to_thread.run_sync(
                lambda: wait_until(lambda: _held(host, "policy") == 1, 10, "the approval held")
            )
            before = host.actor("policy")
            os.kill(before["pid"], signal.SIGKILL)
            await restarted(host, "policy", before)
            await trio.to_thread.run_sync(
                lambda n=restart: wait_until(  # type: ignore[misc]
                    lambda: _tools_state(host)["joined"] == n, 10, "the call asked again"
                )
            )
        (tmp_path / "go").touch()
        assert await gw.until_status(sid, timeout=30) == ["running", "idle"]
        (output,) = outputs(gw, sid)
    assert "ran" in output
    assert (tmp_path / "runs").read_text() == "run\n"
    assert _tools_state(host)["calls"] == 1
    assert "dead letter" not in host.log()


@pytest.mark.chaos
async def test_kill9_tools_during_a_long_shell_call_ends_it_with_an_error(
    thost, server, tmp_path
) -> None:
    agent_id, sid = agent(
        server,
        tmp_path,
        [tool("sys_os_shell", command="echo $$ > shell.pid; sleep 60; echo never"), '{text: "on"}'],
    )
    async with fake_gateway(thost.endpoint) as gw:
        await gw.init(sid, agent_id)
        await gw.message(sid, "go")
        await trio.to_thread.run_sync(
            lambda: wait_until(lambda: (tmp_path / "shell.pid").exists(), timeout=20)
        )
        shell = int((tmp_path / "shell.pid").read_text())
        started = start_time(shell)
        os.kill(thost.actor("tools")["pid"], signal.SIGKILL)
        assert await gw.until_status(sid, timeout=40) == ["running", "idle"]
        (output,) = outputs(gw, sid)
        assert "restarted while this call ran" in json.loads(output)["error"]
        assert gw.texts(sid) == "on", "the turn went on after the tool's error"
        # The command the crash cut off does not run on unowned: the next incarnation killed it.
        await trio.to_thread.run_sync(lambda: wait_until(lambda: process_gone(shell, started)))


@pytest.mark.chaos
async def test_t23_inbox_items_survive_kill9_of_the_tools_actor(thost, server, tmp_path) -> None:
    agent_id, sid = agent(
        server,
        tmp_path,
        [tool("sys_call_async", tool="sys_os_shell", args={"command": "echo async-done"})],
        [tool("sys_read_inbox")],
    )
    async with fake_gateway(thost.endpoint) as gw:
        await gw.init(sid, agent_id)
        await gw.message(sid, "start it")
        assert await gw.until_status(sid, timeout=30) == ["running", "idle"]
        handle = json.loads(outputs(gw, sid)[0])["handle_id"]
        inbox = thost.instance.actor_dir("tools") / "inbox"
        await trio.to_thread.run_sync(
            lambda: wait_until(
                lambda: any(handle in p.read_text() for p in inbox.rglob("*") if p.is_file()),
                timeout=20,
                what="the async result in the inbox",
            )
        )
        before = thost.actor("tools")
        os.kill(before["pid"], signal.SIGKILL)
        await restarted(thost, "tools", before)
        await gw.message(sid, "read it")
        assert await gw.until_status(sid, count=2, timeout=30) == ["running", "idle"] * 2
        text = outputs(gw, sid)[1]
    assert text.startswith(f"[System: task {handle} completed — sys_os_shell returned: ")
    assert "async-done" in text


async def test_mcp_execute_route_runs_a_tool_and_rejects_bad_bodies(
    thost, server, tmp_path
) -> None:
    agent_id, sid = agent(server, tmp_path, ['{text: "x"}'])
    (tmp_path / "f.txt").write_text("via mcp\n")
    async with fake_gateway(thost.endpoint) as gw:
        await gw.init(sid, agent_id)
        path = f"/v1/sessions/{sid}/mcp/execute"
        call = {
            "method": "tools/call",
            "params": {"name": "sys_os_read", "arguments": {"path": "f.txt"}},
        }
        reply = await gw.request("POST", path, call)
        assert reply.status == 200
        assert json.loads(json.loads(reply.body)["result"]["output"])["content"] == "via mcp\n"
        for bad, status in [(b"{", 400), (b'{"method": "tools/list"}', 422)]:
            reply = await gw.request("POST", path, raw=bad)
            assert reply.status == status, bad
        unknown = {"method": "tools/call", "params": {"name": "list_tasks", "arguments": {}}}
        reply = await gw.request("POST", path, unknown)
        assert (
            "not available on this runner"
            in json.loads(json.loads(reply.body)["result"]["output"])["error"]
        )
    # The server evaluated that call before sending it: the runner does not ask again.
    assert server.received("POST", r".*/policies/evaluate") == []


async def test_t13_t16_terminal_resources_on_the_stream_and_the_resource_routes(
    thost, server, tmp_path
) -> None:
    agent_id, sid = agent(
        server,
        tmp_path,
        [
            tool("sys_terminal_launch", terminal="sh", session="s1"),
            tool("sys_terminal_launch", terminal="sh", session="s1"),
        ],
        extra="terminals:\n  sh: {command: sh}",
    )
    async with fake_gateway(thost.endpoint) as gw:
        await gw.init(sid, agent_id)
        await gw.message(sid, "go")
        assert await gw.until_status(sid, timeout=30) == ["running", "idle"]
        first, again = (json.loads(o)["status"] for o in outputs(gw, sid))
        assert (first, again) == ("launched", "already_running")
        created = of_type(gw, sid, "session.resource.created")
        assert len(created) == 1, "T-15: an idempotent launch publishes nothing"
        assert created[0]["resource"]["id"] == "terminal_sh_s1"
        resources = await gw.peer.call(
            "tools",
            HttpRequest(
                request_id="r1", method="GET", path=f"/v1/sessions/{sid}/resources/terminals"
            ),
        )
        listed = json.loads(resources.body)
        assert [r["id"] for r in listed["data"]] == ["terminal_sh_s1"]
        assert listed["data"][0]["metadata"]["running"] is True
        cleaned = await gw.peer.call(
            "tools",
            HttpRequest(request_id="r2", method="DELETE", path=f"/v1/sessions/{sid}/resources"),
        )
        assert json.loads(cleaned.body)["cleaned"] is True
        await gw.wait(lambda: of_type(gw, sid, "session.resource.deleted"))
        (deleted,) = of_type(gw, sid, "session.resource.deleted")
        assert (deleted["resource_id"], deleted["session_id"]) == ("terminal_sh_s1", sid)
        resources = await gw.peer.call(
            "tools",
            HttpRequest(request_id="r3", method="GET", path=f"/v1/sessions/{sid}/resources"),
        )
        left = json.loads(resources.body)["data"]
        assert [r["id"] for r in left if r.get("type") == "terminal"] == []


async def test_d22_a_turn_waiting_on_an_approval_is_not_silent(
    host_factory, server, tmp_path
) -> None:
    """The idle watchdog ends silent turns, not ones waiting on a human's verdict."""
    url = json.dumps(server.base_url)
    host = host_factory(
        FAST_LIVENESS
        + f"[actors.dispatch.options]\nserver_url = {url}\n"
        + 'subscribers = ["test-gateway"]\nturn_idle_timeout_s = 1.5\n'
        + f"[actors.policy.options]\nserver_url = {url}\n"
    ).start()
    server.policy = phase_policy(PHASE_TOOL_CALL="POLICY_ACTION_ASK")
    warm = json.dumps({"text": "warm"})
    agent_id, sid = agent(
        server, tmp_path, [warm], [tool("sys_os_write", path="w.txt", content="x")]
    )
    async with fake_gateway(host.endpoint) as gw:
        await gw.init(sid, agent_id)
        # A first turn starts the session's worker: on a loaded machine its start alone can
        # outlast the 1.5 s idle timeout, which would (rightly) end a turn still silent.
        await gw.message(sid, "warm up")
        assert await gw.until_status(sid, timeout=30) == ["running", "idle"]
        await gw.message(sid, "go")
        ask = await _ask(gw, sid)
        # Twice the idle timeout and more (watchdog rounds run once a second) pass while
        # the call waits on the verdict.
        await trio.sleep(3.5)
        assert gw.statuses(sid) == ["running", "idle", "running"]
        await _verdict(gw, sid, ask["elicitation_id"], "accept")
        assert await gw.until_status(sid, count=2, timeout=30) == ["running", "idle"] * 2
    host.stop()


async def test_p03_llm_request_policy_stops_a_turn_before_the_model_is_called(
    host_factory, server, tmp_path, nursery
) -> None:
    """PROTOCOL_0_19 §F.4 (what-corral-did-wrong #10): an openai-agents turn asks the server
    once, before its first model call; a DENY fails the turn ``policy_denied`` and tells the
    stream (``response.policy_denied``); an evaluation that fails, fails closed (P-03)."""
    url = json.dumps(server.base_url)
    # Slower liveness than FAST_LIVENESS: the openai worker's first HTTP client loads the CA
    # bundle, which on a loaded machine can take longer than 0.6 s of missed heartbeats.
    thost = host_factory(
        "[liveness]\ninterval_s = 0.5\nliveness = 10\n"
        + f'[actors.dispatch.options]\nserver_url = {url}\nsubscribers = ["test-gateway"]\n'
        + f"[actors.policy.options]\nserver_url = {url}\n"
    ).start()
    llm = FakeOpenAI()
    await llm.start(nursery)
    call = ("call_1", "sys_os_shell", json.dumps({"command": "echo hi"}))
    llm.queue(
        Reply(frames=responses_events("served-1", calls=[call])),
        Reply(frames=responses_events("served-1", ["done"])),
    )
    agent_id = server.add_agent(
        "name: spender\n"
        "prompt: Be brief.\n"
        "executor:\n"
        "  harness: openai-agents\n"
        "  model: gpt-x\n"
        f"  auth: {{type: api_key, api_key: k, base_url: {json.dumps(llm.base_url)}}}\n"
        f"os_env: {{type: caller_process, cwd: {json.dumps(str(tmp_path))}}}\n"
    )
    sid = server.add_session(agent_id)["id"]
    verdicts = iter(["POLICY_ACTION_DENY", "POLICY_ACTION_ALLOW"])

    def policy(session_id: str, body: dict[str, Any]) -> dict[str, Any]:
        if body["event"]["type"] != "PHASE_LLM_REQUEST":
            return {"result": "POLICY_ACTION_ALLOW"}
        return {"result": next(verdicts), "reason": "daily budget spent"}

    server.policy = policy

    def llm_evaluations() -> list[dict[str, Any]]:
        return [
            r.json
            for r in server.received("POST", r".*/policies/evaluate")
            if r.json["event"]["type"] == "PHASE_LLM_REQUEST"
        ]

    async with fake_gateway(thost.endpoint) as gw:
        await gw.init(sid, agent_id)
        await gw.message(sid, "spend")
        assert await gw.until_status(sid, timeout=30) == ["running", "failed"]
        [failed] = of_type(gw, sid, "response.failed")
        assert failed["error"] == {
            "code": "policy_denied",
            "message": "the model call was denied by policy: daily budget spent",
        }
        [denied] = of_type(gw, sid, "response.policy_denied")
        assert (denied["conversation_id"], denied["phase"]) == (sid, "llm_request")
        assert llm.requests == [], "the model was not called"

        await gw.message(sid, "again")
        statuses = await gw.until_status(sid, count=2, timeout=30)
        assert statuses == ["running", "failed", "running", "idle"], of_type(
            gw, sid, "response.failed"
        )
        assert len(llm.requests) == 2, "a tool call and the answer after it"
        [_, allowed] = llm_evaluations()
        assert set(allowed) == {"event", "_omnigent_elicitation_id"}
        assert allowed["event"]["data"] == {
            "model": "gpt-x",
            "messages_count": 2,  # the two user messages (the failed turn said nothing)
            "tools_count": len(llm.requests[0].json["tools"]),
            "system_prompt_preview": "Be brief.",
            "last_user_message": "again",
        }
        [completed] = of_type(gw, sid, "response.completed")
        assert completed["response"]["usage"]["model"] == "served-1"

        server.fail("POST", r"/v1/sessions/.*/policies/evaluate", status=500)
        await gw.message(sid, "once more")
        assert (await gw.until_status(sid, count=3, timeout=30))[-2:] == ["running", "failed"]
        error = of_type(gw, sid, "response.failed")[-1]["error"]
        assert error["code"] == "policy_unavailable"
        assert len(llm.requests) == 2, "fail closed: no model call"
    assert len(llm_evaluations()) == 3, "once per turn, not again after the tool result"
