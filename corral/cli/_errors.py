"""How every verb fails: one ``error: ...`` line on stderr, an exit code, and under ``--json``
one JSON document on stdout.

The document is ``{"error": {"code", "message"}}``; a verb whose success document has a
list (``agents``, ``subagents``) or a turn (``send``) adds those fields, empty, so a script
reads one shape either way. The codes are in docs/cli.md ("Errors"). Kept apart from
:mod:`._output` because the entry point imports it for every verb, ``corral up`` too, and it
needs nothing but click.

Exit codes: 0 success, 1 a failure the message explains, 2 usage error, 3 no running host.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import IO, Any

import click

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_NO_HOST = 3


class CliError(click.ClickException):
    """A failure of a verb, with its code (``not_found``, ``ambiguous_id``, ...).

    Args:
        message: one line saying what failed and, where it helps, what exists instead.
        code: the ``error.code`` of the ``--json`` document.
        exit_code: 1 by default.
        document: the fields the verb's ``--json`` error document has besides ``error``.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str = "error",
        exit_code: int = EXIT_FAILURE,
        document: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.exit_code = exit_code  # type: ignore[misc]  # click reads it per instance
        self.document = document or {}

    def show(self, file: IO[Any] | None = None) -> None:
        report(self, as_json=False)


class NoHost(CliError):
    """No running host answers on the state dir (exit code 3)."""

    def __init__(self, message: str, *, document: dict[str, Any] | None = None) -> None:
        super().__init__(message, code="no_host", exit_code=EXIT_NO_HOST, document=document)


def code_of(exc: click.ClickException) -> str:
    """The ``error.code`` of any click failure."""
    if isinstance(exc, CliError):
        return exc.code
    return "usage" if isinstance(exc, click.UsageError) else "error"


def report(exc: click.ClickException, *, as_json: bool) -> None:
    """Tell a failure once: the line on stderr, and the document on stdout under
    ``--json``. The line is written as it is, never wrapped (a pipe reads it whole)."""
    message = exc.format_message()
    if as_json:
        document = exc.document if isinstance(exc, CliError) else {}
        error = {"code": code_of(exc), "message": message}
        sys.stdout.write(json.dumps({**document, "error": error}) + "\n")
        sys.stdout.flush()
    hint = ""
    if isinstance(exc, click.UsageError) and exc.ctx is not None:
        hint = f" (see `{exc.ctx.command_path} --help`)"
    sys.stderr.write(f"error: {message}{hint}\n")
    sys.stderr.flush()


def wants_json(args: Sequence[str]) -> bool:
    """Whether the command line asks for ``--json`` (before a ``--``, if any)."""
    args = list(args)
    if "--" in args:
        args = args[: args.index("--")]
    return "--json" in args


def run(group: click.Group, args: Sequence[str] | None = None) -> None:
    """Run the command line and exit with its code, every failure told by :func:`report`."""
    argv = list(sys.argv[1:] if args is None else args)
    try:
        code = group.main(
            argv, prog_name="corral", standalone_mode=False, auto_envvar_prefix="CORRAL"
        )
    except click.ClickException as exc:
        report(exc, as_json=wants_json(argv))
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        # Ctrl-C or Ctrl-D outside a verb's own handling: click has ended the line already.
        sys.exit(EXIT_FAILURE)
    sys.exit(code if isinstance(code, int) else 0)
