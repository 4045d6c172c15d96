"""File-level durability: opening a run file, torn-tail repair, appends, fsync.

Everything here is blocking and is called either directly by the synchronous
:class:`RunJournal` or from a worker thread by the :class:`JournalWriter`.

Why each step is there:

* A crash can leave the last line half-written (or, after a power loss, zero-filled). A
  later append would glue its record onto that fragment and both would be lost, so opening
  a run for appending truncates the file to the end of its last complete line first.
* A new file is only findable after a crash if its directory entry is durable too, so the
  directory is fsynced when a file (or a session directory) is created.
* Appends use ``fdatasync``: for a file opened ``O_APPEND`` it flushes the data and the new
  size, which is all a reader needs; the inode's timestamps are not worth a journal commit.
"""

from __future__ import annotations

import contextlib
import enum
import os
import time
from pathlib import Path

from .._jsonlines import fsync_dir
from ._records import probe_seq

# The tail scan reads this much from the end first, growing only for very long lines.
_TAIL_CHUNK = 64 * 1024


class FsyncPolicy(enum.StrEnum):
    """When a record is forced to disk.

    ``every``: before the append returns (group commit shares one fsync round among every
    append waiting at that moment). ``terminal``: when a run's terminal record is appended
    (earlier records of the run ride along on that fsync). ``interval``: at most
    ``interval`` seconds after the append.
    """

    EVERY = "every"
    TERMINAL = "terminal"
    INTERVAL = "interval"


class RunCursor:
    """What an appender knows about one open run file, so it never rescans it.

    Owned by exactly one appender at a time (the synchronous journal or the writer).
    """

    __slots__ = ("dirty", "fd", "last_sync", "next_seq", "path", "size")

    def __init__(self, path: Path, fd: int, next_seq: int, size: int) -> None:
        self.path = path
        self.fd = fd
        self.next_seq = next_seq
        self.size = size
        self.dirty = False
        self.last_sync = time.monotonic()


def ensure_dir(path: Path) -> None:
    """Create ``path`` (and missing parents) and make each new entry durable."""
    if path.is_dir():
        return
    ensure_dir(path.parent)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        return
    fsync_dir(path.parent)


def open_run(path: Path) -> tuple[RunCursor, int]:
    """Open a run file for appending, repairing a torn tail; return the cursor and bytes cut.

    The next seq follows the last complete record, so a record whose write was torn by a
    crash (and was therefore never reported durable) gets its seq reused.
    """
    ensure_dir(path.parent)
    flags = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        fd = os.open(path, flags)
    else:
        fsync_dir(path.parent)
        return RunCursor(path, fd, 1, 0), 0
    try:
        size = os.fstat(fd).st_size
        valid_end, last_seq = scan_tail(fd, size)
        if valid_end < size:
            os.ftruncate(fd, valid_end)
            os.fdatasync(fd)
    except BaseException:
        os.close(fd)
        raise
    return RunCursor(path, fd, last_seq + 1, valid_end), size - valid_end


def scan_tail(fd: int, size: int) -> tuple[int, int]:
    """Return (end of the last complete line, seq of the last record) reading from the end.

    Reads backwards in growing chunks, so opening a long run costs one small read.
    """
    chunk = _TAIL_CHUNK
    while True:
        start = max(0, size - chunk)
        data = os.pread(fd, size - start, start)
        newline = data.rfind(b"\n")
        if newline < 0 and start > 0:
            chunk *= 4
            continue
        if newline < 0:
            return 0, 0
        valid_end = start + newline + 1
        lines = data[:newline].split(b"\n")
        # When the chunk starts mid-file its first line may be partial: never trust it.
        first_whole = 1 if start > 0 else 0
        for line in reversed(lines[first_whole:]):
            seq = probe_seq(line)
            if seq is not None:
                return valid_end, seq
        if start == 0:
            return valid_end, 0
        chunk *= 4


def append_bytes(cursor: RunCursor, data: bytes) -> None:
    """Append ``data`` at the cursor; on failure cut the file back so no fragment remains."""
    view = memoryview(data)
    try:
        while view:
            written = os.write(cursor.fd, view)
            view = view[written:]
    except OSError:
        # A short write (ENOSPC, EIO) must not leave half a record for the next append.
        with contextlib.suppress(OSError):
            os.ftruncate(cursor.fd, cursor.size)
        raise
    cursor.size += len(data)
    cursor.dirty = True


def sync(cursor: RunCursor) -> None:
    """Force the cursor's appended bytes to disk."""
    os.fdatasync(cursor.fd)
    cursor.dirty = False
    cursor.last_sync = time.monotonic()


def close(cursor: RunCursor) -> None:
    """Sync what is still dirty, then close the file."""
    try:
        if cursor.dirty:
            sync(cursor)
    finally:
        os.close(cursor.fd)
