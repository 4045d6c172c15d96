"""Running a session's commands inside its ``os_env.sandbox``: bubblewrap on Linux.

A spec whose ``os_env.sandbox`` has a Linux type (:data:`corral._child_env.SANDBOX_TYPES`)
gets every ``sys_os_shell`` command, every terminal's command and every shell of the
environment routes wrapped in ``bwrap``. What the command sees:

- the working directory (the session's effective cwd), writable, at its own path, and it
  starts there; ``write_paths`` (relative ones under the cwd) and ``write_files`` writable too;
- the system's programs and libraries read-only: ``/usr``, ``/etc``, ``/opt`` and the
  ``/bin``, ``/sbin``, ``/lib*`` links or directories; ``read_paths`` read-only too. What of
  ``/etc`` and ``/opt`` not everyone may read (``/etc/shadow``, ``/etc/ssl/private``, a
  service's credentials) is masked, an empty file or directory in its place: a corral run as
  root would otherwise show it to "root" inside (listed once per tools actor);
- nothing else of the file system: not the state dir, not ``$HOME`` (an empty ``tmpfs`` in
  its place), not other sessions' directories; ``/tmp`` is an empty ``tmpfs``;
- its own ``/proc`` and pid namespace (no process of the host is visible, ``/proc/1`` is the
  sandbox's own init), its own ``/dev``, IPC, UTS and user namespaces, and no network unless
  ``allow_network: true`` (a loopback of its own only);
- the allow-listed environment of every tool command (``HOME`` and ``TMPDIR`` as above).

The command still leads its own process group (bwrap is what the tools actor starts), which
the tools record and sweep as before; ``--die-with-parent`` and the pid namespace mean that
killing bwrap ends everything inside, even what left the group.

A spec that asks for a sandbox this host cannot provide (no ``bwrap`` on ``PATH``, a field it
cannot enforce) is refused before anything runs: the turn's set-up fails
(:mod:`corral.harnesses.spawn_env`), and so does every OS tool and terminal
(:func:`corral.tools.os_env.unsupported_reason`).
Not honoured: ``env_passthrough`` (a sandboxed command gets the allow-listed environment,
like every tool command), ``cwd_allow_hidden`` and the hidden-file scan settings.
"""

from __future__ import annotations

import contextlib
import functools
import os
import stat
from collections.abc import Mapping
from pathlib import Path

from .._child_env import Sandbox, bwrap_path
from ._api import ToolError

__all__ = ["Sandbox", "wrap"]

#: What of the system every sandbox shows read-only, when it exists.
_SYSTEM_DIRS = ("/usr", "/etc", "/opt")
#: Where what not everyone may read is masked (/usr holds no such thing worth the walk).
_MASKED_DIRS = ("/etc", "/opt")
#: The top-level program and library directories: links into /usr on a merged-/usr system.
_SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: Where the resolver's configuration may live, shown when the network is allowed.
_RESOLVER_DIRS = ("/run/systemd/resolve", "/run/resolvconf")


def wrap(
    argv: list[str],
    sandbox: Sandbox,
    *,
    cwd: Path,
    env: Mapping[str, str],
    start: Path | None = None,
) -> list[str]:
    """``argv`` run by bubblewrap inside ``sandbox`` whose working directory is ``cwd``,
    starting in ``start`` (``cwd`` by default; a terminal may start in a directory of it).

    ``env`` is the environment the command gets (bwrap passes its own on): its ``HOME`` is
    hidden behind an empty tmpfs unless it lies in the working directory.

    Raises:
        ToolError: bubblewrap is not installed.
    """
    bwrap = bwrap_path()
    if bwrap is None:
        raise ToolError("os_env.sandbox needs bubblewrap, which is not installed on this host")
    args = [bwrap, "--die-with-parent", "--unshare-all", "--cap-drop", "ALL"]
    if sandbox.allow_network:
        args.append("--share-net")
    for path in _SYSTEM_DIRS:
        if os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in _SYSTEM_LINKS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    if sandbox.allow_network:
        for path in _RESOLVER_DIRS:
            args += ["--ro-bind-try", path, path]
    for path, is_dir in _private_paths():
        args += ["--tmpfs", path] if is_dir else ["--ro-bind", "/dev/null", path]
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    home = env.get("HOME")
    if home and os.path.isabs(home) and not _within(Path(home), cwd) and home != "/":
        args += ["--tmpfs", home]
    for path in sandbox.read_paths:
        real = os.path.expanduser(path)
        args += ["--ro-bind-try", real, real]
    args += ["--bind", str(cwd), str(cwd)]
    for path in sandbox.write_paths:
        real = str(cwd / os.path.expanduser(path))
        args += ["--bind-try", real, real]
    for path in sandbox.write_files:
        real = os.path.expanduser(path)
        args += ["--bind-try", real, real]
    args += ["--chdir", str(start or cwd), "--setenv", "TMPDIR", "/tmp", "--", *argv]
    return args


@functools.cache
def _private_paths() -> tuple[tuple[str, bool], ...]:
    """The files (False) and directories (True) under :data:`_MASKED_DIRS` that not everyone
    may read, whose parents everyone may search: what a sandbox masks. Listed once per
    process (~30 ms), so a file made private later is not masked."""
    found: list[tuple[str, bool]] = []
    for root in _MASKED_DIRS:
        for parent, dirs, files in os.walk(root):
            searchable = []
            for name in dirs:
                path = os.path.join(parent, name)
                with contextlib.suppress(OSError):
                    if os.lstat(path).st_mode & 0o005 != 0o005:
                        found.append((path, True))
                    else:
                        searchable.append(name)
            dirs[:] = searchable
            for name in files:
                path = os.path.join(parent, name)
                with contextlib.suppress(OSError):
                    mode = os.lstat(path).st_mode
                    if stat.S_ISREG(mode) and not mode & 0o004:
                        found.append((path, False))
    return tuple(found)


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents
