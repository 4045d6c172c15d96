"""omnigent agent YAMLs run unchanged on the embedded control plane (issue #13 item 4).

Both of omnigent's formats, written as omnigent 0.19.1 reads them: a flat file with a
top-level ``policies:`` block naming the builtin ``ask_on_os_tools``, and a ``spec_version: 1``
directory with a sub-agent. The control plane lists and bundles them, applies the policy to
``/policies/evaluate`` and ``/mcp`` as omnigent's builtin does, and refuses an agent whose
policy function it cannot run. The last test runs turns of both through a real host (the
``openai-agents`` harness against ``tests/fake_openai.py``).
"""

from __future__ import annotations

import io
import json
import logging
import tarfile
import textwrap
from pathlib import Path
from typing import Any

import pytest
import trio

from corral.cli._client import ControlPlane, StreamEvent, run_turn
from tests.conftest import FAST_LIVENESS, HostProcess
from tests.fake_openai import FakeOpenAI, Reply, responses_events
from tests.integration.test_control_plane import make_settings, running
from tests.integration.test_e2e import _start, _stop

ASK_ON_OS = "omnigent.policies.builtins.safety.ask_on_os_tools"


def flat_agent(base_url: str) -> str:
    """The flat format (PROTOCOL_0_19 "How to run the real server locally")."""
    return textwrap.dedent(f"""\
        name: tool
        executor:
          harness: openai-agents
          model: tool
          auth: {{type: api_key, api_key: mock-key, base_url: {base_url}}}
        prompt: terse
        os_env: {{type: caller_process, cwd: ., sandbox: {{type: none}}}}
        policies:
          ask_os: {{type: function, function: {{path: {ASK_ON_OS}}}}}
        """)


def directory_agent(root: Path, base_url: str) -> None:
    """The directory format: config.yaml with a sub-agent in agents/child/."""
    auth = f"{{type: api_key, api_key: mock-key, base_url: {base_url}}}"
    (root / "agents" / "child").mkdir(parents=True)
    (root / "config.yaml").write_text(
        textwrap.dedent(f"""\
            spec_version: 1
            name: parent
            executor:
              type: omnigent
              model: plain
              auth: {auth}
              config: {{harness: openai-agents}}
            prompt: you delegate
            tools:
              agents: [child]
            guardrails:
              policies:
                ask_os: {{type: function, function: {ASK_ON_OS}}}
            """)
    )
    (root / "agents" / "child" / "config.yaml").write_text(
        textwrap.dedent(f"""\
            spec_version: 1
            name: child
            executor:
              type: omnigent
              model: echo
              auth: {auth}
              config: {{harness: openai-agents}}
            """)
    )
    (root / "agents" / "child" / "AGENTS.md").write_text("You are the child.\n")


def omnigent_agents(directory: Path, base_url: str = "http://127.0.0.1:9/v1") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tool.yaml").write_text(flat_agent(base_url))
    directory_agent(directory / "parent", base_url)
    (directory / "audit.yaml").write_text(
        "name: audit\nexecutor: {harness: openai-agents, model: m}\n"
        "policies:\n  audit_all: {type: function, function: myorg.policies.audit}\n"
    )
    return directory


async def test_both_formats_are_listed_bundled_and_the_unknown_policy_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    agents = omnigent_agents(tmp_path / "agents")
    with caplog.at_level(logging.WARNING, logger="corral.server.agents"):
        async with running(tmp_path / "state", make_settings(agents)) as ctx:
            listing = {a["name"]: a for a in (await ctx.client.get("/v1/agents")).json()["agents"]}
            assert listing["tool"]["harness"] == "openai-agents"
            assert listing["tool"]["policies"] == ["ask_os"]
            assert listing["parent"]["harness"] == "openai-agents"
            assert listing["parent"]["model"] == "plain"
            assert listing["parent"]["sub_agents"] == ["child"]
            assert listing["parent"]["policies"] == ["ask_os"]
            assert "audit" not in listing  # never served with its policy dropped
            refused = await ctx.client.post("/v1/sessions", json={"agent": "audit"})
            assert refused.status_code == 404
            detail = refused.json()["detail"]
            assert str(agents / "audit.yaml") in detail
            assert "'audit_all' calls 'myorg.policies.audit'" in detail

            sid = (await ctx.create("parent"))["id"]
            answer = await ctx.client.get(
                f"/v1/sessions/{sid}/agent/contents",
                headers={"x-omnigent-runner-tunnel-token": ctx.token},
            )
            assert answer.status_code == 200
            with tarfile.open(fileobj=io.BytesIO(answer.content), mode="r:gz") as bundle:
                names = sorted(bundle.getnames())
            # The directory, bundled whole, as the real server serves it.
            assert names == ["agents/child/AGENTS.md", "agents/child/config.yaml", "config.yaml"]
            async with ctx.runner_client() as client:
                info = await client.agent_bundle_info(sid)
            assert (info.name, info.spec.harness, info.spec.system_prompt) == (
                "parent",
                "openai-agents",
                "you delegate",
            )
            flat = (await ctx.create("tool"))["id"]
            async with ctx.runner_client() as client:
                spec = await client.agent_bundle(flat)
            assert (spec.name, spec.model) == ("tool", "tool")
    assert any(
        "audit.yaml" in r.getMessage() and "myorg.policies.audit" in r.getMessage()
        for r in caplog.records
    )


