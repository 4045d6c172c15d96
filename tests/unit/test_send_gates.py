"""The gates ``sys_session_send`` runs before any server call (corral/tools/send_gates.py)."""

from __future__ import annotations

import pytest

from corral.tools.send_gates import (
    ModelError,
    check_model,
    harness_of,
    localise_model,
    missing_cli,
    model_refusal,
    provider_kind,
)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("claude; rm -rf /", "must start with a letter or digit"),
        (" ", "model must be a non-empty string"),
        (42, "'model' must be a string when provided"),
        ("x" * 257, "model exceeds 256 characters"),
        ("--model", "must start with a letter or digit"),
        ("gpt $(id)", "must start with a letter or digit"),
    ],
)
def test_p09_malformed_models_are_refused_with_the_reason(value: object, reason: str) -> None:
    with pytest.raises(ModelError) as caught:
        check_model(value)
    assert reason in str(caught.value)
    assert caught.value.line.startswith("Error: sys_session_send invalid 'model': ")
    assert "model" in caught.value.line


@pytest.mark.parametrize(
    "model",
    ["gpt-5.4-mini", "openai/gpt-4o", "vendor:tag", "claude-opus-4-8[1m]", "x" * 256],
)
def test_p09_real_id_shapes_pass_stripped(model: str) -> None:
    assert check_model(f"  {model}\t") == model
    assert check_model(None) is None


def test_p10_a_model_is_refused_in_by_id_mode() -> None:
    refusal = model_refusal("claude-sonnet-4-6", mode="by_id", harness="claude-native")
    assert refusal is not None and refusal.startswith("Error:") and "model" in refusal


def test_p11_a_model_is_refused_on_continuation_naming_the_child_and_the_way_out() -> None:
    refusal = model_refusal(
        "claude-sonnet-4-6",
        mode="named",
        harness="claude-native",
        existing_child="conv_existing_model",
    )
    assert refusal is not None and refusal.startswith("Error:")
    assert "conv_existing_model" in refusal and "sys_session_close" in refusal


def test_p12_a_model_is_refused_for_a_harness_with_no_override_plumbing() -> None:
    refusal = model_refusal("gpt-5-4", mode="named", harness="unknown-harness")
    assert refusal is not None and refusal.startswith("Error:") and "'unknown-harness'" in refusal


def test_p12_a_model_is_refused_when_the_spec_does_not_say_the_sub_agents_harness() -> None:
    refusal = model_refusal("gpt-5-4", mode="named", harness=None)
    assert refusal is not None and refusal.startswith("Error:") and "sub_agents" in refusal


@pytest.mark.parametrize(
    ("harness", "model", "says"),
    [
        ("claude-native", "databricks-gpt-5-4", "only runs Claude models"),
        ("claude-native", "databricks-meta-llama-3.3-70b-instruct", "only runs Claude models"),
        ("claude", "gpt-5-4", "only runs Claude models"),
        ("codex-native", "databricks-claude-sonnet-4-6", "only runs GPT models"),
        ("codex", "glmqlfit-eval", "only runs GPT models"),
    ],
)
def test_p13_single_vendor_harnesses_run_only_their_family(
    harness: str, model: str, says: str
) -> None:
    refusal = model_refusal(model, mode="named", harness=harness)
    assert refusal is not None and refusal.startswith("Error:")
    assert says in refusal and model in refusal


@pytest.mark.parametrize(
    ("harness", "model"),
    [
        ("claude-native", "databricks-claude-sonnet-4-6"),
        ("codex-native", "databricks-gpt-5-4"),
        ("claude-sdk", "databricks-claude-sonnet-4-6"),
        ("codex", "chatgpt-4o-latest"),
        ("codex", "system.ai.glm-5-2"),
        ("codex", "kimi-k2-instruct"),
        ("pi", "databricks-meta-llama-3.3-70b-instruct"),
        ("openai-agents", "claude-sonnet-4-6"),
    ],
)
def test_s07_p13_a_model_of_the_harnesss_family_passes(harness: str, model: str) -> None:
    assert model_refusal(model, mode="named", harness=harness) is None


