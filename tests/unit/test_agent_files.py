"""corral.agent_files: the strict check of agent files, case by case."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.agent_files import Problem, check_agent_file, check_agent_text, near
from corral.spec import MAX_YAML_BYTES

RUNS = {"openai", "openai-agents", "scripted"}


def _texts(yaml_text: str, harnesses: set[str] | None = RUNS) -> list[str]:
    return [p.text() for p in check_agent_text(yaml_text, harnesses)]


@pytest.mark.parametrize(
    "text",
    [
        "name: a\nexecutor: {harness: openai, model: m}\nprompt: p\n",
        "name: a\nos_env: inherit\nexecutor: {harness: scripted}\n",
        "os_env: {type: caller_process, cwd: ., sandbox: none}\n",
        "os_env: {sandbox: false}\n",
        "os_env: {sandbox: {type: linux_bwrap, allow_network: true, write_paths: [out]}}\n",
        "spec_version: 1\nexecutor: {type: omnigent, config: {harness: openai-agents, x: 1}}\n",
        "executor:\n  harness: openai\n  max_steps: 3\n  backoff_base_s: 0.5\n  headers: {a: b}\n",
        "executor: {harness: openai, model: null}\ntools: [a]\nterminals: {t: bash}\n",
        "ask_timeout: 30\npolicies: {p: {type: function, function: x.y}}\n",
        "executor:\n  <<: {harness: openai}\n  model: m\n",
    ],
)
def test_valid_shapes_have_no_problem(text: str) -> None:
    assert _texts(text) == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("name: a\nexector: {}\n", ["2: exector: unknown key (did you mean executor?)"]),
        ("executor:\n  modle: m\n", ["2: executor.modle: unknown key (did you mean model?)"]),
        ("zzz: 1\n", ["1: zzz: unknown key"]),
        (
            "executor: {auth: {api_kee: x}}\n",
            ["1: executor.auth.api_kee: unknown key (did you mean api_key?)"],
        ),
        (
            "os_env: {sandbox: {allow_netwrk: true}}\n",
            ["1: os_env.sandbox.allow_netwrk: unknown key (did you mean allow_network?)"],
        ),
        ("executor: {model: 4}\n", ["1: executor.model: must be a string, got an integer"]),
        ("spawn: 'yes'\n", ["1: spawn: must be true or false, got a string"]),
        ("executor: [a]\n", ["1: executor: must be a mapping, got a list"]),
        ("os_env: 3\n", ["1: os_env: must be a mapping or a string, got an integer"]),
        ("tools: x\n", ["1: tools: must be a mapping or a list, got a string"]),
        ("name: a\nname: b\n", ["2: name: given twice"]),
        ("base: &b {name: a}\n", ["1: base: unknown key"]),
        ("- a\n", ["1: an agent file is a mapping of keys, got a list"]),
        ("", ["an agent file is a mapping of keys, got empty"]),
        (
            "name: [\n",
            ["2: invalid YAML: expected the node content, but found '<stream end>' (column 1)"],
        ),
    ],
)
def test_problems_name_the_line_and_the_key(text: str, expected: list[str]) -> None:
    assert _texts(text) == expected


def test_a_harness_the_runner_does_not_run_with_a_guess_in_both_places() -> None:
    text = "executor:\n  harness: opnai\n  config: {harness: scriptd}\n"
    assert _texts(text) == [
        "2: executor.harness: unknown harness 'opnai' (did you mean openai?); this runner "
        "runs: openai, openai-agents, scripted",
        "3: executor.config.harness: unknown harness 'scriptd' (did you mean scripted?); this "
        "runner runs: openai, openai-agents, scripted",
    ]
    assert _texts("executor: {harness: claude-sdk}\n") == [
        "1: executor.harness: unknown harness 'claude-sdk'; this runner runs: openai, "
        "openai-agents, scripted"
    ]
    assert _texts(text, None) == [], "no runner known: no harness check"


def test_a_problem_as_text_and_json() -> None:
    problem = Problem("exector", 2, "unknown key")
    assert problem.text("a.yaml") == "a.yaml:2: exector: unknown key"
    assert Problem("", None, "too large").text("a.yaml") == "a.yaml: too large"
    assert problem.to_dict("a.yaml") == {
        "file": "a.yaml",
        "line": 2,
        "key": "exector",
        "message": "unknown key",
    }
    assert near("modle", ["model", "name"]) == "model"
    assert near("zzz", ["model", "name"]) is None


def test_files_that_are_too_large_or_not_text(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("name: " + "x" * MAX_YAML_BYTES + "\n")
    assert [p.message for p in check_agent_file(big)] == [
        f"too large: {MAX_YAML_BYTES + 7} bytes (limit {MAX_YAML_BYTES})"
    ]
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"name: \xff\n")
    assert [p.message for p in check_agent_file(binary)] == ["not UTF-8 text (byte 6)"]


def test_every_harness_tunable_is_an_executor_key_of_the_schema() -> None:
    """A harness reads its tunables from ``executor``: an agent file that sets one must not
    be refused as an unknown key."""
    from corral.agent_files import EXECUTOR
    from corral.harnesses.claude import _settings as claude
    from corral.harnesses.openai import _settings as openai

    for defaults in (openai.DEFAULTS, claude.DEFAULTS):
        assert set(defaults) <= set(EXECUTOR)
    assert {"permission_mode", "system_prompt", "api", "headers", "extra_body"} <= set(EXECUTOR)
