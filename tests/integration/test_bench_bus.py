"""``corral bench bus``: the bus's figures against raw pyzmq over the same hops, one run."""

from __future__ import annotations

import json
import subprocess
import sys


def test_bench_bus_puts_each_round_trip_against_a_raw_one_of_the_same_run() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "corral", "bench", "bus", "--quick", "--json"],
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )
    doc = json.loads(done.stdout)
    assert doc["benchmark"] == "bus"
    rows = {r["name"]: r for r in doc["results"]}
    raw = rows["raw pyzmq round trip through a ROUTER process p50"]["value"]
    p50 = rows["request/reply round trip p50"]
    assert raw > 0 and p50["value"] > 0
    # The ratio is to the raw round trip, not to the throughput baseline in msgs/s.
    assert abs(p50["ratio_to_baseline"] - p50["value"] / raw) < 0.01 * p50["ratio_to_baseline"]
    assert rows["request/reply round trip p99"]["ratio_to_baseline"] > 0
    assert doc["params"]["round_trips"] == 1_000
