"""``corral bench up``: real hosts started and stopped, timed against a process start."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from corral.config import BUILTIN_ACTORS


@pytest.mark.chaos
def test_bench_up_times_real_hosts_against_an_actor_runtime_import() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "corral", "bench", "up", "--quick", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    doc = json.loads(out)
    assert doc["benchmark"] == "up"
    assert doc["baseline"]["unit"] == "s" and doc["baseline"]["value"] > 0
    rows = {r["name"]: r for r in doc["results"]}
    assert set(rows) == {"host up p50", "host up max", "host stop p50"}
    # A host starts several actors, each paying at least the runtime import.
    assert rows["host up p50"]["ratio_to_baseline"] > 1
    assert rows["host up p50"]["value"] <= rows["host up max"]["value"]
    # Every built-in actor: a production host (the test-only echo actor is not among them).
    assert doc["params"] == {"runs": 3, "actors": len(BUILTIN_ACTORS)}
