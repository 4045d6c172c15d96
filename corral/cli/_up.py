"""``corral up``: run the host in the foreground."""

from __future__ import annotations

from pathlib import Path

import click
import trio

from .. import logs
from .._exceptions import ConfigError, HostAlreadyRunning, RestartIntensityExceeded
from ..actors.host import Host
from ..config import load_config, resolve_state_dir
from ._output import EXIT_USAGE, stderr


@click.command("up")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="CORRAL_CONFIG",
    help="corral.toml (env CORRAL_CONFIG).",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where the host keeps its state (env CORRAL_STATE_DIR).",
)
def up_command(config_path: Path | None, state_dir: Path | None) -> None:
    """Run the host in the foreground until SIGINT/SIGTERM.

    \b
    Example:
        corral up --state-dir ./state
    """
    logs.setup("host")
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        stderr.print(f"[red]error:[/red] {exc}")
        raise SystemExit(EXIT_USAGE) from None
    host = Host(config, resolve_state_dir(str(state_dir) if state_dir else None, config))
    try:
        trio.run(host.run)
    except (HostAlreadyRunning, RestartIntensityExceeded) as exc:
        stderr.print(f"[red]error:[/red] {exc}")
        raise SystemExit(1) from None
