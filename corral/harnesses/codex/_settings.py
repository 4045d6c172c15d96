"""Where a ``codex`` turn's settings come from: the agent spec, then the worker environment.

The harness actor builds the worker's environment from the agent spec (``spawn_env.py``):
``HARNESS_CODEX_MODEL`` (the session's override, else the spec's model),
``HARNESS_CODEX_API_KEY`` (a literal key or a ``$VAR`` read from the host, handed over
hidden) and ``HARNESS_CODEX_BASE_URL``; for a harness named otherwise, the prefix is its own
(``HARNESS_<NAME>_``).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field

from .._cli_settings import cli_settings
from .._turn import TurnContext, TurnFailed

DEFAULT_BASE_URL = "https://api.openai.com/v1"
#: No word from the CLI for this long, with no approval pending, ends the turn (Codex itself
#: gives up on a silent provider stream after 300 s).
DEFAULT_IDLE_TIMEOUT_S = 600.0


@dataclass(frozen=True, slots=True)
class Settings:
    """What one turn needs besides its message."""

    model: str
    base_url: str
    api_key: str | None = field(repr=False)
    instructions: str | None
    idle_timeout_s: float


def resolve_settings(turn: TurnContext, environ: Mapping[str, str]) -> Settings:
    """The settings of ``turn``.

    Raises:
        TurnFailed: ``config_error`` naming what is missing or wrong, or
            ``missing_credentials`` for OpenAI itself without a key.
    """
    common = cli_settings(
        turn,
        environ,
        kind="codex",
        default_base_url=DEFAULT_BASE_URL,
        default_idle_timeout_s=DEFAULT_IDLE_TIMEOUT_S,
    )
    if common.api_key is None and common.base_url == DEFAULT_BASE_URL:
        raise TurnFailed(
            "missing_credentials",
            f"no API key for {DEFAULT_BASE_URL}: set executor.auth.api_key or "
            f"{common.prefix}API_KEY",
        )
    return Settings(
        model=common.model,
        base_url=common.base_url,
        api_key=common.api_key,
        instructions=common.instructions,
        idle_timeout_s=common.idle_timeout_s,
    )


def provider_of(base_url: str) -> str:
    """``openai`` for OpenAI's own endpoint, else the ``base_url``'s host (as the openai
    kind reports it)."""
    host = urllib.parse.urlsplit(base_url).hostname or ""
    return "openai" if host.endswith("openai.com") else host
