"""``corral harnesses``: which harness kinds this machine can run, and what the others need.

Each registered kind (:data:`corral.harnesses.HARNESSES`) with whether a host started here
could run it — the same answer the gateway's hello gives (PROTOCOL_0_19.md §L) — and, for a
kind that drives a coding-agent CLI (:mod:`corral.clis`), where that CLI is, the version it
reports and the version corral is tested with. An unavailable kind says why, and how to
install what it lacks. It asks no host: the CLIs are looked for in this process's
``CORRAL_CLI_PATH`` and ``PATH``, as a host started from the same shell looks for them.
"""

from __future__ import annotations

import functools

import click
from rich.console import Console
from rich.table import Table

from .. import clis
from .._jsonlines import JsonObject
from ..harnesses import HARNESSES, availability
from ._output import emit_json, json_option


def harness_rows() -> list[JsonObject]:
    """One row per registered harness kind (see the module docstring)."""
    version = functools.cache(clis.version)  # kinds that share a CLI ask it once
    rows = []
    for name, why_not in sorted(availability().items()):
        cli = clis.cli_for(name)
        row: JsonObject = {
            "name": name,
            "target": HARNESSES[name],
            "available": why_not is None,
            "reason": why_not,
            "cli": None,
        }
        if cli is not None:
            path = clis.find(cli.command)
            row["cli"] = {
                "command": cli.command,
                "package": cli.package,
                "pinned": cli.version,
                "path": path,
                "version": version(path) if path else None,
                "install": cli.install,
            }
        rows.append(row)
    return rows


@click.command("harnesses")
@json_option
def harnesses_command(as_json: bool) -> None:
    """The harness kinds this machine can run, their CLIs, and what the others need."""
    rows = harness_rows()
    if as_json:
        emit_json({"harnesses": rows})
        return
    table = Table("Kind", "Runs here", "CLI", "Version", "Why not")
    for row in rows:
        cli = row["cli"] or {}
        version = cli.get("version") or ""
        if cli and cli.get("path") and cli["pinned"] not in version:
            version += f" (tested: {cli['pinned']})"
        table.add_row(
            row["name"],
            "[green]yes[/]" if row["available"] else "[red]no[/]",
            cli.get("path") or ("—" if not cli else f"[dim]{cli['command']}: not found[/]"),
            version,
            row["reason"] or "",
        )
    Console().print(table)
