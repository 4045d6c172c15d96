"""``corral up``: run the host in the foreground."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import NoReturn

import click
import msgspec
import trio
from rich.markup import escape

from .. import logs
from .._exceptions import ConfigError, CorralError
from .._jsonlines import create_once
from .._proctitle import set_title
from ..actors.elicitations import elicitation_rows
from ..actors.host import Host
from ..config import Config, RunnerSettings, check_runners, load_config, resolve_state_dir
from ..server_client import runner_id_for_token
from ._output import EXIT_FAILURE, EXIT_USAGE, stderr

#: Where the runner token of ``--server`` comes from (never a flag: flags show up in ``ps``).
TOKEN_ENV = "CORRAL_RUNNER_TOKEN"
RUNNER_ID_ENV = "CORRAL_RUNNER_ID"

#: The config a state dir gets on its first ``corral up`` without ``--config``: safe by
#: default, so an agent on a real model never runs a shell command nobody approved.
FRESH_CONFIG = """\
# corral.toml of this state dir, written by its first `corral up` (no --config given) and
# read by every later one. corral never rewrites it. Every key: docs/config.md.

# Ask before any sys_os_* tool (shell commands, file reads, writes, edits) runs: the agent
# acts as the user who runs corral. To opt out, delete this rule or set action = "allow".
[[server.policies]]
tool = "sys_os_*"
action = "ask"
message = "The agent wants to use this machine's shell or files. OK?"

# Logs go to stderr and to this file too (beside this config, rotated by size): read them
# with `corral logs`. Delete this table to log to stderr only.
[logging]
file = "corral.log"
"""


def state_config(state_dir: Path) -> Path:
    """``<state dir>/corral.toml``, the config of a ``corral up`` given none; written (0600,
    atomically, never over an existing file) with :data:`FRESH_CONFIG` if missing."""
    path = state_dir / "corral.toml"
    if path.exists():
        return path
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    create_once(path, FRESH_CONFIG.encode())  # another `corral up` may have written it first
    return path


def server_runner(
    server: str, runner_id: str | None, environ: Mapping[str, str] = os.environ
) -> RunnerSettings:
    """The one runner ``corral up --server URL`` serves.

    Its id is ``--runner-id``, else ``CORRAL_RUNNER_ID``, else derived from
    ``CORRAL_RUNNER_TOKEN`` (PROTOCOL_FACTS.md §i.1), else left unset — the host then makes
    up a stable id and keeps it in the state dir. The tunnel token, when set, comes from
    ``CORRAL_RUNNER_TOKEN``.

    Raises:
        ConfigError: the URL is not an http(s):// or ws(s):// URL, or the id is blank.
    """
    token = environ.get(TOKEN_ENV) or None
    chosen = runner_id if runner_id is not None else environ.get(RUNNER_ID_ENV) or None
    if chosen is None and token is not None:
        chosen = runner_id_for_token(token)
    runner = RunnerSettings(server=server, id=chosen, token=token)
    try:
        check_runners([runner])
    except ConfigError as exc:
        # Name the flag, not a config key the user never wrote.
        text = str(exc).replace("invalid config: runner server", "--server")
        raise ConfigError(text.replace("invalid config: runner id", "--runner-id")) from None
    return runner


def with_workspace(config: Config, workspace: Path | None) -> Config:
    """``config`` with ``--workspace`` (or its environment variables) applied, made absolute.

    The directory is created if missing, so a fresh ``--workspace ./ws`` just works.

    Raises:
        ConfigError: the directory cannot be created.
    """
    raw = str(workspace) if workspace is not None else config.workspace
    if raw is None:
        return config
    path = Path(raw).expanduser().absolute()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"workspace {path} cannot be created: {exc.strerror}") from None
    return msgspec.structs.replace(config, workspace=str(path))


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
@click.option(
    "--server",
    "server_url",
    metavar="URL",
    help="Serve one runner for this server instead of the embedded control plane "
    "(token from env CORRAL_RUNNER_TOKEN).",
)
@click.option(
    "--runner-id",
    metavar="ID",
    help="The runner id to serve with --server (else env CORRAL_RUNNER_ID, else derived "
    "from the token, else a stable id kept in the state dir).",
)
@click.option(
    "--workspace",
    type=click.Path(file_okay=False, path_type=Path),
    envvar=["CORRAL_WORKSPACE", "OMNIGENT_RUNNER_WORKSPACE"],
    help="The directory tools run in (env CORRAL_WORKSPACE or OMNIGENT_RUNNER_WORKSPACE).",
)
@click.option(
    "--log-format",
    type=click.Choice(["logfmt", "json"]),
    envvar="CORRAL_LOG_FORMAT",
    help="How log records are written (env CORRAL_LOG_FORMAT; default: [logging] format, "
    "else logfmt).",
)
def up_command(
    config_path: Path | None,
    state_dir: Path | None,
    server_url: str | None,
    runner_id: str | None,
    workspace: Path | None,
    log_format: str | None,
) -> None:
    """Run the host in the foreground until SIGINT/SIGTERM.

    With no runner configured it also runs the embedded control plane on 127.0.0.1; talk to
    its agents with `corral chat` or `corral send` (they send its client token, see
    `corral token`). Without --config it reads <state dir>/corral.toml, written on the first
    run with a rule that asks before any sys_os_* tool runs.

    \b
    Example:
        corral up --state-dir ./state
        CORRAL_RUNNER_TOKEN=... corral up --server https://omnigent.example
    """
    if runner_id is not None and server_url is None:
        raise click.UsageError("--runner-id needs --server")
    try:
        if config_path is None and server_url is None:
            try:
                config_path = state_config(resolve_state_dir(str(state_dir) if state_dir else None))
            except OSError as exc:
                raise ConfigError(f"cannot write a fresh config: {exc}") from None
        config = with_workspace(load_config(config_path), workspace)
        log_settings = logs.resolve(config.logging)
        if log_format is not None:
            log_settings = msgspec.structs.replace(log_settings, format=log_format)
        logs.setup("host", log_settings, strict=True)
        runner = server_runner(server_url, runner_id) if server_url is not None else None
    except ConfigError as exc:
        _fail(exc, EXIT_USAGE)
    # Every process the host starts logs as it does (corral.logs).
    os.environ.update(logs.child_env(log_settings))
    said = _ErrorsLogged()
    logging.getLogger().addHandler(said)
    directory = resolve_state_dir(str(state_dir) if state_dir else None, config)
    set_title(f"corral: host {directory}")
    host = Host(
        config,
        directory,
        config_path=config_path,
        runner=runner,
        elicitations=elicitation_rows,
    )
    try:
        # Before trio runs: the actors' zygote is forked from the host (docs/supervision.md).
        host.fork_zygote()
        trio.run(host.run)
    except ConfigError as exc:
        _fail(exc, EXIT_USAGE, said=said.messages)
    except CorralError as exc:
        # Another host on the state dir, a crash loop, a control plane that never came up.
        _fail(exc, EXIT_FAILURE, said=said.messages)


class _ErrorsLogged(logging.Handler):
    """Remembers the error records logged, so a failure the host logged (on stderr, with
    the rest of its log) is not told a second time."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.add(record.getMessage())


def _fail(exc: Exception, code: int, *, said: AbstractSet[str] = frozenset()) -> NoReturn:
    if str(exc) not in said:
        stderr.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
    raise SystemExit(code) from None
