"""The gates ``sys_session_send`` runs before any server call (S-08..S-10, P-09..P-15).

A model override crosses a spawn boundary: a native CLI gets it as a ``--model`` argument, an
SDK harness as an environment variable. So the id is checked as data before anything is
looked up or created, and a dispatch that cannot work is refused while nothing exists yet,
instead of failing opaquely in the child after it was created:

* :func:`check_model` — the id's shape (P-09): stripped, non-empty, at most 256 characters,
  starting with a letter or digit and holding only ``A-Z a-z 0-9 . _ : / [ ] -``, so it can
  never read as a shell word or a CLI flag.
* :func:`model_refusal` — where an override may go: not in by-id mode (P-10), not on a child
  that already exists (P-11: its model is fixed), not to a harness with no override plumbing
  (P-12), not to a single-vendor harness of another family (P-13, on the id exactly as the
  caller sent it, P-14).
* :func:`localise_model` — the id in the spelling of the child's provider (P-15), after the
  family guard.
* :func:`missing_cli` — a fresh dispatch to a harness whose CLI is not on ``PATH`` (S-08);
  the probe is a parameter so tests can stand in for it (S-09).

Every refusal is one line starting ``Error:`` (what the model reads as the tool's output).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal

from .. import clis

__all__ = [
    "ModelError",
    "check_model",
    "harness_of",
    "localise_model",
    "missing_cli",
    "model_refusal",
    "provider_kind",
    "sub_agent",
]

MODEL_MAX_CHARS: Final = 256
_MODEL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/\[\]-]*")

#: Spellings of a harness that name the same one (PROTOCOL_0_19.md §L: aliases are
#: canonicalised before any capability check).
_ALIASES: Final = {
    "claude": "claude-sdk",
    "claude_sdk": "claude-sdk",
    "native-claude": "claude-native",
    "native-codex": "codex-native",
    "native-pi": "pi-native",
    "agents_sdk": "openai-agents",
    "openai-agents-sdk": "openai-agents",
}
#: Harnesses whose worker takes a per-session model: the native CLIs (``--model``), the SDK
#: harnesses omnigent 0.19.1 plumbs (an environment variable each) and corral's own kinds,
#: whose worker runs the spec's model. Any other harness would silently ignore the override.
_PLUMBED: Final = frozenset(
    {
        "claude-native",
        "codex-native",
        "pi-native",
        "claude-sdk",
        "codex",
        "pi",
        "openai-agents",
        "cursor",
        "antigravity",
        "kimi",
        "qwen",
        "goose",
        "copilot",
        "openai",
        "open-responses",
        "scripted",
    }
)
_CLAUDE_ONLY: Final = frozenset({"claude-native", "claude-sdk"})
_CODEX_ONLY: Final = frozenset({"codex", "codex-native"})
#: Bare vendor ids that have a mechanical ``databricks-`` gateway spelling (P-15).
_MECHANICAL = re.compile(r"(?:claude|gpt|glm|kimi)-[a-z0-9][a-z0-9.-]*")
_GATEWAY_PREFIX: Final = "databricks-"

Mode = Literal["named", "by_id"]
ProviderKind = Literal["databricks", "key", "subscription"]


class ModelError(ValueError):
    """A model override of the wrong shape; ``str()`` is the reason."""

    @property
    def line(self) -> str:
        """The tool's output for it (P-09)."""
        return f"Error: sys_session_send invalid 'model': {self}"


def canonical(harness: str) -> str:
    """The harness's canonical name (an unknown name is its own)."""
    if harness.startswith("acp:"):
        return "acp"
    return _ALIASES.get(harness, harness)


def check_model(value: object) -> str | None:
    """The caller's ``model`` stripped, or None when not given (P-09).

    Raises:
        ModelError: not a string, empty, too long, or outside the model-id characters.
    """
    if value is None:
        return None
    if not isinstance(value, str):
        raise ModelError("'model' must be a string when provided")
    model = value.strip()
    if not model:
        raise ModelError("model must be a non-empty string")
    if len(model) > MODEL_MAX_CHARS:
        raise ModelError(f"model exceeds {MODEL_MAX_CHARS} characters")
    if _MODEL_ID.fullmatch(model) is None:
        raise ModelError(
            "model must start with a letter or digit and hold only letters, digits "
            "and . _ : / [ ] -"
        )
    return model


def harness_of(sub_agents: object, name: str, executor_type: str | None = None) -> str | None:
    """The harness of sub-agent ``name`` in the parent spec's ``sub_agents`` (S-10): its
    ``executor.config.harness``, else its ``executor.harness``, else its ``executor.type``
    (else ``executor_type``, the type the parent's spec gives its children)."""
    entry = sub_agent(sub_agents, name)
    executor = entry.get("executor") if entry is not None else None
    if isinstance(executor, Mapping):
        config = executor.get("config")
        for value in (
            config.get("harness") if isinstance(config, Mapping) else None,
            executor.get("harness"),
            executor.get("type"),
        ):
            if isinstance(value, str) and value:
                return value
    return executor_type


