"""What a ``claude-sdk`` turn runs Claude Code with: its settings, command line and environment.

:func:`resolve` reads :class:`Settings` from the agent spec, the worker options and the
worker's ``HARNESS_<NAME>_*`` variables (docs/harnesses.md, *claude-sdk*); :func:`argv` and
:func:`cli_env` turn them into the CLI's command line and environment. The environment is
the worker's allow-list (never the host's other secrets, never a corral token) plus only
what Claude Code needs: its provider key and base URL, the session's own ``HOME``, and the
variables that keep it off the network (HARNESS_CLIS.md: without them it looks up DNS names
and sends ``HEAD /api/hello``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ... import clis
from ..._child_env import base_env
from .._turn import TurnFailed
from .._turn_message import tool_rows
from ..spawn_env import env_prefix

#: The name of corral's MCP server inside Claude Code: its tools are ``mcp__corral__<name>``.
MCP_SERVER = "corral"
MCP_PREFIX = f"mcp__{MCP_SERVER}__"
#: Always set for the CLI: no telemetry, no update checks, no reachability probes.
OFFLINE = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
}
#: Tunables, from ``executor`` then the worker options.
DEFAULTS: dict[str, float] = {
    # No line from the CLI for this long while it is not waiting on a person or a runner
    # tool: the turn fails ``timeout`` (a Bash command of its own prints nothing meanwhile,
    # and Claude Code's own limit on one is 10 minutes).
    "idle_timeout_s": 900.0,
    "turn_timeout_s": 3600.0,  # the whole turn; 0 disables
    "max_retries": 2,  # Claude Code's retries of one model call (its own default is 10)
}
PERMISSION_MODES = ("default", "acceptEdits", "bypassPermissions", "dontAsk", "plan")
_VAR = re.compile(r"^\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?$")


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything one turn's CLI is started with. Two turns whose :attr:`key` is equal can
    share one running CLI."""

    harness: str
    model: str | None
    base_url: str | None
    api_key: str = field(repr=False)
    #: The agent's instructions, and whether they replace Claude Code's own system prompt.
    instructions: str | None
    replace_system_prompt: bool
    permission_mode: str
    #: The runner tools offered over MCP, as ``(name, description, input schema)``.
    tools: tuple[tuple[str, str, str], ...]
    idle_timeout_s: float
    turn_timeout_s: float
    max_retries: int

    @property
    def key(self) -> tuple[Any, ...]:
        """What the running CLI was started with (everything but the timeouts)."""
        return (
            self.model,
            self.base_url,
            self.api_key,
            self.instructions,
            self.replace_system_prompt,
            self.permission_mode,
            self.tools,
            self.max_retries,
        )

    @property
    def provider(self) -> str:
        """``anthropic`` for Anthropic's own API, else the base URL's host."""
        host = urlsplit(self.base_url).hostname if self.base_url else None
        return "anthropic" if not host or host.endswith("anthropic.com") else host

    def idle_limit(self) -> float:
        return self.idle_timeout_s or math.inf


