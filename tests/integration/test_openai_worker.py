"""The openai worker kind through a real host: harness registry, spawn env, worker process."""

from __future__ import annotations

from typing import Any

import trio

from corral.harnesses.protocol import InputAccepted, PolicyVerdict, ToolResult
from tests.conftest import HostProcess
from tests.fake_openai import FakeOpenAI, Reply, responses_events
from tests.integration._dispatch import fake_dispatch


async def test_an_openai_agents_spec_runs_unchanged(
    host: HostProcess, nursery: trio.Nursery
) -> None:
    server = FakeOpenAI()
    await server.start(nursery)
    call = ("call_1", "sys_os_shell", '{"command": "ls"}')
    server.queue(
        Reply(frames=responses_events("served-x", calls=[call])),
        Reply(frames=responses_events("served-x", ["w0 ", "w1"])),
    )
    # The agent YAML of PROTOCOL_FACTS §iii.3, pointed at the fake server.
    auth = {"type": "api_key", "api_key": "mock-key", "base_url": server.base_url}
    executor = {"harness": "openai-agents", "model": "fake-model", "auth": auth}
    spec: dict[str, Any] = {"name": "proto", "prompt": "terse", "executor": executor}

    async with fake_dispatch(host.endpoint) as d:
        turn = await d.start_turn("s-openai", spec)
        # §F.4: the policy verdict comes first (here from the test, standing in for dispatch
        # and the policy actor); the provider has not been called yet.
        evaluation = await d.wait_type("policy_evaluation.requested", turn_id=turn)
        assert (evaluation.phase, evaluation.data["model"]) == ("PHASE_LLM_REQUEST", "fake-model")
        assert server.requests == []
        verdict = PolicyVerdict(
            session_id="s-openai",
            evaluation_id=evaluation.evaluation_id,
            action="POLICY_ACTION_ALLOW",
        )
        assert await d.send(verdict) == InputAccepted(status=204)
        asked = await d.wait_for(
            lambda e: getattr(e, "item", {}).get("status") == "action_required"
        )
        result = ToolResult(session_id="s-openai", call_id=asked.item["call_id"], output="files")
        assert await d.send(result) == InputAccepted(status=204)
        end = await d.terminal(turn)

    assert end.__struct_config__.tag == "response.completed"
    assert end.response["usage"] == {
        "input_tokens": 20,
        "output_tokens": 10,
        "total_tokens": 30,
        "context_tokens": 15,
        "model": "served-x",
    }
    assert end.response["model"] == "proto"  # the agent name (§C.1), as in_progress says
    completed = [
        e.item
        for e in d.of_turn(turn)
        if getattr(e, "item", {}).get("status") == "completed"
        or getattr(e, "item", {}).get("type") == "message"
    ]
    # §E.1: the completed call and the assistant message carry the agent; the deltas name
    # the message, which carries their whole text (the server persists it, not the deltas).
    assert [(i["type"], i["agent"]) for i in completed] == [
        ("function_call", "proto"),
        ("message", "proto"),
    ]
    deltas = [e for e in d.of_turn(turn) if e.__struct_config__.tag.endswith("text.delta")]
    assert {e.message_id for e in deltas} == {completed[-1]["id"]}
    assert completed[-1]["content"][0]["text"] == "w0 w1"
    types = d.types(turn)
    assert types.index("runtime_model") < types.index("response.output_text.delta")
    observed = next(e for e in d.of_turn(turn) if e.__struct_config__.tag == "runtime_model")
    assert (observed.model, observed.provider) == ("served-x", "127.0.0.1")
    assert "".join(getattr(e, "delta", "") for e in d.of_turn(turn)) == "w0 w1"
    first, second = server.requests
    assert first.headers["authorization"] == "Bearer mock-key"
    assert (first.json["model"], first.json["instructions"]) == ("fake-model", "terse")
    assert second.json["input"][1:] == [
        {**second.json["input"][1], "call_id": "call_1", "name": "sys_os_shell"},
        {"type": "function_call_output", "call_id": "call_1", "output": "files"},
    ]
