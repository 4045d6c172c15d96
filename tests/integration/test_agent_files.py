"""Strict agent files, through the CLI and a real host: a typo in a key or a harness name, a
wrong type, broken YAML are errors naming the file, line and key (with "did you mean");
``corral agents`` lists the invalid files with their error (``--check``: exit 1), a session
of one says why it is missing, and ``corral agents validate`` checks files with no host.
Every agent file of the repository stays valid."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.agent_files import check_agent_file
from corral.harnesses import HARNESSES
from tests.conftest import FAST_LIVENESS, HostProcess, corral
from tests.integration.test_e2e import _start

REPO = Path(__file__).parents[2]

FILES = {
    "typo.yaml": """
        name: typo
        exector:
          harness: scripted
        prompt: hi
    """,
    "modle.yaml": """
        name: gpt-helper
        executor:
          harness: openai
          modle: gpt-4o-mini
        prompt: hi
    """,
    "opnai.yaml": """
        name: opnai
        executor:
          harness: opnai
          model: gpt-4o-mini
        prompt: hi
    """,
    "broken.yaml": """
        name: broken
        executor: {harness: scripted
        prompt: hi
    """,
    "wrongtype.yaml": """
        name: wrongtype
        executor:
          harness: scripted
          model: 4
        spawn: "yes please"
    """,
    "good.yaml": """
        name: good
        description: a valid one
        executor:
          harness: scripted
          script: {turns: [[{text: "hi"}]]}
    """,
    "keyed.yaml": """
        name: keyed
        executor:
          harness: openai
          model: gpt-4o-mini
          auth: {type: api_key, api_key: $ZZ_NEVER_SET_KEY_OF_THIS_TEST, base_url: http://127.0.0.1:9/v1}
        prompt: hi
    """,
    "crew/config.yaml": """
        spec_version: 1
        name: crew
        executor: {type: omnigent, model: m, config: {harness: scripted}}
        prompt: lead
        tools: {agents: [helper]}
    """,
    "crew/agents/helper/config.yaml": """
        spec_version: 1
        name: helper
        executor: {type: omnigent, model: m, config: {harness: scripted}}
        promt: help
    """,
}

#: file → (line, key, the start of the message) of its one problem.
EXPECTED = {
    "typo.yaml": (2, "exector", "unknown key (did you mean executor?)"),
    "modle.yaml": (4, "executor.modle", "unknown key (did you mean model?)"),
    "opnai.yaml": (3, "executor.harness", "unknown harness 'opnai' (did you mean openai?)"),
    "broken.yaml": (3, "", "invalid YAML: "),
    "crew/agents/helper/config.yaml": (4, "promt", "unknown key (did you mean prompt?)"),
}


def _write(root: Path) -> Path:
    agents = root / "agents"
    for name, text in FILES.items():
        (agents / name).parent.mkdir(parents=True, exist_ok=True)
        (agents / name).write_text(textwrap.dedent(text).lstrip())
    return agents


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostProcess]:
    root = tmp_path_factory.mktemp("agentfiles")
    _write(root)
    # "agents" is relative to the config file's directory (root), not to the directory the
    # host runs in (the repository, where the tests run).
    host = HostProcess(root / "state", FAST_LIVENESS + '[server]\nagents_dirs = ["agents"]\n')
    _start(host)  # with the runner's tunnel: the harness check needs its hello
    try:
        yield host
    finally:
        if host.proc is not None and host.proc.poll() is None:
            host.stop()


def _cli(host: HostProcess, *args: str):
    return corral(*args, "--state-dir", str(host.state_dir))


def test_corral_agents_lists_the_invalid_files_with_file_line_and_key(host: HostProcess) -> None:
    out = _cli(host, "agents", "--json")
    assert out.returncode == 0, out
    doc = json.loads(out.stdout)
    assert {a["name"] for a in doc["agents"]} == {"demo", "team", "good", "keyed"}
    root = host.config_path.parent / "agents"
    invalid = {Path(i["path"]).relative_to(root).as_posix(): i for i in doc["invalid"]}
    assert set(invalid) == {
        "typo.yaml",
        "modle.yaml",
        "opnai.yaml",
        "broken.yaml",
        "wrongtype.yaml",
        "crew",
    }
    for file, (line, key, message) in EXPECTED.items():
        agent = file.split("/")[0]
        [problem] = invalid[agent]["problems"]
        assert problem["file"] == str(root / file)
        assert (problem["line"], problem["key"]) == (line, key), problem
        assert problem["message"].startswith(message), problem
        assert invalid[agent]["error"].startswith(f"{root / file}:{line}: "), invalid[agent]
    wrong = invalid["wrongtype.yaml"]["problems"]
    assert [(p["line"], p["key"], p["message"]) for p in wrong] == [
        (4, "executor.model", "must be a string, got an integer"),
        (5, "spawn", "must be true or false, got a string"),
    ]
    assert invalid["wrongtype.yaml"]["error"].endswith("(and 1 more)")


def test_the_table_shows_them_and_check_exits_1(host: HostProcess) -> None:
    out = _cli(host, "agents")
    assert out.returncode == 0, out
    rows = out.stdout.splitlines()
    assert any("good" in row and "scripted" in row for row in rows)
    assert any("typo" in row and "invalid" in row for row in rows), out.stdout
    checked = _cli(host, "agents", "--check")
    assert checked.returncode == 1
    assert checked.stdout == out.stdout


def test_a_session_of_an_invalid_agent_says_why(host: HostProcess) -> None:
    out = _cli(host, "send", "--agent", "typo", "hi")
    assert out.returncode == 1
    text = " ".join(out.stderr.split())
    assert "Agent 'typo' was not loaded" in text
    assert "typo.yaml:2: exector: unknown key (did you mean executor?)" in text
    # By the name the file gives, too (modle.yaml names its agent gpt-helper).
    out = _cli(host, "send", "--agent", "gpt-helper", "hi")
    text = " ".join(out.stderr.split())
    assert "modle.yaml:4: executor.modle: unknown key (did you mean model?)" in text, out


def test_an_unset_key_variable_fails_the_turn_turn_setup_failed(host: HostProcess) -> None:
    """What README says: the turn fails before any worker starts, naming the variable."""
    out = _cli(host, "send", "--agent", "keyed", "hi", "--json")
    assert out.returncode == 1, out
    error = json.loads(out.stdout)["error"]
    assert error["code"] == "turn_setup_failed"
    assert error["message"] == (
        "turn setup failed: the 'openai' harness needs $ZZ_NEVER_SET_KEY_OF_THIS_TEST, which "
        "is not set on this host"
    )


def test_validate_exit_codes_and_json(tmp_path: Path) -> None:
    agents = _write(tmp_path)
    ok = corral("agents", "validate", str(agents / "good.yaml"), str(agents / "crew" / ".."))
    assert ok.returncode == 1, ok  # the directory holds the invalid ones
    ok = corral("agents", "validate", str(agents / "good.yaml"))
    assert ok.returncode == 0, ok
    assert ok.stdout.startswith("ok ")
    bad = corral("agents", "validate", str(agents / "typo.yaml"), "--json")
    assert bad.returncode == 1
    doc = json.loads(bad.stdout)
    assert doc["valid"] is False
    [agent] = doc["agents"]
    assert agent["problems"] == [
        {
            "file": str(agents / "typo.yaml"),
            "line": 2,
            "key": "exector",
            "message": "unknown key (did you mean executor?)",
        }
    ]
    text = corral("agents", "validate", str(agents))
    assert text.returncode == 1
    assert f"{agents / 'modle.yaml'}:4: executor.modle: unknown key (did you mean model?)" in (
        text.stdout
    )
    missing = corral("agents", "validate", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "no such file" in missing.stderr


def test_validate_reads_the_configs_agents_dirs_and_harnesses(tmp_path: Path) -> None:
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "mine.yaml").write_text(
        "name: mine\nexecutor: {harness: mine}\nprompt: p\n"
    )
    config = tmp_path / "corral.toml"
    config.write_text('[server]\nagents_dirs = ["agents"]\n')
    out = corral("agents", "validate", "--config", str(config))
    assert out.returncode == 1 and "unknown harness 'mine'" in out.stdout
    config.write_text(
        '[server]\nagents_dirs = ["agents"]\n'
        '[actors.harness.options.harnesses]\nmine = "mypkg.harness:Mine"\n'
    )
    out = corral("agents", "validate", "--config", str(config))
    assert out.returncode == 0, out
    out = corral("agents", "validate", "--state-dir", str(tmp_path / "empty"))
    assert out.returncode == 2 and "agents_dirs" in out.stderr


def test_every_agent_file_of_the_repository_is_valid() -> None:
    files = [
        *(REPO / "corral" / "server" / "agents").rglob("*.yaml"),
        *(REPO / "tests" / "interop" / "agents").rglob("*.yaml"),
    ]
    assert len(files) > 15
    harnesses = set(HARNESSES)
    assert {str(f): check_agent_file(f, harnesses) for f in files} == {str(f): [] for f in files}
    # As the control plane serves them, too (the interop agents' policies are the real
    # server's business: it runs their code, the embedded control plane runs none).
    out = corral("agents", "validate", str(REPO / "corral" / "server" / "agents"))
    assert out.returncode == 0, out