def test_p14_the_family_guard_quotes_the_id_as_sent_not_as_localised() -> None:
    kind = provider_kind({"type": "databricks"})
    refusal = model_refusal("gpt-5-4", mode="named", harness="claude-native")
    assert refusal is not None and "'gpt-5-4'" in refusal
    assert "databricks-gpt-5-4" not in refusal
    assert localise_model("gpt-5-4", kind) == "databricks-gpt-5-4"  # what it would have become


@pytest.mark.parametrize(
    ("model", "auth", "localised"),
    [
        ("claude-sonnet-4-6", {"type": "databricks"}, "databricks-claude-sonnet-4-6"),
        ("gpt-5-4", {"type": "databricks"}, "databricks-gpt-5-4"),
        ("databricks-claude-sonnet-4-6", {"type": "databricks"}, "databricks-claude-sonnet-4-6"),
        (
            "us.anthropic.claude-sonnet-4-6",
            {"type": "databricks"},
            "us.anthropic.claude-sonnet-4-6",
        ),
        (
            "claude-sonnet-4-6",
            {"type": "api_key", "base_url": "https://x.cloud.databricks.com/serving-endpoints"},
            "databricks-claude-sonnet-4-6",
        ),
        ("databricks-claude-opus-4-8", {"type": "api_key"}, "claude-opus-4-8"),
        ("databricks-claude-opus-4-8", {"kind": "subscription"}, "claude-opus-4-8"),
        ("databricks-dbrx-instruct", {"type": "api_key"}, "databricks-dbrx-instruct"),
        ("claude-sonnet-4-6", None, "claude-sonnet-4-6"),
        ("claude-sonnet-4-6", {}, "claude-sonnet-4-6"),
        ("claude-sonnet-4-6", {"type": "mystery"}, "claude-sonnet-4-6"),
    ],
)
def test_p15_the_override_is_spelled_for_the_childs_provider(
    model: str, auth: dict[str, str] | None, localised: str
) -> None:
    assert localise_model(model, provider_kind(auth)) == localised


def test_s08_a_fresh_dispatch_to_a_harness_whose_cli_is_missing_is_refused() -> None:
    refusal = missing_cli("reviewer", "pi", which=lambda name: None)
    assert refusal is not None and refusal.startswith("Error:")
    assert "'pi' CLI" in refusal
    assert "npm install -g @earendil-works/pi-coding-agent" in refusal
    assert "'reviewer'" in refusal


def test_s09_the_cli_probe_is_the_callers_to_replace() -> None:
    asked: list[str] = []

    def found(name: str) -> str:
        asked.append(name)
        return f"/usr/bin/{name}"

    assert missing_cli("coder", "native-codex", which=found) is None
    assert asked == ["codex"]
    # Harnesses with no CLI of their own are never probed.
    assert missing_cli("helper", "openai-agents", which=lambda name: None) is None
    assert missing_cli("helper", None, which=lambda name: None) is None


def test_s10_the_sub_agents_harness_comes_from_the_parent_spec() -> None:
    sub_agents = {
        "coder": {"executor": {"type": "omnigent", "config": {"harness": "codex-native"}}},
        "writer": {"executor": {"type": "claude_sdk"}},
        "plain": {"instructions": "no executor"},
    }
    assert harness_of(sub_agents, "coder") == "codex-native"
    assert harness_of(sub_agents, "writer") == "claude_sdk"
    assert harness_of(sub_agents, "plain", "openai-agents") == "openai-agents"
    assert harness_of(sub_agents, "nobody") is None
    listed = [{"name": "coder", "executor": {"harness": "pi"}}]
    assert harness_of(listed, "coder") == "pi"
    assert harness_of("not a table", "coder") is None
