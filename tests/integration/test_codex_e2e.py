"""A ``codex`` agent through the whole host: the embedded control plane, dispatch, the policy
actor and the harness actor, with the real Codex CLI on a fake Responses API (#18, S-51).

A person's approval comes from the client, as ``corral chat`` gives it; the session's
transcript is read back from the control plane. A ``codex`` sub-agent is a scaffold child
(H-13): ``sys_cancel_task`` interrupts it and its cancelled turn reaches the parent's inbox.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
import trio

from corral.cli._client import ControlPlane, StreamEvent, run_turn
from tests.conftest import FAST_LIVENESS, HostProcess, wait_for
from tests.fake_openai import FakeOpenAI, Reply, responses_events
from tests.integration.test_e2e import _start, _stop

MODEL = "gpt-fake"


def _executor(base_url: str) -> str:
    auth = f"{{type: api_key, api_key: sk-e2e, base_url: {base_url}}}"
    return f"{{harness: codex, model: {MODEL}, auth: {auth}}}"


async def _host(tmp_path: Path, agents: Path, cli_bin: Path, mp: pytest.MonkeyPatch) -> HostProcess:
    mp.setenv("CORRAL_CLI_PATH", str(cli_bin))
    config = FAST_LIVENESS + f"[server]\nagents_dirs = [{json.dumps(str(agents))}]\n"
    host = HostProcess(tmp_path / "state", config)
    await trio.to_thread.run_sync(_start, host)
    return host


async def test_a_codex_agent_runs_a_command_a_person_accepts_and_its_transcript_is_kept(
    tmp_path: Path, nursery: trio.Nursery, cli_bin: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    llm = FakeOpenAI()
    await llm.start(nursery)
    command = json.dumps({"cmd": "echo from-codex > e2e.txt"})
    llm.queue(
        Reply(frames=responses_events(MODEL, calls=[("call_1", "exec_command", command)])),
        Reply(frames=responses_events(MODEL, ["wrote ", "it"], added=True)),
    )
    agents = tmp_path / "agents"
    agents.mkdir()
    (agents / "coder.yaml").write_text(f"name: coder\nexecutor: {_executor(llm.base_url)}\n")
    host = await _host(tmp_path, agents, cli_bin, monkeypatch)
    try:
        asked: list[StreamEvent] = []

        async def accept(event: StreamEvent) -> str:
            asked.append(event)
            return "accept"

        with trio.fail_after(120):
            async with ControlPlane(host.state_dir) as api:
                session = await api.create_session("coder")
                turn = await run_turn(
                    api, session["id"], str(session["last_event_id"]), "write the file",
                    on_event=lambda e: None, decide=accept,
                )  # fmt: skip
                page = await api.call(
                    "GET", f"/v1/sessions/{session['id']}/items?limit=100&order=asc",
                    idempotent=True,
                )  # fmt: skip
        assert (turn.status, turn.error, turn.text) == ("idle", None, "wrote it")
        [ask] = asked
        assert ask.data["params"]["tool"]["name"] == "exec_command"
        items: list[dict[str, Any]] = page["data"]
        kinds = [(i["type"], i.get("name") or i.get("role")) for i in items]
        assert kinds == [
            ("message", "user"),
            ("function_call", "exec_command"),
            ("function_call_output", None),
            ("message", "assistant"),
        ]
        cwd = Path(json.loads(items[1]["arguments"])["cwd"])
        assert (cwd / "e2e.txt").read_text() == "from-codex\n"
        assert cwd.is_relative_to(host.state_dir)  # the session's own working directory
    finally:
        await trio.to_thread.run_sync(_stop, host)


PARENT = """\
    spec_version: 1
    name: canceller
    executor:
      harness: scripted
      script:
        turns:
          - - {tool: sys_session_send, arguments: {agent: coder, title: c1, args: "think"}}
          - - {tool: sys_cancel_task, arguments_from_message: true}
          - - {tool: sys_read_inbox, arguments: {}}
    tools:
      agents: [coder]
    """


async def test_s51_a_codex_child_is_interrupted_by_sys_cancel_task_and_its_end_reaches_the_inbox(
    tmp_path: Path, nursery: trio.Nursery, cli_bin: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    llm = FakeOpenAI()
    await llm.start(nursery)
    thinking = responses_events(MODEL, ["thinking"], added=True)
    llm.queue(Reply(frames=thinking, hang_after=3))  # the child's model never finishes
    agents = tmp_path / "agents"
    (agents / "canceller" / "agents" / "coder").mkdir(parents=True)
    (agents / "canceller" / "config.yaml").write_text(textwrap.dedent(PARENT))
    child_yaml = f"spec_version: 1\nname: coder\nexecutor: {_executor(llm.base_url)}\n"
    (agents / "canceller" / "agents" / "coder" / "config.yaml").write_text(child_yaml)
    host = await _host(tmp_path, agents, cli_bin, monkeypatch)

    async def outputs(api: ControlPlane, session_id: str) -> list[str]:
        path = f"/v1/sessions/{session_id}/items?limit=100&order=asc"
        page = await api.call("GET", path, idempotent=True)
        return [i["output"] for i in page["data"] if i["type"] == "function_call_output"]

    async def nothing(event: StreamEvent) -> None:
        return None

    try:
        with trio.fail_after(120):
            async with ControlPlane(host.state_dir) as api:
                parent = await api.create_session("canceller")
                first = await run_turn(
                    api, parent["id"], str(parent["last_event_id"]), "go",
                    on_event=lambda e: None, decide=nothing,
                )  # fmt: skip
                assert first.status == "idle", first.error
                child = json.loads((await outputs(api, parent["id"]))[0])["task_id"]
                # The child's codex turn is out to its model (which never answers).
                await wait_for(_async(lambda: llm.requests), "the child's model call", 60)
                after = (await api.session(parent["id"]))["last_event_id"]
                await run_turn(
                    api, parent["id"], str(after), json.dumps({"task_id": child}),
                    on_event=lambda e: None, decide=nothing,
                )  # fmt: skip
                asked = json.loads((await outputs(api, parent["id"]))[1])
                assert asked["cancel_requested"] is True and asked["task_id"] == child

                async def drained() -> str | None:
                    found = await outputs(api, parent["id"])
                    return found[2] if len(found) > 2 else None

                text = await wait_for(drained, "the woken parent's drain", 60)
                child_session = await api.session(child)
        assert text == f"[System: sub-agent task {child} cancelled — coder:c1]"
        assert child_session["status"] == "idle"
        await wait_for(_async(lambda: llm.requests[0].closed.is_set()), "the model call closed")
    finally:
        await trio.to_thread.run_sync(_stop, host)


def _async(probe: Any) -> Any:
    async def asked() -> Any:
        return probe()

    return asked
