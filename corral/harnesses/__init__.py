"""Harness worker kinds, by name.

The registry maps a harness name (``executor.harness`` in an agent spec) to the
``module:Class`` of its worker kind. Tests and deployments extend it with :func:`register`
(in-process) or ``[actors.harness.options.harnesses]`` in corral.toml, and restore it with
:func:`unregister` (H-05).
"""

from __future__ import annotations

_BUILTIN = {
    "scripted": "corral.harnesses.scripted:ScriptedHarness",
    "openai": "corral.harnesses.openai:OpenAIHarness",
    # Agent YAMLs written for the runner corral replaces name these; both speak OpenAI.
    "openai-agents": "corral.harnesses.openai:OpenAIHarness",
    "open-responses": "corral.harnesses.openai:OpenAIHarness",
}

HARNESSES: dict[str, str] = dict(_BUILTIN)


def register(name: str, target: str) -> None:
    """Make harness ``name`` run the worker kind ``module:Class``."""
    HARNESSES[name] = target


def unregister(name: str) -> None:
    """Remove a registered harness (a built-in one goes back to its default)."""
    if name in _BUILTIN:
        HARNESSES[name] = _BUILTIN[name]
    else:
        HARNESSES.pop(name, None)


def resolve(name: str, extra: dict[str, str] | None = None) -> str:
    """The ``module:Class`` of harness ``name``.

    Raises:
        KeyError: no such harness.
    """
    if extra and name in extra:
        return extra[name]
    return HARNESSES[name]
