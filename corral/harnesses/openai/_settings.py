"""Where an ``openai`` turn's settings come from: the spec, then worker options, then environment.

:func:`resolve_settings` reads them into one :class:`Settings` (documented in
``docs/harnesses.md``), naming the key of a bad value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from ..._jsonlines import JsonObject
from .._turn import TurnFailed
from ..spawn_env import env_prefix

DEFAULT_BASE_URL = "https://api.openai.com/v1"
#: Harness names whose agents were written for the Responses API (PROTOCOL_FACTS §iii.3).
RESPONSES_HARNESSES = frozenset({"openai-agents", "open-responses"})
APIS = ("responses", "chat")


_VAR = re.compile(r"^\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?$")

#: Tunables, read from ``spec["executor"]``, then the worker options.
DEFAULTS: dict[str, float] = {
    "max_steps": 25,  # model calls per turn
    "max_attempts": 5,  # tries of one model call (429/5xx/connection errors)
    "backoff_base_s": 1.0,  # first retry delay; doubles per attempt, with jitter
    "backoff_max_s": 30.0,  # cap on one delay, retry-after included
    "idle_timeout_s": 180.0,  # no byte from the provider for this long: timeout; 0 disables
    "turn_timeout_s": 3600.0,  # whole turn, tool calls included; 0 disables
}
#: ``HARNESS_<NAME>_<SUFFIX>`` variables per setting; ``GATEWAY_BASE_URL`` is what the runner
#: corral replaces sets for ``openai-agents`` (PROTOCOL_FACTS §iv).
_ENV_SUFFIXES = {
    "model": ("MODEL",),
    "api_key": ("API_KEY",),
    "base_url": ("BASE_URL", "GATEWAY_BASE_URL"),
}


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything one turn needs to talk to the provider."""

    harness: str
    api: str
    model: str
    base_url: str
    api_key: str | None = field(repr=False)
    max_steps: int
    max_attempts: int
    backoff_base_s: float
    backoff_max_s: float
    idle_timeout_s: float
    turn_timeout_s: float
    headers: dict[str, str] = field(default_factory=dict)
    extra_body: JsonObject = field(default_factory=dict)

    def timeout(self) -> httpx.Timeout:
        """The idle watchdog, as the HTTP client's own timeouts: each connect, write and read
        of a model call waits at most ``idle_timeout_s`` (0: forever). Only waits on the
        provider count: the time the turn spends emitting what it read does not."""
        return httpx.Timeout(self.idle_timeout_s or None)

    @property
    def provider(self) -> str:
        """``"openai"`` for api.openai.com, else the base_url's host."""
        host = httpx.URL(self.base_url).host
        return "openai" if host.endswith("openai.com") else host


def resolve_settings(
    spec: Mapping[str, Any],
    options: Mapping[str, Any],
    environ: Mapping[str, str],
    *,
    harness: str | None = None,
    model_override: str | None = None,
) -> Settings:
    """Settings from the agent spec, then ``options``, then ``environ``.

    Raises:
        TurnFailed: ``config_error`` naming the key that is missing or wrong.
    """
    executor = spec.get("executor") or {}
    auth = executor.get("auth") or {}
    name = harness or executor.get("harness") or options.get("harness") or "openai"
    prefixes = [env_prefix(name), "HARNESS_OPENAI_", "HARNESS_OPENAI_AGENTS_"]

    def from_env(key: str) -> str | None:
        for prefix in prefixes:
            for suffix in _ENV_SUFFIXES[key]:
                if environ.get(prefix + suffix):
                    return environ[prefix + suffix]
        return None

    def pick(key: str, *sources: Mapping[str, Any]) -> Any:
        for source in sources:
            if source.get(key) not in (None, ""):
                return source[key]
        return None

    model = model_override or pick("model", executor, spec, options) or from_env("model")
    if not model:
        raise TurnFailed("config_error", "no model: set executor.model or HARNESS_OPENAI_MODEL")
    api = pick("api", executor, options) or ("responses" if name in RESPONSES_HARNESSES else None)
    api = api or ("chat" if name == "openai" else "responses")
    if api not in APIS:
        raise TurnFailed("config_error", f"executor.api must be 'responses' or 'chat', got {api!r}")
    base_url = pick("base_url", auth, executor, options) or from_env("base_url") or DEFAULT_BASE_URL
    api_key = pick("api_key", auth, executor, options)
    reference = _VAR.match(api_key) if isinstance(api_key, str) else None
    if reference:  # "$VAR": the harness actor expanded it into HARNESS_<NAME>_API_KEY
        api_key = from_env("api_key") or environ.get(reference.group(1))
        if not api_key:
            raise TurnFailed("config_error", f"the api key {reference.group(0)} is not set")
    api_key = api_key or from_env("api_key")
    tunables: dict[str, Any] = {}
    for key, default in DEFAULTS.items():
        value = pick(key, executor, options)
        value = default if value is None else value
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise TurnFailed("config_error", f"{key} must be a number >= 0, got {value!r}")
        if key in ("max_steps", "max_attempts") and (value < 1 or value != int(value)):
            raise TurnFailed("config_error", f"{key} must be an integer >= 1, got {value!r}")
        tunables[key] = int(value) if key.startswith("max_") else float(value)
    for key in ("headers", "extra_body"):
        if not isinstance(pick(key, executor, options) or {}, dict):
            raise TurnFailed("config_error", f"executor.{key} must be a mapping")
    return Settings(
        harness=name,
        api=api,
        model=str(model),
        base_url=str(base_url).rstrip("/"),
        api_key=str(api_key) if api_key else None,
        headers={str(k): str(v) for k, v in (pick("headers", executor, options) or {}).items()},
        extra_body=dict(pick("extra_body", executor, options) or {}),
        **tunables,
    )
