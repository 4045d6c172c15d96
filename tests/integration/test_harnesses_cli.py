"""``corral harnesses``: each registered kind, whether this machine runs it, its CLI (#18)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from corral import clis
from tests.conftest import corral


def _rows(out: Any) -> dict[str, Any]:
    assert out.returncode == 0, out.stderr
    return {row["name"]: row for row in json.loads(out.stdout)["harnesses"]}


def test_a_kind_whose_cli_is_found_runs_here_with_its_path_and_version(cli_bin: Path) -> None:
    rows = _rows(corral("harnesses", "--json", env={"CORRAL_CLI_PATH": str(cli_bin)}))
    claude = rows["claude-sdk"]
    assert (claude["available"], claude["reason"]) == (True, None)
    assert claude["cli"]["path"] == str(cli_bin / "claude")
    assert clis.CLIS["claude"].version in claude["cli"]["version"]
    assert claude["cli"]["pinned"] == clis.CLIS["claude"].version
    # A kind that drives no CLI says so.
    assert (rows["scripted"]["available"], rows["scripted"]["cli"]) == (True, None)


def test_a_kind_whose_cli_is_missing_says_why_and_how_to_install_it(tmp_path: Path) -> None:
    env = {"CORRAL_CLI_PATH": str(tmp_path), "PATH": str(tmp_path)}
    claude = _rows(corral("harnesses", "--json", env=env))["claude-sdk"]
    assert claude["available"] is False
    assert claude["cli"]["path"] is None and claude["cli"]["version"] is None
    assert "npm install -g @anthropic-ai/claude-code@" in claude["reason"]
    assert claude["cli"]["install"] in claude["reason"]
    # The table says the same, and the command still succeeds.
    out = corral("harnesses", env={**env, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    assert "claude-sdk" in out.stdout and "not found" in out.stdout
