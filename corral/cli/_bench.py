"""``corral bench NAME``: benchmarks as ratios against a baseline measured in the same run."""

from __future__ import annotations

import importlib

import click
from rich.console import Console
from rich.table import Table

from ._output import emit_json, json_option

BENCHMARKS = {
    "bus": "corral.bench.bus",
    "journal": "corral.bench.journal",
    "harness": "corral.bench.harness",
    "turn": "corral.bench.turn",
    "relay": "corral.bench.relay",
    "tools": "corral.bench.tools",
    "up": "corral.bench.up",
}


@click.command("bench")
@click.argument("name", type=click.Choice(sorted(BENCHMARKS)))
@click.option("--quick", is_flag=True, help="Smaller workloads (smoke runs, CI).")
@json_option
def bench_command(name: str, quick: bool, as_json: bool) -> None:
    """Run a benchmark and print its figures against its baseline."""
    module = importlib.import_module(BENCHMARKS[name])
    result = module.run({"quick": quick})
    if as_json:
        emit_json(result)
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
