"""What changed in an environment, from git: the routes ``changes`` and ``diff/{path}`` (§H).

omnigent's runner answers these from ``git status`` when the workspace is in a git work
tree: every uncommitted change under the root, whoever made it (a tool, a shell, the user's
editor), against ``HEAD``. corral does the same, with git itself:

* ``changes``: ``git status --porcelain -z --untracked-files=all`` under the root, with line
  counts from ``git diff --numstat HEAD``; ``??`` and ``A`` are ``created``, a ``D`` in
  either column ``deleted``, anything else ``modified`` (a rename is its new path), newest
  first;
* ``diff/{path}``: ``before`` is the file at ``HEAD`` (``git show``), ``after`` the file now
  (null when deleted), both as text.

A root that is not in a git work tree (or a host without git) has no record of changes:
``changes`` is the empty list and every ``diff`` is 404, as omnigent's runner answers when
no agent edit was recorded.

**git runs no program.** The repository's ``.git/config`` is writable by whoever writes the
workspace — the model — and plain ``git status`` runs ``core.fsmonitor`` and the clean
filters of ``.gitattributes`` (seen with git 2.39): a model that may write files but must
ask before a shell command would get one run, unasked, when the user opens the changes. So
every git command gets ``-c core.fsmonitor=false -c core.hooksPath=/dev/null``, every filter
driver the configuration names is emptied on the command line (``-c filter.<x>.clean=`` and
its ``smudge``/``process``), ``diff`` runs with ``--no-ext-diff --no-textconv``, and
submodules (whose own configuration those overrides do not list) are not looked into. git runs
with the host's allow-listed environment (no ``GIT_*``
variable can point it elsewhere), ``GIT_OPTIONAL_LOCKS=0`` (a status never takes the
index lock from the user's own git), and a deadline (:data:`GIT_TIMEOUT_S`); one that does
not finish is ``500 git_status_failed``. A listing holds at most :data:`MAX_CHANGES`
entries; a diff side larger than :data:`~corral.tools.env_files.MAX_READ_BYTES` is
``413 file_too_large``.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import trio

from .._child_env import base_env
from ._replies import Change, ChangesPage, FileDiff
from .env_files import ENTRY_OBJECT, MAX_READ_BYTES, FsError, Target, open_file
from .threads import in_thread

__all__ = ["GIT_TIMEOUT_S", "MAX_CHANGES", "changed_files", "file_diff"]

#: Seconds one git command may take.
GIT_TIMEOUT_S = 10.0
#: Changed files one answer lists at most.
MAX_CHANGES = 1000


# Configuration that would make git run a program: a repository's own ``.git/config`` is
# written by whoever can write the workspace — the model — so it must not get to run a
# command when the user merely looks at the changes (a policy that asks before every shell
# command would be bypassed). Command-line ``-c`` wins over every config file.
_NO_PROGRAMS = ("-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null")
_FILTER_KEYS = ("clean", "smudge", "process")


class _Git:
    """git in one root: its path prefix inside the work tree, or not a work tree at all."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.env = {**base_env(), "GIT_OPTIONAL_LOCKS": "0", "GIT_TERMINAL_PROMPT": "0"}
        # Every filter driver the config names, emptied (an empty command runs nothing).
        self.no_filters: list[str] = []

    async def run(self, *args: str, check: bool = True) -> tuple[int, bytes]:
        argv = ["git", *_NO_PROGRAMS, *self.no_filters, "-c", "core.quotepath=off", *args]
        with trio.move_on_after(GIT_TIMEOUT_S):
            done = await trio.run_process(
                argv,
                cwd=self.root,
                env=self.env,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
            if check and done.returncode != 0:
                lines = done.stderr.decode(errors="replace").strip().splitlines()
                reason = f": {lines[-1]}" if lines else ""
                message = f"git {args[0]} exited {done.returncode}{reason}"
                raise FsError(500, "git_status_failed", message)
            return done.returncode, done.stdout
        raise FsError(500, "git_status_failed", f"git {args[0]} timed out after {GIT_TIMEOUT_S:g}s")

    async def prefix(self) -> str | None:
        """The root's path inside its work tree (``""`` at the top), None outside one; also
        learns which filter drivers to empty on every later command."""
        if shutil.which("git", path=self.env.get("PATH")) is None:
            return None
        code, out = await self.run("rev-parse", "--show-prefix", check=False)
        if code != 0:
            return None
        prefix = out.decode(errors="surrogateescape").strip()
        code, names = await self.run(
            "config", "--name-only", "--get-regexp", r"^filter\.", check=False
        )
        drivers = {
            name.rsplit(".", 1)[0]
            for name in names.decode(errors="surrogateescape").splitlines()
            if code == 0 and "." in name
        }
        self.no_filters = [
            arg
            for driver in sorted(drivers)
            for key in _FILTER_KEYS
            for arg in ("-c", f"{driver}.{key}=")
        ]
        return prefix


def _status(xy: str) -> str:
    if xy == "??" or xy[0] == "A":
        return "created"
    if "D" in xy:
        return "deleted"
    return "modified"


def _parse_status(out: bytes, prefix: str) -> list[tuple[str, str]]:
    """``(path relative to the root, status)`` of ``git status --porcelain -z`` output.

    Porcelain paths are relative to the top of the work tree, whatever the cwd: ``prefix``
    (the root's path inside it) is taken off. A rename's record is followed by its old
    path, which is skipped.
    """
    fields = out.split(b"\0")
    records: list[tuple[str, str]] = []
    i = 0
    while i < len(fields):
        field = fields[i]
        i += 1
        if len(field) < 4:
            continue
        xy = field[:2].decode(errors="replace")
        path = field[3:].decode(errors="surrogateescape")
        if xy[0] in "RC":
            i += 1  # the rename's source
        if path.startswith(prefix):
            records.append((path[len(prefix) :], _status(xy)))
    return records


def _parse_numstat(out: bytes) -> dict[str, tuple[int | None, int | None]]:
    counts: dict[str, tuple[int | None, int | None]] = {}
    for field in out.split(b"\0"):
        parts = field.split(b"\t", 2)
        if len(parts) != 3:
            continue
        added, removed, path = parts
        counts[path.decode(errors="surrogateescape")] = (
            int(added) if added.isdigit() else None,
            int(removed) if removed.isdigit() else None,
        )
    return counts


def _record(root: str, rel: str, status: str, counts: tuple[int | None, int | None]) -> Change:
    size: int | None = None
    mtime: int | None = None
    if status != "deleted":
        try:
            st = os.lstat(os.path.join(root, rel))
            size = st.st_size if stat.S_ISREG(st.st_mode) else None
            mtime = int(st.st_mtime)
        except OSError:
            pass
    return {
        "object": ENTRY_OBJECT,
        "path": rel,
        "name": rel.rsplit("/", 1)[-1],
        "status": status,
        "bytes": size,
        "modified_at": mtime,
        "lines_added": counts[0],
        "lines_removed": counts[1],
    }


async def _git_status(git: _Git, pathspec: str) -> bytes:
    """``git status`` of ``pathspec``, machine-readable, untracked files one by one."""
    _, out = await git.run(
        "status",
        "--porcelain=v1",
        "-z",
        "--untracked-files=all",
        "--ignore-submodules=all",
        "--",
        pathspec,
    )
    return out


async def changed_files(root: Path | str) -> ChangesPage:
    """``GET .../changes``: the uncommitted changes under ``root``, newest first."""
    git = _Git(os.path.realpath(root))
    prefix = await git.prefix()
    if prefix is None:
        return {"object": "list", "data": [], "has_more": False}
    out = await _git_status(git, ".")
    # ``numstat`` prints paths relative to the cwd too (``--relative``); no HEAD yet (a
    # fresh repository) means no counts, not an error.
    code, numstat = await git.run(
        "diff",
        "--numstat",
        "--no-renames",
        "--no-ext-diff",
        "--no-textconv",
        "--ignore-submodules=all",
        "--relative",
        "-z",
        "HEAD",
        "--",
        ".",
        check=False,
    )
    counts = _parse_numstat(numstat) if code == 0 else {}
    records = [
        _record(git.root, rel, status, counts.get(rel, (None, None)))
        for rel, status in _parse_status(out, prefix)
    ]
    records.sort(key=lambda r: (r["modified_at"] or 0, r["path"]), reverse=True)
    return {"object": "list", "data": records[:MAX_CHANGES], "has_more": len(records) > MAX_CHANGES}


async def file_diff(target: Target) -> FileDiff:
    """``GET .../diff/{path}``: the file at ``HEAD`` and now, if git counts it as changed.

    Raises:
        FsError: 404 ``not_found`` for a path with no uncommitted change (or no git work
            tree); 413 ``file_too_large``; 500 ``git_status_failed``.
    """
    git = _Git(target.root)
    prefix = await git.prefix()
    missing = FsError(
        404,
        "not_found",
        f"Path {target.rel!r} is not in the changed-files registry for this session",
    )
    if prefix is None:
        raise missing
    spec = f":(literal){target.rel}"
    out = await _git_status(git, spec)
    statuses = dict(_parse_status(out, prefix))
    status = statuses.get(target.rel)
    if status is None:
        raise missing
    before: str | None = None
    blob = f"HEAD:{prefix}{target.rel}"
    code, size = await git.run("cat-file", "-s", blob, check=False)
    if code == 0:
        if int(size.strip() or 0) > MAX_READ_BYTES:
            raise FsError(413, "file_too_large", f"{target.rel!r} at HEAD is too large to diff")
        _, data = await git.run("cat-file", "blob", blob)
        before = data.decode("utf-8", errors="replace")
    after: str | None = None
    if status != "deleted":
        after = await in_thread(_read_text, target)
    return {
        "object": "session.environment.filesystem.file_diff",
        "path": target.rel,
        "before": before,
        "after": after,
    }


def _read_text(target: Target) -> str:
    raw, _st = open_file(target.real, target.rel)
    with raw:
        data = raw.read(MAX_READ_BYTES + 1)
    if len(data) > MAX_READ_BYTES:
        raise FsError(413, "file_too_large", f"{target.rel!r} is too large to diff")
    return data.decode("utf-8", errors="replace")