def sub_agent(sub_agents: object, name: str) -> Mapping[str, Any] | None:
    """Entry ``name`` of ``sub_agents``: a mapping of name → spec, or a list of specs with a
    ``name`` each."""
    if isinstance(sub_agents, Mapping):
        entry = sub_agents.get(name)
        return entry if isinstance(entry, Mapping) else None
    if isinstance(sub_agents, list):
        for entry in sub_agents:
            if isinstance(entry, Mapping) and entry.get("name") == name:
                return entry
    return None


def model_refusal(
    model: str,
    *,
    mode: Mode,
    harness: str | None,
    existing_child: str | None = None,
) -> str | None:
    """Why ``model`` (already through :func:`check_model`) may not go with this send, or
    None. Checked on the id exactly as sent (P-14): the error quotes what the caller wrote."""
    reason = _model_reason(model, mode, harness, existing_child)
    return None if reason is None else f"Error: {reason}"


def _model_reason(
    model: str, mode: Mode, harness: str | None, existing_child: str | None
) -> str | None:
    if mode == "by_id":
        return (
            "sys_session_send does not take 'model' with 'session_id': a running child keeps "
            "its model. Send without 'model', or sys_session_close it and dispatch a new one."
        )
    if existing_child is not None:
        return (
            f"the sub-agent already exists as {existing_child}. Re-send without 'model' to "
            "continue it, or sys_session_close it first to spawn a fresh session on the "
            "requested model."
        )
    if harness is None:
        return (
            "this agent's spec does not say which harness the sub-agent runs (no "
            "'sub_agents' entry with an executor), so a model override cannot be checked or "
            "placed. Re-send without 'model'."
        )
    name = canonical(harness)
    if name not in _PLUMBED:
        return (
            f"harness {harness!r} has no way to take a model override, so 'model' would be "
            "ignored. Re-send without 'model'."
        )
    lower = model.lower()
    if name in _CLAUDE_ONLY and "claude" not in lower:
        return (
            f"harness {name!r} only runs Claude models (an id containing 'claude'); got {model!r}."
        )
    if name in _CODEX_ONLY and not _codex_family(lower):
        return (
            f"harness {name!r} only runs GPT models (codex-compatible: an id naming 'gpt', "
            f"'codex', 'glm' or 'kimi'); got {model!r}."
        )
    return None


def _codex_family(lower: str) -> bool:
    """Whether an id names a model a codex harness runs: ``gpt``/``codex`` anywhere in it
    (``chatgpt-4o-latest``, ``gpt4o``), ``glm``/``kimi`` as a whole part of it (with a
    version: ``glm-5``, ``kimi2``), so an endpoint merely holding the letters is not."""
    if "gpt" in lower or "codex" in lower:
        return True
    return any(re.fullmatch(r"(?:glm|kimi)\d*", part) for part in re.split(r"[^a-z0-9]+", lower))


def provider_kind(auth: Mapping[str, Any] | None) -> ProviderKind | None:
    """The kind of provider a sub-agent's ``executor.auth`` reaches, or None when it cannot
    be told (no auth): a Databricks gateway, a vendor's API key, or a CLI subscription."""
    if not auth:
        return None
    kind = auth.get("kind") or auth.get("type")
    base_url = auth.get("base_url")
    if kind == "databricks" or (isinstance(base_url, str) and "databricks" in base_url):
        return "databricks"
    if kind in ("key", "api_key"):
        return "key"
    if kind == "subscription":
        return "subscription"
    return None


def localise_model(model: str, kind: ProviderKind | None) -> str:
    """``model`` in the spelling of the child's provider (P-15): a bare ``claude-*``,
    ``gpt-*``, ``glm-*`` or ``kimi-*`` id gets the gateway's ``databricks-`` prefix on a
    Databricks gateway and loses it on a vendor-direct provider; anything else, and any id
    for a provider that cannot be told, is left as it is (nothing is guessed)."""
    if kind == "databricks":
        return _GATEWAY_PREFIX + model if _MECHANICAL.fullmatch(model) else model
    if kind in ("key", "subscription") and model.startswith(_GATEWAY_PREFIX):
        bare = model.removeprefix(_GATEWAY_PREFIX)
        return bare if _MECHANICAL.fullmatch(bare) else model
    return model


def missing_cli(
    agent: str, harness: str | None, which: Callable[[str], str | None] = clis.find
) -> str | None:
    """The refusal of a fresh dispatch to ``agent`` whose harness needs a CLI that ``which``
    does not find (S-08), or None. ``which`` is the probe tests stand in for (S-09)."""
    name = canonical(harness) if harness else None
    cli = clis.cli_for(name) if name else None
    if cli is None or which(cli.command) is not None:
        return None
    binary, package = cli.command, cli.package
    return (
        f"Error: sub-agent {agent!r} can't start on this machine: harness {name!r} needs the "
        f"{binary!r} CLI on PATH, which was not found. Install it with: npm install -g "
        f"{package} (or don't dispatch to {agent!r} here)."
    )
