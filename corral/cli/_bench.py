"""``corral bench NAME``: benchmarks as ratios against a baseline measured in the same run."""

from __future__ import annotations

import importlib

import click
from rich.console import Console
from rich.table import Table

from ..bench._progress import shown_on
from ._errors import CliError
from ._output import emit_json, json_option

BENCHMARKS = {
    "bus": "corral.bench.bus",
    "chaos": "corral.bench.chaos",
    "journal": "corral.bench.journal",
    "memory": "corral.bench.memory",
    "harness": "corral.bench.harness",
    "turn": "corral.bench.turn",
    "relay": "corral.bench.relay",
    "scale": "corral.bench.scale",
    "subagents": "corral.bench.subagents",
    "tools": "corral.bench.tools",
    "up": "corral.bench.up",
}

#: What ``corral bench chaos --kind`` may kill (corral.bench.chaos.ChaosOptions.kind).
CHAOS_KINDS = [
    "any",
    "dispatch",
    "gateway",
    "harness",
    "journal",
    "policy",
    "tools",
    "worker",
    "control-plane",
    "tunnel",
    "zygote",
    "none",
]


#: What ``corral bench harness --kind`` may measure: a coding-agent CLI kind against its CLI
#: run by hand (corral.bench.cli_harness.KINDS has the rows).
HARNESS_KINDS = ["claude-sdk", "codex", "pi"]


@click.command("bench")
@click.argument("name", type=click.Choice(sorted(BENCHMARKS)))
@click.option("--quick", is_flag=True, help="Smaller workloads (smoke runs, CI).")
@click.option(
    "--sessions",
    type=click.IntRange(min=1),
    help="chaos: sessions at once. scale: sessions active at each step (100; quick 5).",
)
@click.option("--turns", type=click.IntRange(min=1), help="chaos: turns per session.")
@click.option(
    "--mode",
    type=click.Choice(["kill", "tunnel"]),
    help="chaos: kill -9 processes, or drop the tunnel.",
)
@click.option(
    "--kind",
    type=click.Choice(CHAOS_KINDS + HARNESS_KINDS),
    help=(
        "chaos: what to kill (default any; tunnel: drop the tunnel, as --mode tunnel; "
        "none: nothing, the same workload as a control run). harness: the CLI harness kind "
        "to measure against its CLI run by hand."
    ),
)
@click.option(
    "--zygote/--no-zygote",
    default=None,
    help=(
        "chaos: fork the actors and the harness workers from zygotes, as the host does by "
        "default, and kill those too (--no-zygote: exec every process)."
    ),
)
@click.option("--seed", type=int, help="chaos: the killer's random seed.")
@click.option(
    "--turn-timeout",
    "turn_timeout_s",
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="chaos: a turn not ended after this long counts as hung, its session stops (120).",
)
@click.option(
    "--against",
    metavar="CMD",
    is_flag=False,
    flag_value="omnigent",
    help=(
        "relay: run another runner command through the same omnigent server beside corral "
        "and print the ratios; alone or 'omnigent': omnigent's own runner (needs the "
        "omnigent venv, see docs/benchmarks.md)."
    ),
)
@click.option(
    "--deltas",
    type=click.IntRange(min=1),
    help="relay: deltas in the one session's flood (100,000; quick 20,000).",
)
@json_option
def bench_command(
    name: str,
    quick: bool,
    sessions: int | None,
    turns: int | None,
    mode: str | None,
    kind: str | None,
    zygote: bool | None,
    seed: int | None,
    turn_timeout_s: float | None,
    against: str | None,
    deltas: int | None,
    as_json: bool,
) -> None:
    """Run a benchmark and print its figures against its baseline.

    chaos exits 1 when one of its invariants failed (its result's "ok" is false).
    """
    from ..bench._common import NotRunnable
    from ..bench._tunnel_peer import PeerError

    module = importlib.import_module(BENCHMARKS[name])
    params: dict[str, object] = {"quick": quick}
    if kind is not None and kind not in (CHAOS_KINDS if name == "chaos" else HARNESS_KINDS):
        raise click.UsageError(f"--kind {kind} is not one of {name}'s kinds")
    if name == "harness":
        params["kind"] = kind
    if name == "scale":
        params["sessions"] = sessions
    if against is not None:
        if name != "relay":
            raise click.UsageError("--against is an option of relay only")
        params["against"] = against
    if deltas is not None:
        if name != "relay" or against is not None:
            raise click.UsageError("--deltas is an option of relay only (without --against)")
        params["deltas"] = deltas
    if name == "chaos":
        params |= {
            "sessions": sessions,
            "turns": turns,
            "mode": mode,
            "kind": kind,
            "seed": seed,
            "turn_timeout_s": turn_timeout_s,
            "zygote": zygote,
        }
    try:
        # Bars on stderr while someone watches a terminal; the figures are the output.
        with shown_on(Console(stderr=True)):
            result = module.run(params)
    except NotRunnable as exc:  # a missing CLI: the reason, not a traceback
        raise CliError(str(exc), code="not_runnable", document={"benchmark": name}) from exc
    except PeerError as exc:  # the host or a server answered what no run can go on from
        raise CliError(str(exc), code="bench_failed", document={"benchmark": name}) from exc
    failed = result.get("ok") is False
    if as_json:
        emit_json(result)
        if failed:
            raise SystemExit(1)
        return
    base = result["baseline"]
    console = Console()
    console.print(
        f"[bold]{name}[/bold]  baseline: {base['name']} = {base['value']:,.1f} {base['unit']}"
    )
    table = Table("result", "value", "unit", "x baseline")
    for r in result["results"]:
        ratio = r.get("ratio_to_baseline")
        table.add_row(
            r["name"], f"{r['value']:,.3f}", r["unit"], "-" if ratio is None else f"{ratio:.3f}"
        )
    console.print(table)
    # relay --against: the targets, each as "corral is this many times better".
    figures = result.get("figures", {})
    for key, ratio in figures.get("ratios", {}).items():
        console.print(f"{key}: {ratio:.2f}x (target {figures['targets'][key]})")
    if failed:
        for problem in result.get("figures", {}).get("problems", []):
            console.print(f"[red]{problem}[/red]")
        raise SystemExit(1)
