"""Harness pieces without processes: registry, spawn env, observer, script validation."""

from __future__ import annotations

import msgspec
import pytest

from corral import harnesses
from corral.harnesses._observe import Observer
from corral.harnesses.protocol import Approval, OutputTextDelta, to_json
from corral.harnesses.scripted import ScriptError, script_turns, turn_index
from corral.harnesses.spawn_env import SpawnEnvError, build_spawn_env, env_prefix
from tests.unit._journal import observation


def test_h05_registry_can_be_extended_and_restored() -> None:
    assert harnesses.resolve("scripted").endswith("ScriptedHarness")
    harnesses.register("runner-test-default", "tests.x:Kind")
    assert harnesses.resolve("runner-test-default") == "tests.x:Kind"
    harnesses.register("scripted", "tests.x:Other")
    harnesses.unregister("runner-test-default")
    harnesses.unregister("scripted")
    with pytest.raises(KeyError):
        harnesses.resolve("runner-test-default")
    assert harnesses.resolve("scripted").endswith("ScriptedHarness")
    assert harnesses.resolve("x", {"x": "a:B"}) == "a:B"
    assert harnesses.resolve("openai-agents") == harnesses.resolve("open-responses")


def test_h09_spawn_env_is_shaped_per_harness() -> None:
    host = {"PATH": "/bin", "HOME": "/h", "OPENAI_API_KEY": "sk-host", "CORRAL_RUNNER_TOKEN": "t"}
    spec = {"executor": {"harness": "claude-sdk", "model": "sonnet"}}
    env = build_spawn_env("claude-sdk", spec, host_env=host)
    assert env == {"PATH": "/bin", "HOME": "/h", "HARNESS_CLAUDE_SDK_MODEL": "sonnet"}
    env = build_spawn_env("pi", spec, model_override="gpt-x", host_env=host)
    assert env["HARNESS_PI_MODEL"] == "gpt-x", "the session override wins (D-11)"
    assert env_prefix("openai-agents") == "HARNESS_OPENAI_AGENTS_"


def test_h10_api_key_references_expand_from_the_host_only_when_asked() -> None:
    host = {"MY_KEY": "sk-secret", "OTHER": "x"}
    spec = {
        "executor": {
            "model": "m",
            "auth": {"type": "api_key", "api_key": "$MY_KEY", "base_url": "http://127.0.0.1:1/v1"},
        }
    }
    env = build_spawn_env("openai-agents", spec, host_env=host)
    assert env["HARNESS_OPENAI_AGENTS_API_KEY"] == "sk-secret"
    assert env["HARNESS_OPENAI_AGENTS_BASE_URL"] == "http://127.0.0.1:1/v1"
    assert "OTHER" not in env and "MY_KEY" not in env


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ({"executor": {"auth": {"api_key": "$NOT_SET"}}}, r"needs \$NOT_SET"),
        ({"executor": {"model": "gpt; rm -rf /"}}, "invalid model name"),
        ({"executor": {"model": "$(whoami)"}}, "invalid model name"),
        ({"executor": {"auth": "nope"}}, "must be a mapping"),
    ],
)
def test_h11_spawn_env_errors_are_typed(spec: dict, match: str) -> None:
    with pytest.raises(SpawnEnvError, match=match):
        build_spawn_env("x", spec, host_env={})


def test_e02_approval_without_content_has_no_content_key() -> None:
    flat = msgspec.json.decode(
        msgspec.json.encode(Approval(session_id="s", elicitation_id="e2", action="decline"))
    )
    assert flat == {
        "type": "harness.approval",
        "session_id": "s",
        "elicitation_id": "e2",
        "action": "decline",
    }
    with_content = Approval(
        session_id="s", elicitation_id="x", action="accept", content={"note": "ok"}
    )
    assert msgspec.json.decode(msgspec.json.encode(with_content))["content"] == {"note": "ok"}


def test_events_encode_to_the_protocol_json() -> None:
    assert msgspec.json.decode(
        to_json(OutputTextDelta(delta="w0 ", message_id="msg_1", turn_id="t", sequence_number=7))
    ) == {
        "type": "response.output_text.delta",
        "delta": "w0 ",
        "message_id": "msg_1",
        "turn_id": "t",
        "sequence_number": 7,
    }


def test_j20_j25_observer() -> None:
    o = Observer("session-a", "run-a")
    o.serve("primary", "anthropic", False)
    first = o.before_output()
    assert first is not None and first["model"] == "primary" and first["fallback_active"] is False
    assert o.before_output() is None, "no duplicate while valid (J-25)"
    o.serve("backup", "custom", True)
    assert o.before_output() == observation("backup")
    assert o.on_status("Switched to fallback: backup (custom)") is True
    assert o.at_completion(failed=False) == observation("backup"), "corrective observation (J-24)"
    assert o.at_completion(failed=False) is None


def test_j26_j28_j31_observer() -> None:
    o = Observer("session-a", "run-a")
    o.serve("backup", "custom", True)
    assert o.on_status("Trying fallback backup") is False
    o.serve(None, "custom", True)
    assert o.before_output() is None, "unknown model: no observation (J-27)"
    assert o.at_completion(failed=True) is None, "failed run: none (J-28)"
    o2 = Observer("session-a", "run-a")
    o2.serve("backup", "custom", True)
    assert o2.at_completion(failed=False) == observation("backup"), "non-streaming success (J-31)"


def test_script_validation_names_the_step() -> None:
    ok = {"executor": {"script": {"turns": [[{"text": "a", "chunk": 2}, {"hang": True}]]}}}
    assert len(script_turns(ok)) == 1
    for bad, match in [
        ({"executor": {}}, "must be a list"),
        ({"executor": {"script": {"turns": []}}}, "is empty"),
        ({"executor": {"script": {"turns": [[{"text": 1}]]}}}, r"turns\[0\]\[0\]\.text"),
        ({"executor": {"script": {"turns": [[{"text": "a", "tool": "b"}]]}}}, "exactly one"),
        ({"executor": {"script": {"turns": [[{"crash": True}]]}}}, "wrong type"),
        ({"executor": {"script": {"turns": [[{"text": "a", "chunk": 0}]]}}}, "positive"),
        ({"executor": {"script": {"turns": [[{"report": "maybe"}]]}}}, "'failed' or 'completed'"),
    ]:
        with pytest.raises(ScriptError, match=match):
            script_turns(bad)


def test_turn_index_counts_user_messages_in_history() -> None:
    def user(t: str) -> dict:
        return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": t}]}

    assert turn_index({"content": [user("a")]}) == 0
    assert (
        turn_index(
            {
                "content": [
                    user("a"),
                    {"type": "message", "role": "assistant", "content": []},
                    user("b"),
                ]
            }
        )
        == 1
    )
    assert turn_index({"content": "plain"}) == 0
