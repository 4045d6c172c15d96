"""Durable files: an append-only JSON-lines log with torn-tail repair, ``fsync_dir`` and
``write_atomically``; and :data:`JsonObject`, the name for a JSON object of no fixed shape.

A floor module (imports nothing of corral): the tools actor's call log, the session inboxes
and background-call records, the broker's log, the journal, dispatch's and the gateway's
state files and the control plane's state files use it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeAlias

import msgspec
import trio

log = logging.getLogger("corral.files")

#: A JSON object whose shape nobody here fixes: a wire item of the omnigent protocol, a
#: provider's request or response body, an agent spec's free-form section, a tool's arguments
#: as the model wrote them. Where corral builds or reads a fixed shape it says so with a
#: Struct or a TypedDict instead; this alias marks the places where no such type exists.
JsonObject: TypeAlias = dict[str, Any]


def private_tmp(directory: Path, stem: str, data: bytes) -> Path:
    """A new file of ``directory`` holding ``data`` (0600, fsynced), under a temporary name
    of its own, for the caller to link or rename into place."""
    tmp = directory / f".{stem}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return tmp


def create_once(path: Path, data: bytes) -> None:
    """Create ``path`` (0600) holding ``data`` unless it exists, atomically: hard-linked into
    place from a fsynced temporary file, so processes racing on it agree on one content and
    a crash never leaves an empty or partial file."""
    tmp = private_tmp(path.parent, path.name, data)
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass  # another process won the race; its file is the one
    finally:
        tmp.unlink()
    fsync_dir_quietly(path.parent)


def fsync_dir_quietly(directory: Path) -> None:
    """:func:`fsync_dir`, where a file system that refuses fsync on a directory only weakens
    durability there."""
    with contextlib.suppress(OSError):
        fsync_dir(directory)


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (a created, renamed or removed file) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves the old file or the new one,
    never a mix: a temporary file, fdatasync, rename, then an fsync of the directory (without
    it the rename itself may not survive a power cut)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fdatasync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


class JsonLinesLog:
    """An append-only file of JSON objects, one per line, that survives crashes.

    Every :meth:`append` is fsynced before it returns (with ``fsync=False`` it is only
    written: it survives a crash of the process, the page cache being the kernel's, but not
    a power cut). A crash can leave the last line
    half-written: :meth:`load` drops that fragment and truncates the file to the end of its
    last complete line, so the next append does not glue a record onto it. A complete line
    that does not decode (disk damage) is skipped with a warning rather than losing the
    records after it. :meth:`rewrite` replaces the file atomically (temporary file, fsync,
    rename, directory fsync).

    Blocking I/O runs in worker threads under ``limiter``; callers shield the await when a
    record must not be half-applied in memory (see :class:`Inbox`).
    """

    def __init__(self, path: Path, limiter: trio.CapacityLimiter, *, fsync: bool = True) -> None:
        self.path = path
        self._limiter = limiter
        self._fsync = fsync

    async def load(self) -> list[JsonObject]:
        """Every intact record in file order; repairs a torn tail. ``[]`` if no file."""
        return await trio.to_thread.run_sync(self._load_sync, limiter=self._limiter)

    async def append(self, records: Sequence[Mapping[str, object]]) -> None:
        """Append ``records`` and fsync (creating the file, durably, if needed)."""
        data = b"".join(msgspec.json.encode(r) + b"\n" for r in records)
        if not self._fsync and not self._limiter.borrowed_tokens:
            # Without fsync an append is a copy into the page cache, not a wait on the
            # disk; the thread hop cost more than the write (0.1-0.3 ms per tool call
            # mark). Only when no threaded operation (a rewrite) holds the file.
            self._append_sync(data)
            await trio.lowlevel.checkpoint()
            return
        await trio.to_thread.run_sync(self._append_sync, data, limiter=self._limiter)

    async def rewrite(self, records: Sequence[Mapping[str, object]]) -> None:
        """Replace the whole file with ``records``, atomically."""
        data = b"".join(msgspec.json.encode(r) + b"\n" for r in records)
        await trio.to_thread.run_sync(self._rewrite_sync, data, limiter=self._limiter)

    async def remove(self) -> None:
        """Delete the file (no error if it does not exist)."""
        await trio.to_thread.run_sync(self._remove_sync, limiter=self._limiter)

    def _load_sync(self) -> list[JsonObject]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        records: list[JsonObject] = []
        pos = 0
        while True:
            end = data.find(b"\n", pos)
            if end == -1:
                break
            line = data[pos:end]
            pos = end + 1
            if not line.strip():
                continue
            try:
                record = msgspec.json.decode(line)
            except msgspec.DecodeError:
                record = None
            if not isinstance(record, dict):
                log.warning("%s: skipping an unreadable record at byte %d", self.path, pos)
                continue
            records.append(record)
        if pos < len(data):
            log.warning("%s: dropping a torn tail of %d bytes", self.path, len(data) - pos)
            with open(self.path, "r+b") as f:
                f.truncate(pos)
                os.fsync(f.fileno())
        return records

    def _append_sync(self, data: bytes) -> None:
        created = not self.path.exists()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if self._fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        if created and self._fsync:
            fsync_dir(self.path.parent)

    def _rewrite_sync(self, data: bytes) -> None:
        write_atomically(self.path, data)

    def _remove_sync(self) -> None:
        try:
            self.path.unlink()
        except FileNotFoundError:
            return
        fsync_dir(self.path.parent)
