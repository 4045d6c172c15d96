"""corral.bench.journal returns the `corral bench` document shape (docs/contract.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corral.bench import journal as bench

TINY = {
    "runs": 3,
    "events_per_run": 20,
    "in_flight": 4,
    "plain_events": 50,
    "fsync_events": 10,
    "replay_events": 200,
}


def test_bench_document_has_the_cli_shape(tmp_path: Path) -> None:
    document = bench.run({**TINY, "dir": str(tmp_path)})
    assert list(document) == ["benchmark", "baseline", "results", "params"]
    assert document["benchmark"] == "journal"
    assert set(document["baseline"]) == {"name", "value", "unit"}
    assert document["baseline"]["value"] > 0
    assert document["results"]
    for result in document["results"]:
        assert set(result) == {"name", "value", "unit", "ratio_to_baseline"}
        assert result["value"] > 0
    assert document["params"]["runs"] == 3
    assert document["params"]["dir"] == str(tmp_path)
    json.dumps(document)
    # The benchmark cleans up after itself.
    assert list(tmp_path.iterdir()) == []


def test_quick_shrinks_the_workloads_the_caller_left_alone(tmp_path: Path) -> None:
    small = {"runs": 2, "events_per_run": 5, "plain_events": 20, "fsync_events": 5}
    document = bench.run({**small, "quick": True, "dir": str(tmp_path)})
    assert document["params"]["replay_events"] == bench.QUICK["replay_events"]
    assert document["params"]["events_per_run"] == 5


def test_bench_refuses_unknown_params() -> None:
    with pytest.raises(ValueError, match=r"^unknown journal bench params: \['nope'\]$"):
        bench.run({"nope": 1})
