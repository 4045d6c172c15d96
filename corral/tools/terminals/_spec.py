"""The ``terminals:`` block of an agent spec: the terminals an agent may open, checked.

:func:`parse_terminals` turns the block into :class:`TerminalDef` records (naming the first
bad entry); the name checks here are shared by the manager and the tools.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._api import ToolError

_TERMINAL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# tmux forbids "." and ":" in session names; the key is the tmux session name.
_SESSION_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


_TRANSPORT = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")


@dataclass(frozen=True, slots=True)
class TerminalDef:
    """One terminal an agent spec declares.

    ``argv`` is the command and its arguments; ``env`` is added to the terminal's
    environment and ``env_unset`` removed from it (after ``env``); ``cwd`` is relative to the
    workspace unless absolute; ``transport`` is the web-attach transport it reports.
    """

    name: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    env_unset: tuple[str, ...] = ()
    cwd: str | None = None
    transport: str | None = None


def _bad(path: str, problem: str) -> ToolError:
    return ToolError(f"invalid terminals block in the agent spec: {path} {problem}")


def _str_list(value: Any, path: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _bad(path, "must be a list of strings")
    return list(value)


def _parse_def(name: Any, body: Any, path: str) -> TerminalDef:
    if not isinstance(name, str) or not _TERMINAL_NAME.match(name):
        raise _bad(path, "needs a name of letters, digits, '_', '.' or '-' (at most 64)")
    if body is None or isinstance(body, str | list):
        body = {"command": body}
    if not isinstance(body, dict):
        raise _bad(path, "must be a command string or a mapping with 'command'")
    command = body.get("command")
    if command is None:
        argv = [name]
    elif isinstance(command, str):
        try:
            argv = shlex.split(command)
        except ValueError as exc:
            raise _bad(f"{path}.command", f"does not parse: {exc}") from None
    else:
        argv = _str_list(command, f"{path}.command")
    argv += _str_list(body.get("args", []), f"{path}.args")
    if not argv or not argv[0]:
        raise _bad(f"{path}.command", "is empty")
    env = body.get("env") or {}
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and _ENV_NAME.match(k) and isinstance(v, str | int | float)
        for k, v in env.items()
    ):
        raise _bad(f"{path}.env", "must map variable names to strings")
    unset = _str_list(body.get("env_unset", []), f"{path}.env_unset")
    if not all(_ENV_NAME.match(k) for k in unset):
        raise _bad(f"{path}.env_unset", "must list variable names")
    cwd = body.get("cwd")
    if cwd is not None and (not isinstance(cwd, str) or not cwd):
        raise _bad(f"{path}.cwd", "must be a non-empty string")
    transport = body.get("transport", body.get("terminal_transport"))
    if transport is not None and (
        not isinstance(transport, str) or not _TRANSPORT.match(transport)
    ):
        raise _bad(f"{path}.transport", "must be a transport name such as 'control'")
    return TerminalDef(
        name=name,
        argv=tuple(argv),
        env=tuple((k, str(v)) for k, v in env.items()),
        env_unset=tuple(unset),
        cwd=cwd,
        transport=transport,
    )


def parse_terminals(block: Any) -> dict[str, TerminalDef]:
    """The terminals an agent spec's ``terminals:`` block declares, by name.

    Accepted shapes (unknown keys of an entry are ignored)::

        terminals: {zsh: {command: zsh}, py: "python3 -q", bash: null}
        terminals: [{name: zsh, command: zsh, args: [-l]}, "bash"]

    ``command`` is a string (split like a shell would, but never run by one) or an argv
    list; a missing command means the terminal's own name. Entries may also give ``args``,
    ``env``, ``env_unset``, ``cwd`` and ``transport``.

    Raises:
        ToolError: naming the first bad entry, e.g. ``terminals[1].args must be a list of
            strings``; also for a name declared twice.
    """
    if block is None:
        return {}
    entries: list[tuple[Any, Any, str]]
    if isinstance(block, dict):
        entries = [(name, body, f"terminals.{name}") for name, body in block.items()]
    elif isinstance(block, list):
        entries = []
        for i, entry in enumerate(block):
            if isinstance(entry, str):
                entries.append((entry, {"command": entry}, f"terminals[{i}]"))
            elif isinstance(entry, dict):
                body = {k: v for k, v in entry.items() if k != "name"}
                entries.append((entry.get("name"), body, f"terminals[{i}]"))
            else:
                raise _bad(f"terminals[{i}]", "must be a command string or a mapping with 'name'")
    else:
        raise _bad("terminals", "must be a list or a mapping")
    out: dict[str, TerminalDef] = {}
    for name, body, path in entries:
        tdef = _parse_def(name, body, path)
        if tdef.name in out:
            raise _bad(path, f"declares terminal {tdef.name!r} a second time")
        out[tdef.name] = tdef
    return out


def _check_terminal(terminal: str) -> None:
    if not _TERMINAL_NAME.match(terminal):
        raise ToolError(f"{terminal!r} is not a terminal name")


def _check_session(session: str) -> None:
    if not _SESSION_KEY.match(session):
        raise ToolError(
            f"session {session!r} must be 1-64 letters, digits, '_' or '-', starting with a "
            "letter or digit"
        )


def _declared(spec: Mapping[str, object], terminal: str) -> TerminalDef:
    declared = parse_terminals(spec.get("terminals"))
    tdef = declared.get(terminal)
    if tdef is None:
        known = ", ".join(sorted(declared)) or "none"
        raise ToolError(
            f"unknown terminal {terminal!r}: this agent's spec declares these terminals: {known}"
        )
    return tdef
