"""``corral bench subagents`` (#17 Benchmark): its options, the parent's script and the
result document's shape, without a host."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

from corral.bench import subagents
from corral.cli._bench import bench_command


def test_quick_is_smaller_and_the_default_fans_out_to_1_10_50() -> None:
    assert subagents.options_of({}).sizes == (1, 10, 50)
    quick = subagents.options_of({"quick": True})
    assert quick.sizes == (1, 5) and quick.rounds < subagents.options_of({}).rounds


def test_a_parent_s_wakes_never_send_again() -> None:
    """Each round is the user's message and n wakes: with n + 1 turns, the next round's
    message is turn 0 again, whatever the wakes' batching."""
    turns = subagents.parent_spec(3)["executor"]["script"]["turns"]  # type: ignore[index]
    assert len(turns) == 4 and all(t == [] for t in turns[1:])
    assert [s["arguments"]["title"] for s in turns[0]] == ["c0", "c1", "c2"]


def test_the_document_has_a_ratio_per_size(monkeypatch: pytest.MonkeyPatch) -> None:
    measured = {1: ([0.5, 0.1, 0.1], [0.3, 0.05, 0.05]), 5: ([1.0, 0.4, 0.4], [0.4, 0.1, 0.1])}
    monkeypatch.setattr(subagents.trio, "run", lambda *a: measured)

    class _Host:
        def __enter__(self) -> Any:
            return object()

        def __exit__(self, *exc: object) -> None:
            return None

    monkeypatch.setattr(subagents, "running_host", lambda text: _Host())
    out = CliRunner().invoke(bench_command, ["subagents", "--quick", "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert doc["benchmark"] == "subagents" and doc["baseline"]["value"] == 50.0
    rows = {r["name"]: r for r in doc["results"]}
    # The first round is cold, the rest give the percentiles.
    assert rows["fan-out 5: send -> last result in inbox p50"]["value"] == 400.0
    assert rows["fan-out 5: cold (first round, workers spawned)"]["value"] == 1000.0
    cost = rows["cost of orchestration, 5 children (fan-out p50 / independent p50)"]
    assert (cost["value"], cost["unit"]) == (4.0, "x")
    assert doc["params"]["sizes"] == [1, 5]
