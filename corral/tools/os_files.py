"""The blocking file work behind ``sys_os_read``, ``sys_os_write`` and ``sys_os_edit``.

Each function takes the session's effective working directory and the path the model named,
resolves the path inside it (:func:`~corral.tools.paths.resolve_inside`) and is run in a
worker thread (:mod:`corral.tools.threads`); an ``OSError`` is left to the caller, which
names the path. The rules they follow are set out in :mod:`corral.tools.os_tools`. Apart
from the tools because :func:`atomic_write` and :data:`MAX_EDIT_BYTES` serve the
environments' file routes too (:mod:`corral.tools.env_files`).
"""

from __future__ import annotations

import codecs
import contextlib
import os
import secrets
import stat
from pathlib import Path
from typing import Any

from ._api import ToolError
from ._replies import EditResult, ReadResult, WriteResult
from .paths import is_inside, resolve_inside

#: Largest file ``sys_os_edit`` loads (it has to hold the file twice).
MAX_EDIT_BYTES = 16 * 1024 * 1024
#: Bytes ``sys_os_read`` reads past its window to count the file's lines, at most.
MAX_COUNT_BYTES = 16 * 1024 * 1024

_CHUNK = 64 * 1024
_SNIFF = 8192


def _open_regular(target: Path, path: str) -> tuple[int, os.stat_result]:
    """Open ``target`` for reading if it is a regular file (not a FIFO, device, directory)."""
    # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(target, flags)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise ToolError(f"{path!r} is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise ToolError(f"{path!r} is not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _binary_error(path: str) -> ToolError:
    return ToolError(f"{path!r} is a binary file; sys_os_read and sys_os_edit handle text only")


def read_window(cwd: Path, path: str, offset: int, limit: int, cap: int) -> ReadResult:
    """Lines ``offset`` on (at most ``limit`` of them, ``cap`` characters) of a text file."""
    target = resolve_inside(cwd, path)
    fd, _st = _open_regular(target, path)
    with os.fdopen(fd, "rb") as raw:
        if b"\x00" in raw.read(_SNIFF):
            raise _binary_error(path)
        raw.seek(0)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        parts: list[str] = []
        size = 0
        line = 1  # the line the next chunk belongs to
        taken = 0  # lines of the window read to their end
        cut = False
        stopped_at: int | None = None
        last = b""
        # Lines are split on b"\n" (ASCII), so the decoder is at a character boundary at
        # every line start; a line longer than a chunk arrives in pieces.
        while chunk := raw.readline(_CHUNK):
            last = chunk
            if line >= offset:
                if taken >= limit:
                    stopped_at = line
                    break
                text = decoder.decode(chunk)
                room = cap - size
                if len(text) > room:
                    parts.append(text[:room])
                    cut = True
                    stopped_at = line
                    break
                parts.append(text)
                size += len(text)
            if chunk.endswith(b"\n"):
                if line >= offset:
                    taken += 1
                line += 1
        else:
            parts.append(decoder.decode(b"", final=True))
        total = _count_lines(raw, line, last, stopped=stopped_at is not None)
    if stopped_at is None:
        returned = taken + (1 if last and not last.endswith(b"\n") and line >= offset else 0)
    else:
        returned = stopped_at - offset + (1 if cut else 0)
    result: ReadResult = {
        "path": str(target),
        "content": "".join(parts),
        "encoding": "utf-8",
        "offset": offset,
        "limit": limit,
        "returned_lines": returned,
        "total_lines": total,
        "truncated": cut,
    }
    if stopped_at is not None:
        result["next_offset"] = stopped_at
    return result


def _count_lines(raw: Any, line: int, last: bytes, *, stopped: bool) -> int | None:
    """The file's line count, reading on from where the window stopped (if it did).

    ``last`` is the last chunk read (when the window stopped: the first one past it, whose
    line is ``line``). Past :data:`MAX_COUNT_BYTES` more the count is unknown (None).
    """
    if not stopped:
        return line - 1 + (1 if last and not last.endswith(b"\n") else 0)
    newlines = last.count(b"\n")
    counted = 0
    while block := raw.read(_CHUNK):
        counted += len(block)
        if counted > MAX_COUNT_BYTES:
            return None
        newlines += block.count(b"\n")
        last = block
    return line - 1 + newlines + (0 if last.endswith(b"\n") else 1)


def atomic_write(target: Path, data: bytes, mode: int | None) -> None:
    """Replace ``target`` with ``data`` through a temporary file in the same directory."""
    temp = target.parent / f".corral-{secrets.token_hex(6)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temp, flags, 0o666)
    try:
        try:
            if mode is not None:
                os.fchmod(fd, stat.S_IMODE(mode))
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def _existing(target: Path, path: str) -> os.stat_result | None:
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return None
    if stat.S_ISDIR(st.st_mode):
        raise ToolError(f"{path!r} is a directory")
    if not stat.S_ISREG(st.st_mode):
        raise ToolError(f"{path!r} is not a regular file")
    return st


def write_file(cwd: Path, path: str, content: str) -> WriteResult:
    """Create or replace a file with ``content``, keeping an old file's permission bits."""
    target = resolve_inside(cwd, path)
    before = _existing(target, path)
    if before is None:
        target.parent.mkdir(parents=True, exist_ok=True)
        # A directory another process created a moment ago could be a symlink by now.
        if not is_inside(os.path.realpath(cwd), os.path.realpath(target.parent)):
            raise ToolError(f"path {path!r} escapes the working directory")
    data = content.encode("utf-8", "surrogatepass")
    atomic_write(target, data, before.st_mode if before is not None else None)
    return {"path": path, "created": before is None, "bytes_written": len(data)}


def edit_file(cwd: Path, path: str, old: str, new: str, replace_all: bool) -> EditResult:
    """Replace the one occurrence of ``old`` (every one, with ``replace_all``) by ``new``."""
    target = resolve_inside(cwd, path)
    fd, st = _open_regular(target, path)
    with os.fdopen(fd, "rb") as raw:
        if st.st_size > MAX_EDIT_BYTES:
            raise ToolError(
                f"{path!r} is too large to edit ({st.st_size} bytes, limit {MAX_EDIT_BYTES})"
            )
        data = raw.read(MAX_EDIT_BYTES + 1)
    if len(data) > MAX_EDIT_BYTES:
        raise ToolError(f"{path!r} is too large to edit (limit {MAX_EDIT_BYTES} bytes)")
    if b"\x00" in data[:_SNIFF]:
        raise _binary_error(path)
    old_bytes = old.encode("utf-8", "surrogatepass")
    count = data.count(old_bytes)
    if count == 0:
        raise ToolError(f"oldText not found in {path!r}; nothing was changed")
    if count > 1 and not replace_all:
        raise ToolError(
            f"oldText occurs {count} times in {path!r}; include more surrounding text so it "
            "matches once, or set replace_all to true; nothing was changed"
        )
    updated = data.replace(old_bytes, new.encode("utf-8", "surrogatepass"))
    atomic_write(target, updated, st.st_mode)
    return {"path": path, "replacements": count}
