"""The ``corral`` command line: one click group, one module per family of verbs.

A verb's module is imported only when that verb runs: ``corral status`` has no use for the
host, the chat client or the benchmarks, and every CLI call (every ``corral up`` too) would
pay for importing them all.
"""

from __future__ import annotations

import importlib

import click

from .. import __version__

#: Each verb and where it lives (``module:attribute`` under ``corral.cli``), in help order.
COMMANDS: dict[str, str] = {
    "up": "_up:up_command",
    "logs": "_logs:logs_command",
    "status": "_inspect:status_command",
    "mailboxes": "_inspect:mailboxes_command",
    "sessions": "_sessions:sessions_command",
    "dead-letters": "_queues:dead_letters_group",
    "elicitations": "_queues:elicitations_group",
    "subagents": "_subagents:subagents_command",
    "harnesses": "_harnesses:harnesses_command",
    "bench": "_bench:bench_command",
    "journal": "_journal:journal_group",
    "agents": "_agents:agents_group",
    "send": "_chat:send_command",
    "chat": "_repl:chat_command",
    "token": "_token:token_group",
}


class _LazyGroup(click.Group):
    """A group whose commands are imported on first use (``--help`` imports them all)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        where = COMMANDS.get(cmd_name)
        if where is None:
            return None
        module, attr = where.split(":")
        command = getattr(importlib.import_module(f"{__name__}.{module}"), attr)
        assert isinstance(command, click.Command), where
        return command


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="corral")
def cli() -> None:
    """corral: a crash-proof host for AI-agent runner sessions."""


def main() -> None:
    """Console-script entry point: every failure is told one way (:mod:`._errors`)."""
    from ._errors import run

    run(cli)