def resolve(
    spec: Mapping[str, Any],
    message: Mapping[str, Any],
    options: Mapping[str, Any],
    environ: Mapping[str, str],
    *,
    harness: str,
    model_override: str | None,
) -> Settings:
    """The settings of a turn.

    Raises:
        TurnFailed: ``config_error`` naming a bad value; ``missing_credentials`` without a key.
    """
    executor = spec.get("executor") or {}
    auth = executor.get("auth") or {}
    if not isinstance(auth, dict):
        raise TurnFailed("config_error", "executor.auth must be a mapping")
    prefix = env_prefix(harness)

    def pick(key: str, *sources: Mapping[str, Any]) -> Any:
        return next((s[key] for s in sources if s.get(key) not in (None, "")), None)

    model = model_override or pick("model", executor, spec, options)
    model = model or environ.get(prefix + "MODEL")
    # A literal key, or "$VAR": the harness actor resolved either into HARNESS_<NAME>_API_KEY.
    api_key = environ.get(prefix + "API_KEY") or pick("api_key", options)
    literal = pick("api_key", auth, executor)
    if not api_key and isinstance(literal, str) and not _VAR.match(literal):
        api_key = literal
    if not api_key:
        raise TurnFailed(
            "missing_credentials",
            f"no Anthropic API key for the {harness!r} harness: set executor.auth.api_key "
            f"or {prefix}API_KEY",
        )
    base_url = pick("base_url", auth, executor, options) or environ.get(prefix + "BASE_URL")
    if base_url is not None:
        base_url = _base_url(str(base_url))
    mode = pick("permission_mode", executor, options) or "default"
    if mode not in PERMISSION_MODES:
        raise TurnFailed(
            "config_error", f"executor.permission_mode must be one of {PERMISSION_MODES}"
        )
    system_prompt = pick("system_prompt", executor, options) or "append"
    if system_prompt not in ("append", "replace"):
        raise TurnFailed("config_error", "executor.system_prompt must be 'append' or 'replace'")
    tunables: dict[str, float] = {}
    for name, default in DEFAULTS.items():
        value = pick(name, executor, options)
        value = default if value is None else value
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise TurnFailed("config_error", f"{name} must be a number >= 0, got {value!r}")
        tunables[name] = float(value)
    instructions = message.get("instructions") or spec.get("prompt")
    return Settings(
        harness=harness,
        model=str(model) if model else None,
        base_url=base_url,
        api_key=str(api_key),
        instructions=str(instructions) if instructions else None,
        replace_system_prompt=system_prompt == "replace",
        permission_mode=str(mode),
        tools=tool_rows(message.get("tools")),
        idle_timeout_s=tunables["idle_timeout_s"],
        turn_timeout_s=tunables["turn_timeout_s"],
        max_retries=int(tunables["max_retries"]),
    )


def mapping(value: Any) -> dict[str, Any]:
    """``value`` if it is a JSON object, else an empty one (a CLI's line read leniently)."""
    return value if isinstance(value, dict) else {}


def _base_url(raw: str) -> str:
    """Claude Code appends ``/v1/messages`` itself: a base URL written with ``/v1`` (as the
    Anthropic SDKs' docs show it) is taken without."""
    url = raw.rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TurnFailed("config_error", f"executor.auth.base_url is not an http(s) URL: {raw!r}")
    return url.removesuffix("/v1")


def argv(cli: str, settings: Settings, *, resume: str | None) -> list[str]:
    """Claude Code's command line: stream-json both ways, permission prompts to the host."""
    args = [
        cli,
        "-p",
        "--output-format",
        "stream-json",
        "--input-format",
        "stream-json",
        "--verbose",
        "--include-partial-messages",
        "--permission-prompt-tool",
        "stdio",
        "--permission-mode",
        settings.permission_mode,
    ]
    if settings.model:
        args += ["--model", settings.model]
    if settings.instructions:
        flag = "--system-prompt" if settings.replace_system_prompt else "--append-system-prompt"
        args += [flag, settings.instructions]
    if settings.tools:
        # An SDK server: Claude Code speaks MCP to it over this same control channel.
        config = {"mcpServers": {MCP_SERVER: {"type": "sdk", "name": MCP_SERVER}}}
        # The runner's own path decides its tools (policy, approvals): no second ask here.
        args += ["--mcp-config", json.dumps(config), "--allowedTools", f"mcp__{MCP_SERVER}"]
    if resume:
        args += ["--resume", resume]
    return args


def cli_env(cli: str, settings: Settings, home: Path, environ: Mapping[str, str]) -> dict[str, str]:
    """The CLI's environment (see the module docstring)."""
    env = base_env(environ)
    env.pop(clis.CLI_PATH_ENV, None)
    env.update(OFFLINE)
    env["HOME"] = str(home)
    env["PATH"] = clis.cli_path_env(cli, env)
    env["ANTHROPIC_API_KEY"] = settings.api_key
    env["CLAUDE_CODE_MAX_RETRIES"] = str(settings.max_retries)
    # corral's tools in the model's tool list, as every kind offers them, rather than behind
    # Claude Code's ToolSearch (which defers MCP tools by default).
    env["ENABLE_TOOL_SEARCH"] = "false"
    if settings.base_url:
        env["ANTHROPIC_BASE_URL"] = settings.base_url
    return env
