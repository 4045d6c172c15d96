"""A session's pi directory: the files corral writes there, and the CLI's command line and
environment.

pi reads its providers from ``$PI_CODING_AGENT_DIR/models.json`` and keeps its settings and
caches beside it. Each session gets its own: the CLI's ``HOME`` is the session's ``cli_home``
(under the host's state dir) and its agent dir that home's ``.pi/agent`` — never a shared
``~/.pi`` — so two sessions' CLIs never share state.

Before each start of the CLI corral writes, whole (the provider's URL may have changed):

* ``models.json`` (0600): one provider, :data:`PROVIDER`, at the agent's ``base_url``
  speaking its ``api``, with the agent's key and model. The key is in this file only, never
  in the CLI's environment, which the commands pi runs inherit.
* :data:`GATE` — pi has no permission system of its own (HARNESS_CLIS.md): this extension's
  ``tool_call`` handler asks ``ctx.ui.confirm`` before every tool call, which in RPC mode
  reaches corral as an ``extension_ui_request``; a refusal blocks the call. Its message is
  the call as JSON (:data:`GATE_TITLE` marks it as the gate's).
* the agent's instructions, which pi appends to its own system prompt.

pi runs with no other extension (``--no-extensions``), and offline
(:data:`OFFLINE`: no catalog refresh, no version check, no telemetry).
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
GATE = "corral-gate.ts"
INSTRUCTIONS = "corral-instructions.md"
#: The title of the gate's confirmation requests.
GATE_TITLE = "corral: allow this tool call?"
#: What the model is told of a call the gate blocked.
BLOCKED = "corral did not allow this tool call (a person declined it, or a policy denied it)."
#: Always set for the CLI: no network but the provider's.
OFFLINE = {"PI_OFFLINE": "1", "PI_SKIP_VERSION_CHECK": "1", "PI_TELEMETRY": "0"}
#: What the CLI's environment takes from the worker's (allow-listed already, no secrets).
_PASSED = ("LANG", "LC_ALL", "LC_CTYPE", "TZ", "USER", "LOGNAME", "SHELL", "TERM")
#: A local endpoint that wants no key still gets one: pi will not call a provider without.
_NO_KEY = "corral-no-key"

_GATE_SOURCE = f"""\
// Written by corral before each start of this session's pi: every tool call is put to
// corral (its policy, then a person) through ctx.ui.confirm, and blocked unless allowed.
export default function (pi: any) {{
  pi.on("tool_call", async (event: any, ctx: any) => {{
    const call = {{ tool: event.toolName, call_id: event.toolCallId, input: event.input }};
    const allowed = await ctx.ui.confirm({json.dumps(GATE_TITLE)}, JSON.stringify(call));
    if (!allowed) return {{ block: true, reason: {json.dumps(BLOCKED)} }};
  }});
}}
"""


@dataclass(frozen=True, slots=True)
class Launch:
    """What a CLI is started with; a turn that needs another one starts another CLI."""

    cli_path: str
    #: The CLI's ``HOME``: the session's ``cli_home``.
    home: Path
    workdir: Path
    base_url: str
    api: str
    model: str
    instructions: str | None
    api_key: str | None = field(repr=False)

    @property
    def agent_dir(self) -> Path:
        return self.home / ".pi" / "agent"


def models_json(launch: Launch) -> str:
    """The ``models.json`` of ``launch``."""
    provider = {
        "baseUrl": launch.base_url,
        "api": launch.api,
        "apiKey": launch.api_key or _NO_KEY,
        "models": [{"id": launch.model, "name": launch.model}],
    }
    return json.dumps({"providers": {PROVIDER: provider}}, indent=2)


def prepare(launch: Launch) -> None:
    """Create the homes (0700) and the working directory, and write corral's files."""
    launch.agent_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    launch.workdir.mkdir(parents=True, exist_ok=True)
    _write_atomically(launch.agent_dir / "models.json", models_json(launch))
    _write_atomically(launch.agent_dir / GATE, _GATE_SOURCE)
    if launch.instructions:
        _write_atomically(launch.agent_dir / INSTRUCTIONS, launch.instructions)


def argv(launch: Launch) -> list[str]:
    """The CLI's command line: RPC mode, no saved session, corral's provider and gate."""
    line = [
        launch.cli_path,
        "--mode",
        "rpc",
        "--no-session",
        "--provider",
        PROVIDER,
        "--model",
        launch.model,
        "--no-extensions",
        "-e",
        str(launch.agent_dir / GATE),
    ]
    if launch.instructions:
        # A path: pi reads the file, so instructions that look like a path are still text.
        line += ["--append-system-prompt", str(launch.agent_dir / INSTRUCTIONS)]
    return line


def cli_env(launch: Launch, environ: Mapping[str, str]) -> dict[str, str]:
    """The CLI's environment: a few of the worker's variables, its own home, offline."""
    env = {k: environ[k] for k in _PASSED if k in environ}
    env["PATH"] = clis.cli_path_env(launch.cli_path, environ)
    env["HOME"] = str(launch.home)
    env["PI_CODING_AGENT_DIR"] = str(launch.agent_dir)
    env.update(OFFLINE)
    return env


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with open(fd, "w", encoding="utf-8") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
