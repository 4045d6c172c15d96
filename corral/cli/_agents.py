"""``corral agents``: the agents of the embedded control plane, the agent files it could not
load and why, and ``corral agents validate``, which checks agent files without a host.

Both read agent files as the control plane serves them (``corral.server._agents``): strictly
(:mod:`corral.agent_files`: unknown keys, wrong types and harnesses, with lines and "did you
mean"), then as a spec, then its policies.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from .._exceptions import ConfigError
from ..config import Config, load_config
from ..harnesses import HARNESSES
from ..server._agents import Agent, load_agent
from ._chat import _client_call, url_option
from ._output import (
    EXIT_FAILURE,
    EXIT_USAGE,
    CliError,
    config_option,
    config_path_of,
    emit_json,
    json_option,
    print_table,
    state_dir_option,
)


@click.group("agents", invoke_without_command=True)
@click.option("--check", is_flag=True, help="Exit 1 when an agent file is invalid.")
@state_dir_option
@url_option
@json_option
@click.pass_context
def agents_group(
    ctx: click.Context, check: bool, state_dir: Path | None, url: str | None, as_json: bool
) -> None:
    """List the agents of the embedded control plane, and the agent files it does not serve
    (invalid: each with its file, line and problem).

    \b
    Example:
        corral agents --check
        corral agents validate agents/helper.yaml
    """
    if ctx.invoked_subcommand is not None:
        return
    document = _client_call(
        state_dir,
        lambda api: api.call("GET", "/v1/agents", idempotent=True),
        url=url,
        document={"agents": [], "invalid": []},
    )
    agents = list(document.get("agents", []))
    invalid = list(document.get("invalid", []))
    if as_json:
        emit_json({"agents": agents, "invalid": invalid})
    else:
        table = Table("name", "harness", "model", "description")
        for a in agents:
            table.add_row(
                escape(str(a.get("name"))),
                escape(str(a.get("harness") or "-")),
                escape(str(a.get("model") or "-")),
                escape(str(a.get("description") or "")),
            )
        for bad in invalid:
            name = bad.get("name") or Path(str(bad.get("path"))).stem
            table.add_row(
                escape(str(name)),
                "[red]invalid[/red]",
                "-",
                f"[red]{escape(str(bad['error']))}[/red]",
            )
        print_table(table, ids=("name",))
    if check and invalid:
        # The document (or the table) says which and why; the line says that it failed.
        click.echo(f"error: {len(invalid)} agent file(s) are invalid", err=True)
        raise SystemExit(EXIT_FAILURE)


#: The ``--json`` document of ``agents validate`` when it checked nothing (with its error).
_NONE_VALID = {"valid": False, "agents": []}


@agents_group.command("validate")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@config_option(
    "corral.toml: its [server] agents_dirs when no PATH is given, and the harness kinds it "
    "registers (env CORRAL_CONFIG; default <state dir>/corral.toml)."
)
@state_dir_option
@json_option
def validate_command(
    paths: tuple[Path, ...], config_path: Path | None, state_dir: Path | None, as_json: bool
) -> None:
    """Check agent files as the control plane reads them: exit 0 if every one is valid, 1
    if one is not (each problem with its file, line and key), 2 for a PATH that does not
    exist. PATH: an agent YAML, an agent directory (with config.yaml), or a directory of
    agents; none: the config's [server] agents_dirs.

    \b
    Example:
        corral agents validate agents/
        corral agents validate helper.yaml --json
    """
    try:
        config = load_config(config_path_of(config_path, state_dir))
    except ConfigError as exc:
        raise CliError(
            str(exc),
            code="config_error",
            exit_code=EXIT_USAGE,
            document=_NONE_VALID,
        ) from None
    if not paths:
        paths = tuple(Path(d) for d in config.server.agents_dirs)
        if not paths:
            raise CliError(
                "give PATH..., or a config with [server] agents_dirs",
                code="usage",
                exit_code=EXIT_USAGE,
                document=_NONE_VALID,
            )
    missing = [p for p in paths if not p.exists()]
    if missing:
        raise CliError(
            f"no such file or directory: {', '.join(map(str, missing))}",
            code="usage",
            exit_code=EXIT_USAGE,
            document=_NONE_VALID,
        )
    harnesses = set(HARNESSES) | _registered(config)
    results = [_result(agent, load_agent(agent, harnesses)) for agent in _agents_in(paths)]
    valid = all(r["valid"] for r in results)
    if as_json:
        emit_json({"valid": valid, "agents": results})
    else:
        _show(results)
    if not valid:
        bad = sum(not r["valid"] for r in results)
        click.echo(f"error: {bad} of {len(results)} agent file(s) are invalid", err=True)
        raise SystemExit(EXIT_FAILURE)


def _registered(config: Config) -> set[str]:
    """The harness kinds ``[actors.harness.options] harnesses`` adds."""
    harness = config.actors.get("harness")
    registered = harness.options.get("harnesses") if harness is not None else None
    return set(registered) if isinstance(registered, dict) else set()


def _agents_in(paths: Iterable[Path]) -> list[Path]:
    """Each agent a PATH names: a file, an agent directory, or a directory's agents."""
    found: list[Path] = []
    for path in paths:
        if path.is_file() or (path / "config.yaml").is_file():
            found.append(path)
            continue
        found += sorted(
            p
            for p in path.iterdir()
            if (p.suffix in (".yaml", ".yml") and p.is_file())
            or (p.is_dir() and (p / "config.yaml").is_file())
        )
    return found


def _result(path: Path, loaded: Any) -> dict[str, Any]:
    if isinstance(loaded, Agent):
        return {"path": str(path), "name": loaded.name, "valid": True, "problems": []}
    problems = loaded.problems or [
        {"file": str(path), "line": None, "key": "", "message": loaded.reason}
    ]
    return {"path": str(path), "name": loaded.name, "valid": False, "problems": problems}


def _show(results: list[dict[str, Any]]) -> None:
    for result in results:
        if result["valid"]:
            click.echo(f"ok       {result['path']} ({result['name']})")
            continue
        click.echo(f"invalid  {result['path']}")
        for p in result["problems"]:
            where = ":".join(str(x) for x in (p["file"], p["line"]) if x is not None)
            what = f"{p['key']}: {p['message']}" if p["key"] else p["message"]
            click.echo(f"  {where}: {what}")
