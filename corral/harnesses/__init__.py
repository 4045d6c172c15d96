"""Harness worker kinds, by name.

The registry maps a harness name (``executor.harness`` in an agent spec) to the
``module:Class`` of its worker kind. Tests and deployments extend it with :func:`register`
(in-process) or ``[actors.harness.options.harnesses]`` in corral.toml, and restore it with
:func:`unregister` (H-05). :func:`availability` says which registered kinds this host can
actually run, without importing them (the gateway advertises only those, PROTOCOL_0_19.md §L).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable

from .. import clis

_BUILTIN = {
    "scripted": "corral.harnesses.scripted:ScriptedHarness",
    "openai": "corral.harnesses.openai:OpenAIHarness",
    # Agent YAMLs written for the runner corral replaces name these; both speak OpenAI.
    "openai-agents": "corral.harnesses.openai:OpenAIHarness",
    "open-responses": "corral.harnesses.openai:OpenAIHarness",
    "claude-sdk": "corral.harnesses.claude:ClaudeHarness",
    # omnigent's alias of claude-sdk: its server routes it as claude-sdk (PROTOCOL_0_19 §L)
    # but hands the runner the spec as written.
    "claude": "corral.harnesses.claude:ClaudeHarness",
    "codex": "corral.harnesses.codex:CodexHarness",
    "pi": "corral.harnesses.pi:PiHarness",
}

#: Python modules a built-in kind needs besides its own module.
_BUILTIN_REQUIRES = {
    "openai": ("httpx",),
    "openai-agents": ("httpx",),
    "open-responses": ("httpx",),
}

HARNESSES: dict[str, str] = dict(_BUILTIN)
#: Per harness name: the Python modules its worker needs (checked by :func:`availability`).
REQUIRES: dict[str, tuple[str, ...]] = dict(_BUILTIN_REQUIRES)


def register(name: str, target: str, *, requires: Iterable[str] = ()) -> None:
    """Make harness ``name`` run the worker kind ``module:Class``, which needs ``requires``."""
    HARNESSES[name] = target
    REQUIRES[name] = tuple(requires)


def unregister(name: str) -> None:
    """Remove a registered harness (a built-in one goes back to its default)."""
    if name in _BUILTIN:
        HARNESSES[name] = _BUILTIN[name]
        REQUIRES[name] = _BUILTIN_REQUIRES.get(name, ())
    else:
        HARNESSES.pop(name, None)
        REQUIRES.pop(name, None)


def availability(names: Iterable[str] | None = None) -> dict[str, str | None]:
    """Per harness kind (default: every registered one): None if this host can run it, else
    why not.

    A kind is runnable when it is registered, its worker's module can be found, every
    module it requires can be found and the CLI it drives, if any, is installed
    (:mod:`corral.clis`). Only ``importlib.util.find_spec`` is used, so nothing
    heavy is imported (a dotted name still imports its parent packages).
    """
    return {name: _unavailable(name) for name in (HARNESSES if names is None else names)}


def _unavailable(name: str) -> str | None:
    target = HARNESSES.get(name)
    if target is None:
        return "not a harness kind registered on this host"
    module, _, cls = target.partition(":")
    if not module or not cls:
        return f"its target {target!r} is not module:Class"
    if not _findable(module):
        return f"its module {module} is not installed"
    missing = [m for m in REQUIRES.get(name, ()) if not _findable(m)]
    if missing:
        return f"it needs the Python module{'s' * (len(missing) > 1)} {', '.join(missing)}"
    return clis.missing(name)


def _findable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def resolve(name: str, extra: dict[str, str] | None = None) -> str:
    """The ``module:Class`` of harness ``name``.

    Raises:
        KeyError: no such harness.
    """
    if extra and name in extra:
        return extra[name]
    return HARNESSES[name]
