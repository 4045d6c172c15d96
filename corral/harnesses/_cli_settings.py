"""The settings every coding-agent CLI kind reads alike from a turn: its model, endpoint, key,
instructions and idle timeout (the codex and pi kinds; claude-sdk has its own, since Claude
Code takes its settings as variables of its own).

Each comes from the agent spec, then from the worker's environment, which the harness actor
builds from the spec (``spawn_env.py``): ``HARNESS_<KIND>_MODEL`` (the session's override,
else the spec's model), ``HARNESS_<KIND>_API_KEY`` (a literal key or a ``$VAR`` read from
the host, handed over hidden) and ``HARNESS_<KIND>_BASE_URL``.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._turn import TurnContext, TurnFailed
from .spawn_env import env_prefix


@dataclass(frozen=True, slots=True)
class CliSettings:
    """What a CLI kind's turn reads alike; a kind adds its own checks (a key it requires, an
    API it must be told)."""

    executor: dict[str, Any]
    auth: dict[str, Any]
    #: ``HARNESS_<KIND>_``: the worker variables the settings came from.
    prefix: str
    model: str
    base_url: str
    #: The endpoint's host name.
    host: str
    api_key: str | None = field(repr=False)
    instructions: str | None
    idle_timeout_s: float


def cli_settings(
    turn: TurnContext,
    environ: Mapping[str, str],
    *,
    kind: str,
    default_base_url: str,
    default_idle_timeout_s: float,
) -> CliSettings:
    """The settings of ``turn`` that every CLI kind reads alike.

    Raises:
        TurnFailed: ``config_error`` naming what is missing or wrong.
    """
    start = turn.start
    executor: dict[str, Any] = turn.spec.get("executor") or {}
    given = executor.get("auth")
    auth: dict[str, Any] = given if isinstance(given, dict) else {}
    prefix = env_prefix(start.harness_override or start.harness or kind)
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
        or default_base_url
    ).rstrip("/")
    parsed = urllib.parse.urlsplit(base_url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise TurnFailed("config_error", f"base_url must be an http(s) URL, got {base_url!r}")
    literal = auth.get("api_key")
    api_key = environ.get(prefix + "API_KEY") or (
        literal if isinstance(literal, str) and literal and not literal.startswith("$") else None
    )
    idle = executor.get("idle_timeout_s", default_idle_timeout_s)
    if isinstance(idle, bool) or not isinstance(idle, int | float) or idle < 0:
        raise TurnFailed("config_error", f"idle_timeout_s must be a number >= 0, got {idle!r}")
    instructions = turn.message.get("instructions") or turn.spec.get("prompt")
    return CliSettings(
        executor=executor,
        auth=auth,
        prefix=prefix,
        model=model,
        base_url=base_url,
        host=parsed.hostname,
        api_key=api_key,
        instructions=str(instructions) if instructions else None,
        idle_timeout_s=float(idle),
    )