async def test_ask_on_os_tools_gates_evaluate_and_mcp(tmp_path: Path) -> None:
    agents = omnigent_agents(tmp_path / "agents")
    async with running(tmp_path / "state", make_settings(agents)) as ctx:
        flat = (await ctx.create("tool"))["id"]
        parent = (await ctx.create("parent"))["id"]
        prompt = "ask_os: Agent wants to call sys_os_shell('ls'). Approve?"
        async with ctx.runner_client() as client:

            async def verdict(sid: str, event: dict[str, Any]) -> dict[str, Any]:
                return await client.evaluate_policy(sid, {"event": event})

            call = {"name": "sys_os_shell", "arguments": {"command": "ls"}}
            shell = {"type": "PHASE_TOOL_CALL", "data": call}
            for sid in (flat, parent):  # top-level policies and guardrails.policies alike
                assert await verdict(sid, shell) == {
                    "result": "POLICY_ACTION_ASK",
                    "reason": prompt,
                }
            fetch = {"type": "PHASE_TOOL_CALL", "data": {"name": "web_fetch", "arguments": {}}}
            assert (await verdict(flat, fetch))["result"] == "POLICY_ACTION_ALLOW"
            result = {"type": "PHASE_TOOL_RESULT", "request_data": {"name": "sys_os_shell",
                      "arguments": {"command": "ls"}}, "data": {"result": "a b"}}  # fmt: skip
            assert (await verdict(flat, result))["result"] == "POLICY_ACTION_ALLOW"
            llm = {"type": "PHASE_LLM_REQUEST", "data": {"model": "tool", "messages_count": 1}}
            assert (await verdict(flat, llm))["result"] == "POLICY_ACTION_ALLOW"

            asked: list[dict[str, Any]] = []

            async def record(required: dict[str, Any]) -> dict[str, Any]:
                asked.append(required)
                [eid] = required["inputRequests"]
                return {eid: {"action": "decline"}}

            await client.mcp_call(flat, "sys_os_shell", {"command": "ls"}, on_input_required=record)
            [required] = asked
            [request] = required["inputRequests"].values()
            assert request["params"]["message"] == prompt

        # An agent file that gains a policy it cannot run is dropped from the catalog, but a
        # session made before keeps the policies it was made with (never silently allowed).
        text = (agents / "tool.yaml").read_text()
        (agents / "tool.yaml").write_text(
            text + "  audit: {type: function, function: myorg.policies.audit}\n"
        )
        async with ctx.runner_client() as client:
            answer = await client.evaluate_policy(flat, {"event": shell})
        assert answer["result"] == "POLICY_ACTION_ASK"


# --- through a real host ------------------------------------------------------------------


async def test_omnigent_agents_run_turns_end_to_end(tmp_path: Path, nursery: trio.Nursery) -> None:
    llm = FakeOpenAI()
    await llm.start(nursery)
    agents = omnigent_agents(tmp_path / "agents", llm.base_url)
    call = ("call_1", "sys_os_shell", json.dumps({"command": "echo hello-from-tool"}))
    llm.queue(
        Reply(frames=responses_events("served-tool", calls=[call])),
        Reply(frames=responses_events("served-tool", ["ran ", "it"])),
        Reply(frames=responses_events("served-plain", ["w0 ", "w1"])),
    )
    config = FAST_LIVENESS + f"[server]\nagents_dirs = [{json.dumps(str(agents))}]\n"
    host = HostProcess(tmp_path / "state", config)
    try:
        await trio.to_thread.run_sync(_start, host)
        asked: list[StreamEvent] = []

        async def accept(event: StreamEvent) -> str:
            asked.append(event)
            return "accept"

        with trio.fail_after(120):
            async with ControlPlane(host.state_dir) as api:
                tool = await api.create_session("tool")
                turn = await run_turn(
                    api, tool["id"], str(tool["last_event_id"]), "run it",
                    on_event=lambda e: None, decide=accept,
                )  # fmt: skip
                assert (turn.status, turn.error, turn.text) == ("idle", None, "ran it")
                [ask] = asked
                assert "Agent wants to call sys_os_shell('echo hello-from-tool')" in json.dumps(
                    ask.data["params"]
                )
                outputs = [
                    e["item"]["output"]
                    for e in turn.events
                    if e["type"] == "response.output_item.done"
                    and e["item"]["type"] == "function_call_output"
                ]
                assert outputs and "hello-from-tool" in outputs[0]

                parent = await api.create_session("parent")
                turn = await run_turn(
                    api, parent["id"], str(parent["last_event_id"]), "hi",
                    on_event=lambda e: None, decide=accept,
                )  # fmt: skip
                assert (turn.status, turn.error, turn.text) == ("idle", None, "w0 w1")
        models = [r.json["model"] for r in llm.requests]
        assert models == ["tool", "tool", "plain"]
        assert llm.requests[0].headers.get("authorization") == "Bearer mock-key"
    finally:
        await trio.to_thread.run_sync(_stop, host)
