"""A session's ``CODEX_HOME``: the config corral writes there, the thread it resumes, and the
environment the CLI runs with.

Codex keeps everything in ``$CODEX_HOME``: its ``config.toml``, the rollout of each thread
(``sessions/…``), its caches. Each session gets its own: the CLI's ``HOME`` is the session's
``cli_home`` (under the host's state dir) and its ``CODEX_HOME`` that home's ``.codex`` —
never a shared ``~/.codex``; as H-12 asks of omnigent's codex bridge root, the root moves
with the host's state dir, so a test's host on a temporary one has its homes there. Two
sessions' CLIs never share state, and a restarted worker finds the thread it resumes.

``config.toml`` is written by corral before each start of the CLI, whole (the provider's
URL may have changed since): a provider ``corral`` at the agent's ``base_url`` speaking the
Responses API, reading its key from :data:`KEY_VAR` — set in the CLI's environment only, from
the worker's hidden ``HARNESS_CODEX_API_KEY`` —, and the settings that keep the CLI offline
(HARNESS_CLIS.md: with analytics on it looks up its analytics hosts and waits ~5 s on exit;
with plugins on it looks up GitHub). The commands Codex runs inherit only the core variables
(``PATH``, ``HOME``, …): never the key.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ... import clis

#: The model provider corral configures.
PROVIDER = "corral"
#: The variable the CLI reads its provider key from (``env_key``).
KEY_VAR = "CODEX_PROVIDER_API_KEY"
CONFIG = "config.toml"
#: Where the id of the session's thread is kept, beside Codex's own state.
THREAD_FILE = "corral-thread.json"
#: What the CLI's environment takes from the worker's (allow-listed already, no secrets).
_PASSED = ("LANG", "LC_ALL", "LC_CTYPE", "TZ", "USER", "LOGNAME", "SHELL", "TERM")


@dataclass(frozen=True, slots=True)
class Launch:
    """What a CLI is started with; a turn that needs another one starts another CLI."""

    cli_path: str
    #: The CLI's ``HOME``: the session's ``cli_home``.
    home: Path
    workdir: Path
    base_url: str
    api_key: str | None = field(repr=False)

    @property
    def codex_home(self) -> Path:
        return self.home / ".codex"

    @property
    def tmp(self) -> Path:
        """The CLI's ``TMPDIR``: Codex puts the helper its Linux sandbox runs commands with
        there, and refuses to when its home is under the temporary directory (a home under
        ``/tmp`` — a test's — with ``/tmp`` as ``TMPDIR`` leaves the sandbox unable to start
        any command: ``bwrap: execvp codex-linux-sandbox``)."""
        return self.home / "tmp"


def config_text(launch: Launch) -> str:
    """The ``config.toml`` of ``launch`` (TOML strings written as JSON strings, which TOML
    reads the same)."""
    provider = [
        f"[model_providers.{PROVIDER}]",
        f"name = {json.dumps(PROVIDER)}",
        f"base_url = {json.dumps(launch.base_url)}",
        'wire_api = "responses"',
    ]
    if launch.api_key:
        provider.append(f"env_key = {json.dumps(KEY_VAR)}")
    else:
        # A local endpoint that wants no key: no login either.
        provider.append("requires_openai_auth = false")
    return "\n".join(
        [
            "# Written by corral before each start of this session's Codex CLI (rewritten then).",
            f"model_provider = {json.dumps(PROVIDER)}",
            "",
            *provider,
            "",
            "[analytics]",
            "enabled = false",
            "",
            "[features]",
            "plugins = false",
            "",
            "[shell_environment_policy]",
            'inherit = "core"',
            "",
        ]
    )


def prepare(launch: Launch) -> None:
    """Create the homes (0700) and the working directory, and write ``config.toml``."""
    launch.codex_home.mkdir(mode=0o700, parents=True, exist_ok=True)
    launch.tmp.mkdir(mode=0o700, exist_ok=True)
    launch.workdir.mkdir(parents=True, exist_ok=True)
    _write_atomically(launch.codex_home / CONFIG, config_text(launch))


def cli_env(launch: Launch, environ: Mapping[str, str]) -> dict[str, str]:
    """The CLI's environment: a few of the worker's variables, its own home, its key."""
    env = {k: environ[k] for k in _PASSED if k in environ}
    env["PATH"] = clis.cli_path_env(launch.cli_path, environ)
    env["HOME"] = str(launch.home)
    env["CODEX_HOME"] = str(launch.codex_home)
    env["TMPDIR"] = str(launch.tmp)
    if launch.api_key:
        env[KEY_VAR] = launch.api_key
    return env


def saved_thread(home: Path) -> str | None:
    """The id of the session's thread, if one was started in ``CODEX_HOME`` ``home``."""
    try:
        saved = json.loads((home / THREAD_FILE).read_text())
    except (OSError, ValueError):
        return None
    thread = saved.get("thread") if isinstance(saved, dict) else None
    return thread if isinstance(thread, str) and thread else None


def save_thread(home: Path, thread_id: str) -> None:
    """Remember the session's thread (durably: a worker killed next resumes it)."""
    _write_atomically(home / THREAD_FILE, json.dumps({"thread": thread_id}))


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "w", encoding="utf-8") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
