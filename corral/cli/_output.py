"""Shared CLI plumbing: ``--json``, reaching the host, and picking an id by its prefix.

Exit codes: 0 success, 1 a failure the message explains, 2 usage error, 3 no running host
(:mod:`._errors`, which tells every failure). Data goes to stdout (exactly one JSON document
with ``--json``); diagnostics go to stderr.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.table import Table

from .._exceptions import CorralError, HostNotRunning
from ..actors._control import request
from ..config import resolve_state_dir
from ..instance import Instance
from ._errors import EXIT_FAILURE, EXIT_NO_HOST, EXIT_USAGE, CliError, NoHost

__all__ = [
    "EXIT_FAILURE",
    "EXIT_NO_HOST",
    "EXIT_USAGE",
    "CliError",
    "NoHost",
]

F = TypeVar("F", bound=Callable[..., Any])

#: Diagnostics; never wrapped, so a pipe reads each line whole.
stderr = Console(stderr=True, soft_wrap=True)


def no_host_message(state_dir: Path) -> str:
    """The one wording of "nothing runs there" (exit code 3)."""
    return f"no running host found on {state_dir} (start one with `corral up`)"


def json_option(fn: F) -> F:
    """Add ``--json``: print exactly one JSON document instead of a table."""
    return click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")(fn)


def state_dir_option(fn: F) -> F:
    """Add ``--state-dir`` (default: ``CORRAL_STATE_DIR``, then the user state dir)."""
    return click.option(
        "--state-dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help="The host's state dir (env CORRAL_STATE_DIR).",
    )(fn)


def config_option(help: str) -> Callable[[F], F]:
    """Add ``--config FILE`` (env ``CORRAL_CONFIG``), saying what of it is read."""

    def add(fn: F) -> F:
        return click.option(
            "--config",
            "config_path",
            type=click.Path(dir_okay=False, path_type=Path),
            envvar="CORRAL_CONFIG",
            help=help,
        )(fn)

    return add


def config_path_of(config_path: Path | None, state_dir: Path | None) -> Path | None:
    """The ``--config`` given, else the state dir's ``corral.toml`` (the one a plain
    ``corral up`` reads) if there is one."""
    if config_path is not None:
        return config_path
    fresh = resolve_state_dir(str(state_dir) if state_dir else None) / "corral.toml"
    return fresh if fresh.exists() else None


def print_table(table: Table, *, ids: tuple[str, ...] = ()) -> None:
    """Print ``table`` on stdout with the columns named in ``ids`` whole (an id is never cut
    or folded: it is what an operator copies into the next command). A pipe gets every row
    on one line, whatever its length; a terminal gets its width, the other columns wrapped."""
    for column in table.columns:
        if column.header in ids:
            column.no_wrap = True
            column.min_width = max((len(str(c)) for c in column.cells), default=0)
    console = Console() if sys.stdout.isatty() else Console(width=100_000)
    console.print(table)


def emit_json(data: Any) -> None:
    """Print one JSON document to stdout."""
    sys.stdout.write(json.dumps(data) + "\n")


def ask_host(state_dir: Path | None, op: str, *, timeout: float = 10.0, **args: Any) -> Any:
    """Send one control request to the host running on ``state_dir`` (``timeout``: for its
    answer).

    Raises:
        NoHost: nothing runs there (exit code 3).
        CliError: the host answered with an error, or not in time (exit code 1).
    """
    inst = Instance(resolve_state_dir(str(state_dir) if state_dir else None))
    host = inst.read_host()
    path = Path(host["control"]) if host and "control" in host else inst.control_path
    try:
        return request(path, op, timeout=timeout, **args)
    except (FileNotFoundError, ConnectionRefusedError, ConnectionError) as exc:
        raise NoHost(no_host_message(inst.state_dir)) from exc
    except RuntimeError as exc:
        raise CliError(f"the host failed to answer {op}: {exc}", code="host_error") from exc
    except TimeoutError as exc:
        raise CliError(f"the host on {inst.state_dir} did not answer", code="host_timeout") from exc
    except ValueError as exc:  # it closed the connection mid-answer (it was stopping)
        raise CliError(
            f"the host on {inst.state_dir} closed the connection without an answer",
            code="host_error",
        ) from exc
    except OSError as exc:  # e.g. another user's host: its socket is 0600
        raise CliError(
            f"cannot reach the host on {inst.state_dir}: {exc.strerror or exc}",
            code="host_unreachable",
        ) from exc


def pick(given: str, candidates: list[str], what: str, plural: str | None = None) -> str:
    """The one of ``candidates`` that is ``given`` or starts with it.

    Raises:
        CliError: none does (exit 1, ``not_found``, naming what exists when that is short),
            or several do (exit 2, ``ambiguous_id``, naming them).
    """
    if given in candidates:
        return given
    found = sorted({c for c in candidates if c.startswith(given)}) if given else []
    if len(found) == 1:
        return found[0]
    if found:
        shown = ", ".join(found[:20]) + (f" and {len(found) - 20} more" if len(found) > 20 else "")
        raise CliError(
            f"{what} {given!r} is ambiguous: it begins {shown}",
            code="ambiguous_id",
            exit_code=EXIT_USAGE,
        )
    known = sorted(set(candidates))
    plural = plural or f"{what}s"
    there = (
        f" ({plural} here: {', '.join(known)})"
        if 0 < len(known) <= 20
        else (f" ({plural} here: none)" if not known else "")
    )
    raise CliError(f"no {what} {given!r}{there}", code="not_found")


def corral_errors(fn: F) -> F:
    """Turn corral errors into one clear message and exit code 1 (3 for no host)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except HostNotRunning as exc:
            raise NoHost(str(exc)) from exc
        except CorralError as exc:
            raise CliError(str(exc)) from exc

    return wrapper  # type: ignore[return-value]
