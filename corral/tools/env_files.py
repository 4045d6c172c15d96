"""The file work behind the environment routes (PROTOCOL_0_19.md §H): blocking, bounded.

Every function here takes the environment's **root** (the session's effective cwd, as the
``sys_os_*`` tools get it) and a path the client chose, and runs in a worker thread. A path
is relative to the root, or absolute; either way its *real* path must lie inside the real
root (:func:`resolve`):

* ``..`` that leaves the root, and a symlink inside the root that points outside it, are
  ``400 invalid_path`` ("escapes the environment root");
* an absolute path outside the root is ``403 path_unreachable``: well formed, but not
  something this environment serves (omnigent's runner lets an unconfined environment
  browse the whole host; corral's browser stays in the root, like its tools);
* NUL bytes are ``400 invalid_path``.

Writes go through :func:`~corral.tools.os_files.atomic_write` (a temporary file and a
rename, ``O_NOFOLLOW``), as the tools' writes do; deletes never follow the last component.

Bounds, so one request can neither stall the tools actor nor exceed a bus message
(:data:`MAX_BODY_BYTES` of JSON, whatever the file names hold):

* a file's content comes back up to :data:`MAX_READ_BYTES` (``truncated`` says it was cut);
* a directory with more than :data:`MAX_DIR_ENTRIES` entries is ``413 too_large``; a page
  holds at most ``limit`` entries and about :data:`MAX_BODY_BYTES` of them;
* a search looks at :data:`SEARCH_SCAN_BUDGET` entries for at most
  :data:`SEARCH_TIME_BUDGET_S` seconds, then answers what it found with ``truncated``;
* an edit loads at most :data:`~corral.tools.os_files.MAX_EDIT_BYTES`.
"""

from __future__ import annotations

import base64
import codecs
import contextlib
import errno
import itertools
import mimetypes
import os
import re
import stat
import time
from collections import deque
from pathlib import Path
from typing import Any, BinaryIO, Literal

from ._replies import (
    DirectoryPage,
    Entry,
    FileContent,
    FileEdited,
    FileWritten,
    PathDeleted,
    SearchPage,
)
from .os_files import MAX_EDIT_BYTES, atomic_write
from .paths import is_inside

__all__ = [
    "ENTRY_OBJECT",
    "MAX_BODY_BYTES",
    "MAX_DIR_ENTRIES",
    "MAX_DOWNLOAD_BYTES",
    "MAX_READ_BYTES",
    "SEARCH_SCAN_BUDGET",
    "SEARCH_TIME_BUDGET_S",
    "FsError",
    "Target",
    "delete_path",
    "edit_file",
    "list_or_read",
    "open_download",
    "open_file",
    "resolve",
    "search",
    "write_file",
]

#: ``object`` of one directory entry.
ENTRY_OBJECT = "session.environment.filesystem.entry"
#: Bytes of a file a read returns at most. Escaped as JSON, text can grow sixfold (a
#: control character becomes ``\\u0001``); 512 KiB stays well inside a 4 MiB bus message.
MAX_READ_BYTES = 512 * 1024
#: Entries of one directory looked at at most.
MAX_DIR_ENTRIES = 100_000
#: About how many bytes of entries one listing or search answer holds.
MAX_BODY_BYTES = 1024 * 1024
#: Largest file ``?download=true`` serves. Its chunks wait in the gateway's memory while the
#: tunnel drains them, so the whole file must be affordable there.
MAX_DOWNLOAD_BYTES = 64 * 1024 * 1024
#: Entries a search looks at, and how long it may walk.
SEARCH_SCAN_BUDGET = 50_000
SEARCH_TIME_BUDGET_S = 5.0

_SNIFF = 8192
# Directories a search never walks into: version-control internals, never a user's file.
_SKIP_DIRS = frozenset({".git", ".hg", ".svn"})


