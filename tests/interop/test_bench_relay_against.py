"""``corral bench relay --against CMD``: corral beside another runner on the real omnigent
server, in one run (#20)."""

from __future__ import annotations

import json
import math
import shlex
import sys
from pathlib import Path

import pytest

from corral.bench._omnigent import runner_command
from tests.conftest import corral


@pytest.mark.interop
@pytest.mark.timeout(600)
def test_corral_is_measured_against_omnigents_runner(omnigent_venv: Path) -> None:
    against = shlex.join(runner_command(omnigent_venv))
    env = {"CORRAL_OMNIGENT_VENV": str(omnigent_venv)}
    out = corral("bench", "relay", "--against", against, "--quick", "--json", env=env, timeout=540)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout)
    assert doc["benchmark"] == "relay"
    assert doc["baseline"] == {
        "name": f"relay deltas/s, {against}",
        "value": doc["baseline"]["value"],
        "unit": "msgs/s",
    }
    rows = {r["name"]: r for r in doc["results"]}
    paced = "runner tree CPU per delta, 3 sessions at 10 deltas/s"
    per_session = "tree PSS per added session"
    for quantity in ("relay deltas/s", "cold session: message to first delta", paced, per_session):
        for runner in ("corral", against):
            assert f"{quantity}, {runner}" in rows
    for row in doc["results"]:
        assert math.isfinite(row["value"]) and row["value"] > 0, row
        assert math.isfinite(row["ratio_to_baseline"]) and row["ratio_to_baseline"] > 0, row
    ratios = doc["figures"]["ratios"]
    assert set(ratios) == {"deltas_per_s", "cold_first_delta_speedup", "tree_pss", "session_pss"}
    assert all(isinstance(v, float) and math.isfinite(v) and v > 0 for v in ratios.values())
    rounds = doc["figures"]["rounds"]
    assert set(rounds) == {"corral", against} and all(len(r) == 1 for r in rounds.values())
    # Where each tree's memory is, by process title: corral's host, actors and the session's
    # worker, summing to the tree's PSS.
    (corral_round,) = rounds["corral"]
    by_process = corral_round["pss_mb_by_process"]
    assert {"corral: dispatch", "corral: gateway", "corral: zygote"} <= set(by_process)
    assert any(title.startswith("corral: worker ") for title in by_process)
    assert sum(by_process.values()) == pytest.approx(corral_round["pss_mb"], abs=1)
    # The second cold session's worker: a forked process of a few MB of its own, not a whole
    # interpreter's worth (omnigent's runner adds a process of ~130 MB a session).
    assert 1 < corral_round["pss_added_mb"] < 30
    assert doc["params"]["against"] == against and doc["params"]["deltas_per_turn"] == 300
    # Sessions at a model's pace: what a delta costs each runner when nothing floods.
    assert corral_round["paced_cpu_us_per_delta"] > 0
    # ... and where it goes: every actor, the workers as one role, summing to the tree's.
    paced_by_process = corral_round["paced_cpu_us_per_delta_by_process"]
    roles = {"corral: host", "corral: dispatch", "corral: gateway", "corral: worker"}
    assert roles <= set(paced_by_process)
    assert not any(role.startswith("corral: worker ") for role in paced_by_process)
    total = sum(paced_by_process.values())
    assert total == pytest.approx(corral_round["paced_cpu_us_per_delta"], rel=0.05, abs=1)
    (other_round,) = rounds[against]
    assert set(other_round["paced_cpu_us_per_delta_by_process"]) <= {"runner", "runner's children"}
    assert doc["figures"]["paced_cpu_per_delta_lighter"] > 0
    assert doc["params"]["paced_sessions"] == 3 and doc["params"]["paced_ms"] == 100


@pytest.mark.interop
@pytest.mark.timeout(300)
def test_a_runner_that_exits_fails_the_run_with_its_output(omnigent_venv: Path) -> None:
    script = "import sys; print('runner gave up'); sys.exit(3)"
    against = shlex.join([sys.executable, "-c", script])
    env = {"CORRAL_OMNIGENT_VENV": str(omnigent_venv)}
    out = corral("bench", "relay", "--against", against, "--quick", "--json", env=env, timeout=240)
    assert out.returncode == 1
    assert f"{against} exited 3" in out.stderr and "runner gave up" in out.stderr
