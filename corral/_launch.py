"""The ``corral`` command: ``corral up`` first makes the seed, then every command runs the CLI.

The seed (:mod:`corral._zygote._seed`) must be forked before the host holds any secret, so
``corral up`` execs itself again with its secrets moved to a memfd
(:func:`corral._child_env.reexec_clean`) before it imports anything heavy, forks the seed after
importing what the actors and workers run, and only then takes its secrets back and parses
its flags and config.
"""

from __future__ import annotations

import sys


def main() -> None:
    """Entry point of the ``corral`` command and of ``python -m corral``."""
    if sys.argv[1:2] == ["up"]:
        _seed()
    from corral.cli import main as cli

    cli()


def _seed() -> None:
    from corral._child_env import reexec_clean, take_hidden_env

    reexec_clean()
    from corral._zygote import fork_seed
    from corral.actors._actor_specs import actor_preload
    from corral.actors.harness import worker_preload
    from corral.config import Config

    fork_seed((*actor_preload(Config()), *worker_preload()))
    take_hidden_env()
