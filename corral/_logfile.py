"""The log file every process of a host appends to, rotated by size; and reading it back.

**Many writers, one file.** Each process opens the file ``O_APPEND`` and writes each record
with one ``write``, so records never interleave. Rotation is the hard part: ``logging``'s
``RotatingFileHandler`` assumes it is the only writer, and with several each would rename
the file under the others. Here, every writer holds an ``flock`` on ``<file>.lock``, shared,
while it writes a record: it compares the path's inode with its own file's and reopens when
they differ (another process rotated it), then writes. A writer that finds the file full
takes the lock exclusively, checks that the file at the path is still the one it has open
and still full (another writer may have rotated it while it waited), shifts
``<file>.N-1`` → ``<file>.N`` … ``<file>`` → ``<file>.1``, and opens a new file. So no
record is written to a file after it was renamed, and a reader that follows the path
misses nothing.

**Reading.** :func:`log_lines` yields the lines of the rotated files, oldest first, then the
file's, and with ``follow`` keeps yielding what is appended, following the file across
rotations (as ``tail -F`` does, but also reading the files rotated more than once since it
last looked), polling every :data:`FOLLOW_POLL_S`.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TextIO

#: How often a followed log is looked at for new lines.
FOLLOW_POLL_S = 0.2


class SharedFileHandler(logging.Handler):
    """Appends each record to ``path`` as one line; rotates it past ``max_bytes``, keeping
    ``backups`` older files.

    Raises:
        OSError: the file (or its directory) cannot be created or opened.
    """

    def __init__(self, path: str | Path, max_bytes: int, backups: int) -> None:
        super().__init__()
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.backups = backups
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = -1
        self._inode = -1
        self._open()
        lock_path = self.path.with_name(self.path.name + ".lock")
        self._lock = os.open(lock_path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def _open(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        if self._fd >= 0:
            os.close(self._fd)
        self._fd, self._inode = fd, os.fstat(fd).st_ino

    def _moved(self) -> bool:
        try:
            return os.stat(self.path).st_ino != self._inode
        except FileNotFoundError:
            return True

    def emit(self, record: logging.LogRecord) -> None:
        try:
            data = (self.format(record) + "\n").encode("utf-8", "replace")
            fcntl.flock(self._lock, fcntl.LOCK_SH)
            try:
                if self._moved():
                    self._open()
                size = os.fstat(self._fd).st_size
                if size and size + len(data) > self.max_bytes:
                    self._rotate(len(data))
                os.write(self._fd, data)
            finally:
                fcntl.flock(self._lock, fcntl.LOCK_UN)
        except Exception:
            self.handleError(record)

    def _rotate(self, incoming: int) -> None:
        # Every writer holds the lock shared while it writes: once this one holds it
        # exclusively, nobody is between its inode check and its write, so nothing is written
        # to the old file after the rename (a follower that saw the rename has all of it).
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        try:
            current = os.stat(self.path)
        except FileNotFoundError:
            current = None
        # Another writer may have rotated it while this one waited: then write there.
        mine = current is not None and current.st_ino == self._inode
        if mine and current is not None and current.st_size + incoming > self.max_bytes:
            self._shift()
        self._open()

    def _shift(self) -> None:
        if self.backups == 0:
            self.path.unlink(missing_ok=True)
            return
        for n in range(self.backups - 1, 0, -1):
            with contextlib.suppress(FileNotFoundError):
                os.replace(rotated(self.path, n), rotated(self.path, n + 1))
        os.replace(self.path, rotated(self.path, 1))

    def close(self) -> None:
        for fd in (self._fd, self._lock):
            if fd >= 0:
                os.close(fd)
        self._fd = self._lock = -1
        super().close()


def rotated(path: Path, n: int) -> Path:
    """The ``n``-th rotated file of ``path`` (1 is the newest)."""
    return path.with_name(f"{path.name}.{n}")


def log_lines(
    path: Path,
    *,
    follow: bool = False,
    stop: Callable[[], bool] = lambda: False,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[str]:
    """Every whole line of the log, oldest first: the rotated files, then ``path``; with
    ``follow``, then an empty string (the end of what the log held: a line is never empty,
    it ends with a newline), then every line appended to it, across rotations, until
    ``stop()``."""
    with _no_rotation(path):
        older = _rotated_since(path, None)
        handle = _open(path)
    for file in older:
        with file:
            yield from (line for line in file if line.endswith("\n"))
    caught_up = False
    pending = ""
    try:
        while True:
            chunk = handle.read() if handle is not None else ""
            if chunk:
                pending += chunk
                *lines, pending = pending.split("\n")
                yield from (line + "\n" for line in lines)
                continue
            if not follow or stop():
                return
            if not caught_up:
                caught_up = True
                yield ""
            with _no_rotation(path):
                if handle is not None and not _replaced(path, handle.fileno()):
                    sleep(FOLLOW_POLL_S)
                    continue
                # Rotated (or created). Nothing is written to a renamed file (writers hold
                # the lock shared while they write), so the old file's rest is complete;
                # the files rotated since (several, if it rotated more than once since the
                # last look) and the new one are read from their start.
                rest = pending + (handle.read() if handle is not None else "")
                missed = [] if handle is None else _rotated_since(path, _inode(handle))
                new = _open(path)
            if handle is not None:
                handle.close()
            handle, pending = new, ""
            yield from (line + "\n" for line in rest.split("\n") if line)
            for file in missed:
                with file:
                    yield from (line for line in file if line.endswith("\n"))
            if handle is None:
                sleep(FOLLOW_POLL_S)
    finally:
        if handle is not None:
            handle.close()


@contextlib.contextmanager
def _no_rotation(path: Path) -> Iterator[None]:
    """No writer rotates the log meanwhile (its lock, held shared; none if there is none)."""
    try:
        lock = os.open(path.with_name(path.name + ".lock"), os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, PermissionError):
        yield
        return
    try:
        fcntl.flock(lock, fcntl.LOCK_SH)
        yield
    finally:
        os.close(lock)


def _open(path: Path) -> TextIO | None:
    try:
        return path.open(errors="replace")
    except FileNotFoundError:
        return None


def _inode(handle: TextIO) -> int:
    return os.fstat(handle.fileno()).st_ino


def _rotated_since(path: Path, inode: int | None) -> list[TextIO]:
    """The rotated files newer than the one of ``inode`` (all of them for None), oldest
    first, opened (the caller holds :func:`_no_rotation`)."""
    files: list[TextIO] = []
    n = 1
    while (handle := _open(rotated(path, n))) is not None:
        if _inode(handle) == inode:
            handle.close()
            break
        files.append(handle)
        n += 1
    return files[::-1]


def _replaced(path: Path, fd: int) -> bool:
    try:
        return os.stat(path).st_ino != os.fstat(fd).st_ino
    except FileNotFoundError:
        return False
