"""Shared CLI plumbing: ``--json``, reaching the host, errors and exit codes.

Exit codes: 0 success, 1 a failure the message explains, 2 usage error, 3 no running host.
Data goes to stdout (exactly one JSON document with ``--json``); diagnostics go to stderr.
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

from .._exceptions import CorralError, HostNotRunning
from ..actors._control import request
from ..config import resolve_state_dir
from ..instance import Instance

F = TypeVar("F", bound=Callable[..., Any])

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_NO_HOST = 3

stderr = Console(stderr=True)


class NoHost(click.ClickException):
    """No running host answers on the state dir."""

    exit_code = EXIT_NO_HOST


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


def emit_json(data: Any) -> None:
    """Print one JSON document to stdout."""
    sys.stdout.write(json.dumps(data) + "\n")


def ask_host(state_dir: Path | None, op: str, *, timeout: float = 10.0, **args: Any) -> Any:
    """Send one control request to the host running on ``state_dir`` (``timeout``: for its
    answer).

    Raises:
        NoHost: nothing runs there (exit code 3).
        click.ClickException: the host answered with an error (exit code 1).
    """
    inst = Instance(resolve_state_dir(str(state_dir) if state_dir else None))
    host = inst.read_host()
    path = Path(host["control"]) if host and "control" in host else inst.control_path
    try:
        return request(path, op, timeout=timeout, **args)
    except (FileNotFoundError, ConnectionRefusedError, ConnectionError) as exc:
        raise NoHost(
            f"no corral host is running on {inst.state_dir} (start one with `corral up`)"
        ) from exc
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from exc
    except TimeoutError as exc:
        raise click.ClickException(f"the host on {inst.state_dir} did not answer") from exc


def corral_errors(fn: F) -> F:
    """Turn corral errors into one clear message and exit code 1 (3 for no host)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except HostNotRunning as exc:
            raise NoHost(str(exc)) from exc
        except CorralError as exc:
            raise click.ClickException(str(exc)) from exc

    return wrapper  # type: ignore[return-value]
