"""The environment a harness worker starts with, built per harness from the agent spec.

Nothing of the host's environment is copied except a short allow-list
(:mod:`corral._child_env`, so the host's secrets — API keys, tunnel tokens — never reach a
worker); the harness's own variables are ``HARNESS_<NAME>_MODEL``,
``HARNESS_<NAME>_API_KEY`` and ``HARNESS_<NAME>_BASE_URL`` for ``executor.harness: <name>``
(H-09). The model is the session's override when there is one
(D-11), else the spec's. An ``api_key`` of the form ``$VAR`` is read from the host's
environment — the one secret the agent spec explicitly asks for; never one of corral's own
``CORRAL_*`` settings (the runner token). The harness actor has the host's variables in its
``os.environ`` (handed over hidden by the host, :func:`corral._child_env.spec_variables`),
and the worker gets its key the same way: hidden, never in its environ block.

Building the environment is also where a turn's set-up finds that its spec asks for a
sandbox this host cannot provide (:func:`corral._child_env.sandbox_refusal`): the turn then
fails with the reason before anything runs.
"""

from __future__ import annotations

import os
import re
from typing import Any

from .._child_env import base_env, hide, sandbox_refusal

_VAR = re.compile(r"^\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?$")


class SpawnEnvError(ValueError):
    """The worker environment cannot be built; the turn fails with this message (H-11)."""


def env_prefix(harness: str) -> str:
    """``HARNESS_<NAME>_`` for a harness name (``openai-agents`` → ``HARNESS_OPENAI_AGENTS_``)."""
    return "HARNESS_" + re.sub(r"[^A-Za-z0-9]", "_", harness).upper() + "_"


def build_spawn_env(
    harness: str,
    spec: dict[str, Any],
    *,
    model_override: str | None = None,
    host_env: dict[str, str] | None = None,
) -> dict[str, str]:
    """The worker environment for ``harness`` running agent ``spec``.

    Raises:
        SpawnEnvError: e.g. a ``$VAR`` api key that is not set, a model name with
            characters no provider uses, or an ``os_env.sandbox`` this host cannot provide.
    """
    refused = sandbox_refusal(spec.get("os_env"))
    if refused is not None:
        raise SpawnEnvError(refused)
    source = os.environ if host_env is None else host_env
    env = base_env(source)
    executor = spec.get("executor") or {}
    prefix = env_prefix(harness)
    model = model_override or executor.get("model") or spec.get("model")
    if model is not None:
        if not isinstance(model, str) or not re.match(r"^[A-Za-z0-9._:/@+-]{1,200}$", model):
            raise SpawnEnvError(f"invalid model name for the {harness!r} harness: {model!r}")
        env[prefix + "MODEL"] = model
    auth = executor.get("auth") or {}
    if not isinstance(auth, dict):
        raise SpawnEnvError("executor.auth must be a mapping")
    key = auth.get("api_key")
    if isinstance(key, str) and key:
        match = _VAR.match(key)
        if match:
            name = match.group(1)
            if name not in source or name.startswith("CORRAL_"):
                raise SpawnEnvError(
                    f"the {harness!r} harness needs ${name}, which is not set on this host"
                )
            key = source[name]
        env = hide(env, {prefix + "API_KEY": key})
    base_url = auth.get("base_url") or executor.get("base_url")
    if isinstance(base_url, str) and base_url:
        env[prefix + "BASE_URL"] = base_url
    return env
