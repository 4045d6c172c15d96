"""Path containment: a path a model names must stay inside the session's working directory.

Every tool that reads or writes a path the model chose resolves it with
:func:`resolve_inside` first (P-20 to P-22). Containment is decided on *real* paths
(``os.path.realpath`` of the cwd and of the target), so none of these get out:

* ``..`` segments (``"../secret"``, ``"a/../../secret"``);
* absolute paths elsewhere (``"/etc/passwd"``); an absolute path inside the cwd is fine;
* symlinks inside the cwd that point outside it, at any depth (``"link/secret"`` where
  ``link -> /home``), including a dangling link whose target would be created by a write.

The check is done once, then the caller opens the *resolved* path, with ``O_NOFOLLOW``
where it writes, so a symlink swapped in for the last component after the check is not
followed either. A process that races to swap a directory higher up between the check
and the open is outside what this guards: that process already runs in the cwd (through
``sys_os_shell``), and confining it is the sandbox's job, not a path check's.

These functions touch the filesystem (``realpath`` calls ``lstat``); call them from a
worker thread.
"""

from __future__ import annotations

import os
from pathlib import Path

from ._api import ToolError

__all__ = [
    "DOWNLOAD_ESCAPE_MESSAGE",
    "bare_filename",
    "download_destination",
    "is_inside",
    "resolve_inside",
]

#: P-21: the error when a download destination resolves outside the cwd.
DOWNLOAD_ESCAPE_MESSAGE = "sys_agent_download resolved destination escapes the working directory"


def is_inside(base: str, target: str, *, allow_equal: bool = True) -> bool:
    """Whether real path ``target`` is ``base`` itself (if allowed) or below it."""
    if target == base:
        return allow_equal
    prefix = base if base.endswith(os.sep) else base + os.sep
    return target.startswith(prefix)


def _check_text(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ToolError(f"{what} must be a non-empty string")
    if "\x00" in value:
        raise ToolError(f"{what} must not contain NUL characters")
    return value


def resolve_inside(cwd: Path | str, user_path: object, *, what: str = "path") -> Path:
    """The real path ``user_path`` names, relative to ``cwd``, if it stays inside ``cwd``.

    Args:
        cwd: the session's effective working directory.
        user_path: the path the model gave (relative to ``cwd``, or absolute).
        what: how the error names the argument (``"config_path"``).

    Returns:
        The resolved absolute path, symlinks followed. It need not exist yet.

    Raises:
        ToolError: ``user_path`` is not a non-empty string, or resolves outside ``cwd``
            (the message says ``escapes the working directory``).
    """
    text = _check_text(user_path, what)
    base = os.path.realpath(cwd)
    target = os.path.realpath(os.path.join(base, text))
    if not is_inside(base, target):
        raise ToolError(f"{what} {text!r} escapes the working directory")
    return Path(target)


def bare_filename(name: object, *, what: str = "dest_filename") -> str:
    """``name`` if it is a bare file name: no separator, not ``.`` or ``..`` (P-20).

    Raises:
        ToolError: saying what is wrong with the name.
    """
    text = _check_text(name, what)
    separators = {"/", "\\", os.sep} | ({os.altsep} if os.altsep else set())
    if any(sep in text for sep in separators) or text in (".", ".."):
        raise ToolError(f"{what} must be a bare file name without a directory part, got {text!r}")
    return text


def download_destination(cwd: Path | str, dest_filename: object) -> Path:
    """Where ``sys_agent_download`` may write ``dest_filename`` in ``cwd`` (P-20, P-21).

    The name must be bare, and its real path must lie strictly inside the real ``cwd``: a
    symlink of that name pointing elsewhere is refused, and its target is not created.

    Raises:
        ToolError: the name is not bare, or :data:`DOWNLOAD_ESCAPE_MESSAGE`.
    """
    name = bare_filename(dest_filename)
    base = os.path.realpath(cwd)
    target = os.path.realpath(os.path.join(base, name))
    if not is_inside(base, target, allow_equal=False):
        raise ToolError(DOWNLOAD_ESCAPE_MESSAGE)
    return Path(target)
