"""``corral bench harness --kind pi``: pi through corral against pi's RPC mode run by hand on
the same fake Chat Completions API, in one run (#18)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import corral


@pytest.mark.chaos
def test_pi_is_measured_against_its_rpc_mode_by_hand(cli_bin: Path) -> None:
    out = corral(
        "bench",
        "harness",
        "--kind",
        "pi",
        "--quick",
        "--json",
        env={"CORRAL_CLI_PATH": str(cli_bin)},
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["benchmark"] == "harness"
    assert doc["baseline"]["unit"] == "ms" and doc["baseline"]["value"] > 0
    assert "pi by hand" in doc["baseline"]["name"]
    rows = {r["name"]: r for r in doc["results"]}
    # A new session starts a worker and pi in it; the next turn, on the CLI kept running,
    # skips that start, and so beats both the new session and pi started by hand. (A new
    # session against pi by hand is a race of two node starts: either may win by a few
    # per cent, so the figure is reported, not asserted.)
    new = rows["new session to first delta p50"]
    assert new["ratio_to_baseline"] > 0
    assert rows["next turn to first delta p50"]["value"] < new["value"]
    assert rows["next turn to first delta p50"]["value"] < doc["baseline"]["value"]
    session = rows["session PSS, worker + CLI (median)"]
    assert session["value"] > rows["worker PSS alone (median)"]["value"] > 0
    assert session["ratio_to_baseline"] > 1
    assert doc["params"]["kind"] == "pi" and doc["params"]["cli_version"] == "1.6.0"


def test_pi_cannot_be_measured_without_its_cli(tmp_path: Path) -> None:
    env = {"CORRAL_CLI_PATH": str(tmp_path), "PATH": str(tmp_path)}
    out = corral("bench", "harness", "--kind", "pi", "--json", env=env)
    assert out.returncode == 1
    error = json.loads(out.stdout)["error"]
    assert error["code"] == "not_runnable"
    assert "npm install -g @earendil-works/pi-coding-agent@1.6.0" in error["message"]
