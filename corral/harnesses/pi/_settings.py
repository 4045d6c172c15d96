"""Where a ``pi`` turn's settings come from: the agent spec, then the worker environment.

The harness actor builds the worker's environment from the agent spec (``spawn_env.py``):
``HARNESS_PI_MODEL`` (the session's override, else the spec's model), ``HARNESS_PI_API_KEY``
(a literal key or a ``$VAR`` read from the host, handed over hidden) and
``HARNESS_PI_BASE_URL``; for a harness named otherwise, the prefix is its own.

pi speaks several provider APIs; which one the agent's endpoint speaks is ``executor.api``
(``openai-completions``, ``openai-responses`` or ``anthropic-messages``), else guessed from
the endpoint's host: OpenAI's own speaks the Responses API, Anthropic's the Messages API,
and anything else — a local or self-hosted endpoint — the Chat Completions API most of them
serve.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .._worker import TurnContext, TurnFailed
from ..spawn_env import env_prefix

DEFAULT_BASE_URL = "https://api.openai.com/v1"
APIS = ("openai-completions", "openai-responses", "anthropic-messages")
#: No word from the CLI for this long, with no approval pending, ends the turn (a command of
#: pi's prints nothing while it runs; its own limit on one is the command's).
DEFAULT_IDLE_TIMEOUT_S = 600.0


@dataclass(frozen=True, slots=True)
class Settings:
    """What one turn needs besides its message."""

    model: str
    base_url: str
    api: str
    api_key: str | None = field(repr=False)
    instructions: str | None
    idle_timeout_s: float


def resolve_settings(turn: TurnContext, environ: Mapping[str, str]) -> Settings:
    """The settings of ``turn``.

    Raises:
        TurnFailed: ``config_error`` naming what is missing or wrong, or
            ``missing_credentials`` for a public provider without a key.
    """
    start = turn.start
    executor: dict[str, Any] = turn.spec.get("executor") or {}
    given = executor.get("auth")
    auth: dict[str, Any] = given if isinstance(given, dict) else {}
    prefix = env_prefix(start.harness_override or start.harness or "pi")
    model = (
        start.model_override
        or executor.get("model")
        or turn.spec.get("model")
        or environ.get(prefix + "MODEL")
    )
    if not isinstance(model, str) or not model:
        raise TurnFailed("config_error", f"no model: set executor.model or {prefix}MODEL")
    base_url = str(
        auth.get("base_url")
        or executor.get("base_url")
        or environ.get(prefix + "BASE_URL")
        or DEFAULT_BASE_URL
    ).rstrip("/")
    host = urllib.parse.urlsplit(base_url)
    if host.scheme not in ("http", "https") or not host.hostname:
        raise TurnFailed("config_error", f"base_url must be an http(s) URL, got {base_url!r}")
    api = executor.get("api") or auth.get("api") or _api_of(host.hostname)
    if api not in APIS:
        raise TurnFailed("config_error", f"api must be one of {', '.join(APIS)}, got {api!r}")
    literal = auth.get("api_key")
    api_key = environ.get(prefix + "API_KEY") or (
        literal if isinstance(literal, str) and literal and not literal.startswith("$") else None
    )
    if api_key is None and _public(host.hostname):
        raise TurnFailed(
            "missing_credentials",
            f"no API key for {base_url}: set executor.auth.api_key or {prefix}API_KEY",
        )
    idle = executor.get("idle_timeout_s", DEFAULT_IDLE_TIMEOUT_S)
    if isinstance(idle, bool) or not isinstance(idle, int | float) or idle < 0:
        raise TurnFailed("config_error", f"idle_timeout_s must be a number >= 0, got {idle!r}")
    instructions = turn.message.get("instructions") or turn.spec.get("prompt")
    return Settings(
        model=model,
        base_url=base_url,
        api=str(api),
        api_key=api_key,
        instructions=str(instructions) if instructions else None,
        idle_timeout_s=float(idle),
    )


def _api_of(host: str) -> str:
    if host.endswith("anthropic.com"):
        return "anthropic-messages"
    if host.endswith("openai.com"):
        return "openai-responses"
    return "openai-completions"


def _public(host: str) -> bool:
    return host.endswith(("openai.com", "anthropic.com"))


def provider_of(base_url: str) -> str:
    """``openai`` or ``anthropic`` for their own endpoints, else the ``base_url``'s host (as
    the other kinds report it)."""
    host = urllib.parse.urlsplit(base_url).hostname or ""
    for name in ("openai", "anthropic"):
        if host.endswith(f"{name}.com"):
            return name
    return host
