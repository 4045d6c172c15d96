"""``corral logs``: read (and follow) a host's log file, filtered.

Which file: ``--file``, else the one the host running on the state dir writes (its
``host.json``), else ``[logging] file`` of ``--config`` (default ``<state dir>/corral.toml``,
the config a plain ``corral up`` reads). A host with no ``[logging] file`` logs to stderr
only, and this command says so (exit 1).
"""

from __future__ import annotations

import json
import os
import sys
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import click

from .._exceptions import ConfigError
from .._logfile import log_lines
from ..config import LOG_LEVELS, load_config, resolve_state_dir
from ..instance import Instance
from ..logs import parse_line, to_logfmt
from ._output import (
    EXIT_USAGE,
    CliError,
    config_option,
    config_path_of,
    json_option,
    state_dir_option,
)


def find_log_file(state_dir: Path | None, config_path: Path | None) -> Path:
    """The log file of the host on ``state_dir`` (see the module docstring).

    Raises:
        click.ClickException: no log file is configured (exit 1).
        ConfigError: the config does not load.
    """
    directory = resolve_state_dir(str(state_dir) if state_dir else None)
    host = Instance(directory).read_host()
    if host is not None and host.get("log_file"):
        return Path(host["log_file"])
    config_path = config_path_of(config_path, state_dir)
    configured = load_config(config_path).logging.file if config_path is not None else None
    if configured:
        return Path(configured)
    where = config_path if config_path is not None else directory / "corral.toml"
    raise CliError(
        f"no log file: no host runs on {directory} with one, and {where} sets no "
        "[logging] file (the host logs to stderr only); set it (docs/config.md), or pass "
        "--file or --config",
        code="no_log_file",
    )


def matches(
    fields: dict[str, Any], actors: tuple[str, ...], session: str | None, level: str | None
) -> bool:
    """Whether a record passes the filters: its ``proc`` is one of ``actors``; its
    ``session`` starts with ``session`` or its message names it; its level is at least
    ``level``."""
    if actors and str(fields.get("proc")) not in actors:
        return False
    if session is not None:
        own = str(fields.get("session") or "")
        if not own.startswith(session) and session not in str(fields.get("msg", "")):
            return False
    if level is not None:
        mine = str(fields.get("level", "")).lower()
        if mine in LOG_LEVELS and LOG_LEVELS.index(mine) < LOG_LEVELS.index(level):
            return False
    return True


def render(
    lines: Iterable[str],
    actors: tuple[str, ...],
    session: str | None,
    level: str | None,
    as_json: bool,
) -> Iterator[str]:
    """The lines to print: each matching record as logfmt, or as JSON with ``as_json``. A
    line that is no record (a library's print) shows only when nothing filters."""
    filtered = bool(actors or session or level)
    for line in lines:
        if not line:  # the end of what the log held, when following
            yield line
            continue
        fields = parse_line(line)
        if fields is None:
            if not filtered and not as_json:
                yield line.rstrip("\n")
            continue
        if matches(fields, actors, session, level):
            yield json.dumps(fields, ensure_ascii=False) if as_json else to_logfmt(fields)


@click.command("logs")
@click.option("-f", "--follow", is_flag=True, help="Keep printing records as they are written.")
@click.option(
    "--actor",
    "actors",
    multiple=True,
    metavar="NAME",
    help="Only this process: host, server, an actor (dispatch, harness, ...) or worker "
    "(repeatable).",
)
@click.option("--session", metavar="ID", help="Only records of this session (its id or a prefix).")
@click.option("--level", type=click.Choice(LOG_LEVELS), help="Only records at this level or above.")
@click.option(
    "-n",
    "--lines",
    "last",
    type=click.IntRange(min=0),
    help="Only the last N matching records (then follow, with -f).",
)
@click.option(
    "--file",
    "file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Read this log file (default: the host's, see above).",
)
@config_option("The corral.toml whose [logging] file to read (env CORRAL_CONFIG).")
@state_dir_option
@json_option
def logs_command(
    follow: bool,
    actors: tuple[str, ...],
    session: str | None,
    level: str | None,
    last: int | None,
    file: Path | None,
    config_path: Path | None,
    state_dir: Path | None,
    as_json: bool,
) -> None:
    """Print the host's log file: every record, oldest first, as logfmt.

    The file is the one `[logging] file` in corral.toml names (rotated files included).
    With --json each record is one JSON object per line (a stream, also with -f).

    \b
    Example:
        corral logs -f --actor dispatch
        corral logs --session 4f2a --level warning --json
    """
    try:
        path = file or find_log_file(state_dir, config_path)
    except ConfigError as exc:
        raise CliError(str(exc), code="config_error", exit_code=EXIT_USAGE) from None
    if not follow and not path.exists():
        raise CliError(f"log file {path} does not exist (yet)", code="no_log_file")
    records = render(log_lines(path, follow=follow), actors, session, level, as_json)
    try:
        _print(records, last)
    except KeyboardInterrupt:
        pass
    except BrokenPipeError:
        # `corral logs | head`: the reader left; say nothing more.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _print(lines: Iterable[str], last: int | None) -> None:
    """Print ``lines``; with ``last``, only the last ``last`` of those the log held (up to
    the empty string that marks the end of them, when following)."""
    held: deque[str] | None = deque(maxlen=last) if last is not None else None
    for line in lines:
        if held is not None and line:
            held.append(line)
            continue
        if held is not None:  # caught up: what the log held is known
            sys.stdout.writelines(f"{kept}\n" for kept in held)
            held = None
        elif line:
            sys.stdout.write(line + "\n")
        sys.stdout.flush()
    if held:
        sys.stdout.writelines(f"{kept}\n" for kept in held)
