"""The ``corral`` command line: one click group, one module per family of verbs."""

from __future__ import annotations

import click

from .. import __version__
from ._bench import bench_command
from ._chat import agents_command, chat_command, send_command
from ._inspect import (
    dead_letters_command,
    elicitations_command,
    mailboxes_command,
    status_command,
)
from ._journal import journal_group
from ._up import up_command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="corral")
def cli() -> None:
    """corral: a crash-proof host for AI-agent runner sessions."""


cli.add_command(up_command)
cli.add_command(status_command)
cli.add_command(mailboxes_command)
cli.add_command(dead_letters_command)
cli.add_command(elicitations_command)
cli.add_command(bench_command)
cli.add_command(journal_group)
cli.add_command(agents_command)
cli.add_command(send_command)
cli.add_command(chat_command)


def main() -> None:
    """Console-script entry point."""
    cli(auto_envvar_prefix="CORRAL")
