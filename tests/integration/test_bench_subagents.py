"""``corral bench subagents --quick``: a real host fans out to scripted children through its
embedded control plane, timed against independent turns (#17 Benchmark)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.chaos
def test_s14_bench_subagents_times_a_fan_out_against_independent_turns() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "corral", "bench", "subagents", "--quick", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    doc = json.loads(out)
    assert doc["benchmark"] == "subagents" and doc["baseline"]["value"] > 0
    rows = {r["name"]: r["value"] for r in doc["results"]}
    for n in (1, 5):
        p50 = rows[f"fan-out {n}: send -> last result in inbox p50"]
        assert 0 < p50 <= rows[f"fan-out {n}: send -> last result in inbox p99"]
        assert rows[f"cost of orchestration, {n} children (fan-out p50 / independent p50)"] > 0
