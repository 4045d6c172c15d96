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

from .._cli_settings import cli_settings
from .._turn import TurnContext, TurnFailed

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
    common = cli_settings(
        turn,
        environ,
        kind="pi",
        default_base_url=DEFAULT_BASE_URL,
        default_idle_timeout_s=DEFAULT_IDLE_TIMEOUT_S,
    )
    api = common.executor.get("api") or common.auth.get("api") or _api_of(common.host)
    if api not in APIS:
        raise TurnFailed("config_error", f"api must be one of {', '.join(APIS)}, got {api!r}")
    if common.api_key is None and _public(common.host):
        raise TurnFailed(
            "missing_credentials",
            f"no API key for {common.base_url}: set executor.auth.api_key or "
            f"{common.prefix}API_KEY",
        )
    return Settings(
        model=common.model,
        base_url=common.base_url,
        api=str(api),
        api_key=common.api_key,
        instructions=common.instructions,
        idle_timeout_s=common.idle_timeout_s,
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