class FsError(Exception):
    """A request the filesystem cannot serve: an HTTP status, a code and a message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def _not_found(path: str) -> FsError:
    return FsError(404, "path_not_found", f"Path {path!r} not found")


def _invalid(message: str) -> FsError:
    return FsError(400, "invalid_path", message)


def _os_error(exc: OSError, path: str) -> FsError:
    if isinstance(exc, FileNotFoundError | NotADirectoryError):
        return _not_found(path)
    if isinstance(exc, PermissionError):
        return FsError(403, "permission_denied", f"Permission denied: {path!r}")
    if isinstance(exc, IsADirectoryError):
        return _invalid(f"Path {path!r} is a directory")
    return FsError(500, "filesystem_error", f"{path!r}: {exc.strerror or type(exc).__name__}")


class Target:
    """A client path resolved inside the root: ``real`` to open, ``rel`` to report."""

    __slots__ = ("real", "rel", "root")

    def __init__(self, root: str, real: str, rel: str) -> None:
        self.root = root
        self.real = real
        self.rel = rel


def resolve(root: Path | str, path: str, *, follow_last: bool = True) -> Target:
    """Where ``path`` leads inside ``root``; see the module doc for what is refused.

    Args:
        root: the environment root.
        path: the client's path: ``""`` or ``"."`` for the root, relative, or absolute.
        follow_last: False for a delete: the last component is not followed (a symlink is
            removed, not its target), only its directory must lie inside the root.

    Raises:
        FsError: 400 ``invalid_path`` or 403 ``path_unreachable``.
    """
    if "\x00" in path:
        raise _invalid("Path contains NUL bytes")
    base = os.path.realpath(root)
    joined = os.path.normpath(os.path.join(base, path))
    if joined == base:
        return Target(base, base, "")
    if not follow_last:
        parent, name = os.path.split(joined)
        real = os.path.join(os.path.realpath(parent), name)
    else:
        real = os.path.realpath(joined)
    if not is_inside(base, real):
        if os.path.isabs(path) and not is_inside(base, joined):
            raise FsError(
                403, "path_unreachable", f"Path {path!r} is outside the environment root {base}"
            )
        raise _invalid(f"Path {path!r} escapes the environment root")
    # Report the path as the client named it (normalised), relative to the root.
    rel = os.path.relpath(joined, base) if is_inside(base, joined) else os.path.relpath(real, base)
    return Target(base, real, "" if rel == "." else rel)


def open_file(real: str, path: str) -> tuple[BinaryIO, os.stat_result]:
    """Open the regular file at ``real`` for reading (never a directory, FIFO or device:
    those could not be read, or could hang the read).

    Raises:
        FsError: 400 for a directory, 415 for anything else but a regular file, and what
            opening it raises.
    """
    # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise _os_error(exc, path) from exc
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise _invalid(f"Path {path!r} is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise FsError(415, "unsupported_media_type", f"Path {path!r} is not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb"), st


# -- entries --------------------------------------------------------------------------------


def _entry(root: str, rel: str, path: str) -> Entry:
    """The entry at ``path`` (inside ``root``), reported as ``rel``.

    A symlink is described by its target when that lies inside the root; a link out of
    the root, or a dangling one, is only named (``type: symlink``): what it points at is
    not this environment's to describe.
    """
    name = os.path.basename(rel) or os.path.basename(path)
    try:
        st = os.lstat(path)
    except OSError:
        return _entry_dict(rel, name, "other", None, None)
    if stat.S_ISLNK(st.st_mode):
        link_mtime = int(st.st_mtime)
        if not is_inside(root, os.path.realpath(path)):
            return _entry_dict(rel, name, "symlink", None, link_mtime)
        try:
            st = os.stat(path)
        except OSError:
            return _entry_dict(rel, name, "symlink", None, link_mtime)
    if stat.S_ISDIR(st.st_mode):
        return _entry_dict(rel, name, "directory", None, int(st.st_mtime))
    kind = "file" if stat.S_ISREG(st.st_mode) else "other"
    return _entry_dict(rel, name, kind, st.st_size if kind == "file" else None, int(st.st_mtime))


def _entry_dict(rel: str, name: str, kind: str, size: int | None, mtime: int | None) -> Entry:
    return {
        "id": rel,
        "object": ENTRY_OBJECT,
        "name": name,
        "path": rel,
        "type": kind,
        "bytes": size,
        "modified_at": mtime,
    }


def _entry_size(entry: Entry) -> int:
    # A bound, not an exact size: every character escaped at its widest.
    return 120 + 12 * (len(entry["path"]) + len(entry["name"]))


# -- list / read ----------------------------------------------------------------------------


def list_or_read(
    root: Path | str,
    path: str,
    *,
    limit: int,
    order: str,
    after: str | None,
    before: str | None,
) -> DirectoryPage | FileContent:
    """``GET .../filesystem[/{path}]``: a directory's page, or a file's content.

    Raises:
        FsError: see the module doc; 404 ``path_not_found`` for nothing there.
    """
    target = resolve(root, path)
    try:
        st = os.stat(target.real)
    except OSError as exc:
        raise _os_error(exc, path) from exc
    if stat.S_ISDIR(st.st_mode):
        return _list_dir(target, path, limit=limit, order=order, after=after, before=before)
    if not stat.S_ISREG(st.st_mode):
        raise FsError(415, "unsupported_media_type", f"Path {path!r} is not a regular file")
    return _read_file(target, path)


def _list_dir(
    target: Target, path: str, *, limit: int, order: str, after: str | None, before: str | None
) -> DirectoryPage:
    names: list[str] = []
    try:
        with os.scandir(target.real) as entries:
            for entry in entries:
                if len(names) >= MAX_DIR_ENTRIES:
                    raise FsError(
                        413,
                        "too_large",
                        f"Directory {path!r} has more than {MAX_DIR_ENTRIES} entries",
                    )
                names.append(entry.name)
    except OSError as exc:
        raise _os_error(exc, path) from exc
    names.sort(reverse=order == "desc")
    prefix = target.rel

    def rel_of(name: str) -> str:
        return os.path.join(prefix, name) if prefix else name

    def index_of(cursor: str | None) -> int | None:
        if cursor is None:
            return None
        name = cursor[len(prefix) + 1 :] if prefix and cursor.startswith(prefix + "/") else cursor
        try:
            return names.index(name)
        except ValueError:
            return None  # an unknown cursor is ignored, as omnigent's runner does

    start_at, end_at = index_of(after), index_of(before)
    start = start_at + 1 if start_at is not None else 0
    end = end_at if end_at is not None else len(names)
    positions = range(end - 1, start - 1, -1) if end_at is not None else range(start, end)
    data: list[Entry] = []
    size = 0
    has_more = False
    for i in positions:
        rel = rel_of(names[i])
        row = _entry(target.root, rel, os.path.join(target.real, names[i]))
        size += _entry_size(row)
        if len(data) >= limit or size > MAX_BODY_BYTES:
            has_more = True
            break
        data.append(row)
    if end_at is not None:
        data.reverse()
    return {
        "object": "list",
        "base": target.real,
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }


def _read_file(target: Target, path: str) -> FileContent:
    raw, _st = open_file(target.real, path)
    with raw:
        data = raw.read(MAX_READ_BYTES + 1)
    truncated = len(data) > MAX_READ_BYTES
    data = data[:MAX_READ_BYTES]
    text = _as_text(data, truncated)
    kind = mimetypes.guess_type(target.rel)[0]
    encoding: Literal["utf-8", "base64"]
    if text is None:
        content, size, encoding = base64.b64encode(data).decode(), len(data), "base64"
    else:
        content, size, encoding = text, len(text.encode()), "utf-8"
    return {
        "object": "session.environment.filesystem.file_content",
        "path": target.rel,
        "content_type": kind,
        "bytes": size,
        "truncated": truncated,
        "encoding": encoding,
        "content": content,
    }


def _as_text(data: bytes, truncated: bool) -> str | None:
    """``data`` as UTF-8 text, or None when it is binary (a NUL, or not UTF-8)."""
    if b"\x00" in data[:_SNIFF]:
        return None
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    try:
        # A cut file may end inside a character: that tail is dropped, not an error.
        return decoder.decode(data, final=not truncated)
    except UnicodeDecodeError:
        return None


def open_download(root: Path | str, path: str) -> tuple[BinaryIO, str, int]:
    """``GET .../filesystem/{path}?download=true``: the open file, its name and its size.

    Raises:
        FsError: 400 for a directory, 415 for anything but a regular file, 413 past
            :data:`MAX_DOWNLOAD_BYTES`, and what :func:`resolve` refuses.
    """
    target = resolve(root, path)
    file, st = open_file(target.real, path)
    if st.st_size > MAX_DOWNLOAD_BYTES:
        file.close()
        raise FsError(
            413,
            "file_too_large",
            f"Path {path!r} is larger than {MAX_DOWNLOAD_BYTES} bytes, the download limit",
        )
    return file, os.path.basename(target.real), st.st_size


# -- write / edit / delete -------------------------------------------------------------------


def write_file(root: Path | str, path: str, data: bytes, *, create_parents: bool) -> FileWritten:
    """``PUT .../filesystem/{path}``: create or replace a file with ``data``."""
    target = resolve(root, path)
    if not target.rel:
        raise _invalid("Cannot write the environment root")
    try:
        before = os.lstat(target.real)
    except FileNotFoundError:
        before = None
    except OSError as exc:
        raise _os_error(exc, path) from exc
    if before is not None and stat.S_ISDIR(before.st_mode):
        raise _invalid(f"Path {path!r} is a directory")
    if before is not None and not stat.S_ISREG(before.st_mode):
        raise FsError(415, "unsupported_media_type", f"Path {path!r} is not a regular file")
    parent = os.path.dirname(target.real)
    try:
        if before is None and create_parents:
            os.makedirs(parent, exist_ok=True)
            # A directory someone made a moment ago could be a symlink by now.
            if not is_inside(target.root, os.path.realpath(parent)):
                raise _invalid(f"Path {path!r} escapes the environment root")
        atomic_write(Path(target.real), data, before.st_mode if before is not None else None)
    except OSError as exc:
        raise _os_error(exc, path) from exc
    return {
        "object": "session.environment.filesystem.write_result",
        "operation": "write",
        "path": target.rel,
        "created": before is None,
        "bytes_written": len(data),
        "entry": _entry(target.root, target.rel, target.real),
    }


def edit_file(
    root: Path | str, path: str, old_text: str, new_text: str, *, replace_all: bool
) -> FileEdited:
    """``PATCH .../filesystem/{path}``: replace ``old_text`` (once, unless ``replace_all``).

    Raises:
        FsError: 409 ``edit_conflict`` when ``old_text`` is missing, or found several times
            without ``replace_all`` (the file is not touched); 413 for a file over the edit
            limit; 415 for a binary file.
    """
    target = resolve(root, path)
    raw, st = open_file(target.real, path)
    with raw:
        data = raw.read(MAX_EDIT_BYTES + 1)
    if len(data) > MAX_EDIT_BYTES:
        raise FsError(413, "file_too_large", f"Path {path!r} is larger than {MAX_EDIT_BYTES} bytes")
    if b"\x00" in data[:_SNIFF]:
        raise FsError(415, "unsupported_media_type", f"Path {path!r} is a binary file")
    old = old_text.encode("utf-8", "surrogatepass")
    count = data.count(old)
    if count == 0:
        raise FsError(409, "edit_conflict", f"old_text not found in {path!r}; nothing was changed")
    if count > 1 and not replace_all:
        raise FsError(
            409,
            "edit_conflict",
            f"old_text occurs {count} times in {path!r}; set replace_all or give more context",
        )
    updated = data.replace(old, new_text.encode("utf-8", "surrogatepass"))
    try:
        atomic_write(Path(target.real), updated, st.st_mode)
    except OSError as exc:
        raise _os_error(exc, path) from exc
    return {
        "object": "session.environment.filesystem.edit_result",
        "operation": "edit",
        "path": target.rel,
        "replacements": count,
        "bytes_before": len(data),
        "bytes_after": len(updated),
        "entry": _entry(target.root, target.rel, target.real),
    }


def delete_path(root: Path | str, path: str, *, recursive: bool) -> PathDeleted:
    """``DELETE .../filesystem/{path}``: a file, a symlink (not its target) or a directory.

    Raises:
        FsError: 400 for the root itself; 409 ``directory_not_empty`` for a non-empty
            directory without ``recursive``.
    """
    target = resolve(root, path, follow_last=False)
    if not target.rel or target.real == target.root:
        raise _invalid("Cannot delete the environment root")
    try:
        st = os.lstat(target.real)
    except OSError as exc:
        raise _os_error(exc, path) from exc
    entries, size = 1, 0
    try:
        if stat.S_ISDIR(st.st_mode):
            kind = "directory"
            if recursive:
                entries, size = _remove_tree(target.real)
            else:
                try:
                    os.rmdir(target.real)
                except OSError as exc:
                    if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                        raise FsError(
                            409,
                            "directory_not_empty",
                            f"Directory {path!r} is not empty; use recursive=true to delete",
                        ) from exc
                    raise
        else:
            kind = (
                "symlink"
                if stat.S_ISLNK(st.st_mode)
                else "file"
                if stat.S_ISREG(st.st_mode)
                else "other"
            )
            size = st.st_size if kind == "file" else 0
            os.unlink(target.real)
    except OSError as exc:
        raise _os_error(exc, path) from exc
    return {
        "object": "session.environment.filesystem.delete_result",
        "operation": "delete",
        "path": target.rel,
        "deleted": True,
        "type": kind,
        "bytes_deleted": size,
        "entries_deleted": entries,
    }


def _remove_tree(top: str) -> tuple[int, int]:
    """Remove ``top`` and everything below it without following symlinks."""
    entries, size = 0, 0
    for dirpath, dirnames, filenames in os.walk(top, topdown=False):
        for name in filenames:
            full = os.path.join(dirpath, name)
            with contextlib.suppress(OSError):
                size += os.lstat(full).st_size
            os.unlink(full)
            entries += 1
        for name in dirnames:
            full = os.path.join(dirpath, name)
            # os.walk lists a symlink to a directory among the directories, never enters it.
            if os.path.islink(full):
                os.unlink(full)
            else:
                os.rmdir(full)
            entries += 1
    os.rmdir(top)
    return entries + 1, size


# -- search ---------------------------------------------------------------------------------


def split_globs(raw: str | None) -> list[str]:
    """A comma-separated glob list; commas inside ``{a,b}`` do not split."""
    if not raw:
        return []
    out: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in raw:
        if ch == "," and depth == 0:
            out.append("".join(current))
            current = []
            continue
        if ch == "{":
            depth += 1
        elif ch == "}" and depth:
            depth -= 1
        current.append(ch)
    out.append("".join(current))
    return [p.strip() for p in out if p.strip()]


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """A glob as VS Code reads one: ``**/`` any directories (or none), ``**`` anything,
    ``*`` and ``?`` within one path segment, ``{a,b}`` either; case-insensitive."""
    out: list[str] = []
    i, depth = 0, 0
    while i < len(pattern):
        ch = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if ch == "*":
            out.append("[^/]*")
        elif ch == "?":
            out.append("[^/]")
        elif ch == "{":
            depth += 1
            out.append("(?:")
        elif ch == "}" and depth:
            depth -= 1
            out.append(")")
        elif ch == "," and depth:
            out.append("|")
        else:
            out.append(re.escape(ch))
        i += 1
    out.append(")" * depth)
    return re.compile("".join(out) + r"\Z", re.IGNORECASE | re.DOTALL)


def search(
    root: Path | str,
    path: str,
    query: str,
    *,
    limit: int,
    include: list[str] | None = None,
    exclude: list[str] | None = None,
    clock: Any = time.monotonic,
) -> SearchPage:
    """``GET .../search[/{path}]?q=``: files and directories whose name or path contains
    ``query`` (case-insensitive), under ``path``, sorted by path.

    ``include``/``exclude`` globs match the path relative to the search base (or the name).
    The walk is breadth-first, never enters ``.git``, and stops at the scan or time budget
    (``truncated: true``) or once ``limit`` matches are found (``has_more: true``).
    """
    target = resolve(root, path)
    if not os.path.isdir(target.real):
        raise _not_found(path)
    needle = query.strip().lower()
    includes = [_glob_regex(p) for p in include or []]
    excludes = [_glob_regex(p) for p in exclude or []]
    deadline = clock() + SEARCH_TIME_BUDGET_S

    def wanted(rel: str, name: str) -> bool:
        if any(r.match(rel) or r.match(name) for r in excludes):
            return False
        if includes and not any(r.match(rel) or r.match(name) for r in includes):
            return False
        return needle in name.lower() or needle in rel.lower()

    found: list[tuple[str, str]] = []
    scanned = 0
    size = 0
    truncated = False
    queue: deque[tuple[str, str]] = deque([(target.real, "")])
    while queue and len(found) < limit and not truncated:
        real_dir, rel_dir = queue.popleft()
        try:
            with os.scandir(real_dir) as it:
                # No more than the budget has left: a directory of a million entries is
                # neither read whole nor sorted whole.
                room = SEARCH_SCAN_BUDGET - scanned + 1
                children = sorted(itertools.islice(it, room), key=lambda e: e.name)
        except OSError:
            continue  # an unreadable directory is skipped, not the whole search
        for child in children:
            scanned += 1
            if scanned > SEARCH_SCAN_BUDGET or clock() > deadline:
                truncated = True
                break
            rel = f"{rel_dir}/{child.name}" if rel_dir else child.name
            try:
                is_dir = child.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False
            if is_dir and child.name in _SKIP_DIRS:
                continue
            if any(r.match(rel) for r in excludes):
                continue  # an excluded directory is not walked either
            if wanted(rel, child.name):
                size += 120 + 12 * 2 * len(rel)
                if size > MAX_BODY_BYTES:
                    truncated = True
                    break
                found.append((rel, child.path))
                if len(found) >= limit:
                    break
            if is_dir:
                queue.append((child.path, rel))
    found.sort()
    prefix = target.rel
    data = [
        _entry(target.root, os.path.join(prefix, rel) if prefix else rel, real)
        for rel, real in found
    ]
    return {
        "object": "list",
        "base": target.real,
        "data": data,
        "has_more": len(found) >= limit,
        "truncated": truncated,
    }
