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
* :data:`GATE`, corral's extension. pi has no permission system of its own
  (HARNESS_CLIS.md): the extension's ``tool_call`` handler asks ``ctx.ui.confirm`` before
  every call of pi's own tools, which in RPC mode reaches corral as an
  ``extension_ui_request``; a refusal blocks the call. Its message is the call as JSON
  (:data:`GATE_TITLE` marks it as the gate's). The extension also registers the runner's
  tools (the turn's ``tools``, written into it): a call of one asks ``ctx.ui.input``
  (:data:`TOOL_TITLE`, the call as JSON in its ``placeholder``), which corral answers with
  the tool's output once the runner ran it — so the runner's own path (its policy, dispatch)
  decides those, not the gate.
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
#: The title of the input requests that run one of the runner's tools.
TOOL_TITLE = "corral: run this runner tool"
#: What the model is told of a call the gate blocked.
BLOCKED = "corral did not allow this tool call (a person declined it, or a policy denied it)."
#: Always set for the CLI: no network but the provider's.
OFFLINE = {"PI_OFFLINE": "1", "PI_SKIP_VERSION_CHECK": "1", "PI_TELEMETRY": "0"}
#: What the CLI's environment takes from the worker's (allow-listed already, no secrets).
_PASSED = ("LANG", "LC_ALL", "LC_CTYPE", "TZ", "USER", "LOGNAME", "SHELL", "TERM")
#: A local endpoint that wants no key still gets one: pi will not call a provider without.
_NO_KEY = "corral-no-key"

_GATE_SOURCE = """\
// Written by corral before each start of this session's pi. Every call of pi's own tools is
// put to corral (its policy, then a person) through ctx.ui.confirm, and blocked unless
// allowed; the runner's tools are registered here and run by corral (ctx.ui.input answers
// with the output), on the runner's own path.
const GATE_TITLE = %(gate_title)s;
const TOOL_TITLE = %(tool_title)s;
const BLOCKED = %(blocked)s;
const RUNNER_TOOLS: Array<{ name: string; description: string; parameters: any }> = %(tools)s;

export default function (pi: any) {
  const runner = new Set(RUNNER_TOOLS.map((tool) => tool.name));
  for (const tool of RUNNER_TOOLS) {
    pi.registerTool({
      name: tool.name,
      label: tool.name,
      description: tool.description,
      parameters: tool.parameters,
      async execute(toolCallId: string, params: any, _signal: any, _onUpdate: any, ctx: any) {
        const call = { tool: tool.name, call_id: toolCallId, arguments: params };
        const output = await ctx.ui.input(TOOL_TITLE, JSON.stringify(call));
        if (output === undefined) throw new Error(`the runner did not run ${tool.name}`);
        return { content: [{ type: "text", text: output }], details: {} };
      },
    });
  }
  pi.on("tool_call", async (event: any, ctx: any) => {
    if (runner.has(event.toolName)) return;
    const call = { tool: event.toolName, call_id: event.toolCallId, input: event.input };
    const allowed = await ctx.ui.confirm(GATE_TITLE, JSON.stringify(call));
    if (!allowed) return { block: true, reason: BLOCKED };
  });
}
"""

#: A runner tool as the extension registers it: name, description, parameters (JSON Schema,
#: as JSON text, so that a :class:`Launch` can be compared).
RunnerTool = tuple[str, str, str]


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
    tools: tuple[RunnerTool, ...] = ()

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


def gate_source(launch: Launch) -> str:
    """The extension of ``launch``: the gate, and its runner tools."""
    tools = [
        {"name": name, "description": description or name, "parameters": json.loads(schema)}
        for name, description, schema in launch.tools
    ]
    return _GATE_SOURCE % {
        "gate_title": json.dumps(GATE_TITLE),
        "tool_title": json.dumps(TOOL_TITLE),
        "blocked": json.dumps(BLOCKED),
        "tools": json.dumps(tools, ensure_ascii=True),
    }


def prepare(launch: Launch) -> None:
    """Create the homes (0700) and the working directory, and write corral's files."""
    launch.agent_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    launch.workdir.mkdir(parents=True, exist_ok=True)
    _write_atomically(launch.agent_dir / "models.json", models_json(launch))
    _write_atomically(launch.agent_dir / GATE, gate_source(launch))
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
