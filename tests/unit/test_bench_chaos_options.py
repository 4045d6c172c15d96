"""``corral bench chaos``'s options reach its :class:`~corral.bench.chaos.ChaosOptions`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from corral.bench import chaos
from corral.bench._chaos_host import config_text
from corral.cli._bench import bench_command


def test_turn_timeout_flag_sets_the_runs_turn_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[chaos.ChaosOptions] = []

    def run(params: dict[str, Any]) -> dict[str, Any]:
        seen.append(chaos.options_of(params))
        return {"ok": True, "baseline": {}, "results": []}

    monkeypatch.setattr(chaos, "run", run)
    out = CliRunner().invoke(bench_command, ["chaos", "--quick", "--turn-timeout", "45", "--json"])
    assert out.exit_code == 0, out.output
    assert (seen[0].turn_timeout_s, seen[0].sessions) == (45.0, 4)
    assert chaos.options_of({}).turn_timeout_s == 120.0, "the default stays"
    for bad in ("0", "-1", "soon"):
        refused = CliRunner().invoke(bench_command, ["chaos", "--turn-timeout", bad])
        assert refused.exit_code == 2, (bad, refused.output)
    assert len(seen) == 1


def test_kind_none_is_the_control_run_that_kills_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--kind none`` runs the same workload with no kill: its figures are what the storm's
    load alone costs, to read the kill figures against."""
    seen: list[chaos.ChaosOptions] = []

    def run(params: dict[str, Any]) -> dict[str, Any]:
        seen.append(chaos.options_of(params))
        return {"ok": True, "baseline": {}, "results": []}

    monkeypatch.setattr(chaos, "run", run)
    out = CliRunner().invoke(bench_command, ["chaos", "--kind", "none", "--json"])
    assert out.exit_code == 0, out.output
    assert seen[0].kind == "none" and seen[0].kinds() == []
    assert chaos.ChaosOptions().kinds()[-3:] == ["worker", "control-plane", "zygote"]


def test_zygote_flag_forks_the_workers_and_adds_the_zygote_to_the_kill_targets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--zygote`` (#20): the host forks its harness workers from a zygote and the killer
    kills it too; on by default, as in the host; ``--no-zygote`` execs every worker (and
    kills no zygote); ``--kind zygote`` kills it alone."""
    seen: list[chaos.ChaosOptions] = []

    def run(params: dict[str, Any]) -> dict[str, Any]:
        seen.append(chaos.options_of(params))
        return {"ok": True, "baseline": {}, "results": []}

    monkeypatch.setattr(chaos, "run", run)
    for argv in (["--zygote"], ["--no-zygote"], ["--kind", "zygote"], []):
        out = CliRunner().invoke(bench_command, ["chaos", *argv, "--json"])
        assert out.exit_code == 0, out.output
    on, off, alone, default = seen
    assert on.zygote and on.kinds()[-1] == "zygote"
    assert not off.zygote and "zygote" not in off.kinds()
    assert alone.zygote and alone.kinds() == ["zygote"]
    assert default == on
    assert "zygote = true\n" in config_text(Path("/r"))
    assert config_text(Path("/r"), zygote=False).count("zygote = false\n") == 2
