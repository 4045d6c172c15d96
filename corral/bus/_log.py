"""The broker's durable mailbox log: an append-only file of checksummed records.

Layout (version 1)::

    file   := MAGIC record*
    record := u32 length | u32 crc32(payload) | payload       (little-endian)
    payload:= msgpack of one LogRecord (Put | Acked | Attempted | DeadLettered | Parked |
              Unparked | Undead)

A crash can leave a torn or garbled tail; :func:`replay` stops at the first record whose
length or checksum does not hold and reports the offset, and :class:`MailboxLog` truncates
the file there before appending again, so a torn record never swallows the next one.

The log only grows; :meth:`MailboxLog.rewrite` replaces it with the live records (written to
a temporary file, fsynced, renamed over the old one, directory fsynced) — compaction.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

import msgspec

from .._jsonlines import fsync_dir, write_atomically

MAGIC = b"CORRALMB\x01\n"
_HEADER = struct.Struct("<II")


class _Record(msgspec.Struct, tag_field="k", array_like=True):
    pass


class Put(_Record, tag="put"):
    """A durable message entered a mailbox. ``frame`` is its encoded envelope."""

    id: str
    recipient: str
    frame: bytes


class Acked(_Record, tag="ack"):
    """The recipient handled these messages."""

    ids: list[str]


class Attempted(_Record, tag="attempt"):
    """A message is being delivered for the ``attempt``-th time."""

    id: str
    attempt: int


class DeadLettered(_Record, tag="dead"):
    """A message left its mailbox (or never reached one) for the dead-letter list.

    Self-contained, so that stream messages and undecodable frames can be dead-lettered too;
    ``frame`` keeps at most the first 64 KiB of what arrived.
    """

    id: str
    actor: str
    type: str
    attempts: int
    error: str
    at: float
    frame: bytes = b""


class Parked(_Record, tag="park"):
    """A durable entry (logged by its Put) was parked by its owner until resolved."""

    id: str
    owner: str


class Unparked(_Record, tag="unpark"):
    """A parked entry was resolved; ``state`` is ``resolved`` or ``cancelled``."""

    id: str
    state: str
    reason: str | None = None


class Undead(_Record, tag="undead"):
    """Dead letters an operator took off the list (``corral dead-letters purge`` or
    ``requeue``; a requeued one is the ``Put`` that follows)."""

    ids: list[str]


LogRecord = Put | Acked | Attempted | DeadLettered | Parked | Unparked | Undead

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(LogRecord)


def frame_record(record: LogRecord) -> bytes:
    """Encode one record with its length and checksum."""
    payload = _encoder.encode(record)
    return _HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def replay(path: Path) -> tuple[list[LogRecord], int]:
    """Read every intact record of a log.

    Returns:
        The records in order, and the byte offset just past the last intact one (where a
        torn tail, if any, begins).
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], 0
    if not data.startswith(MAGIC):
        if len(data) < len(MAGIC) and MAGIC.startswith(data):
            return [], 0
        raise ValueError(f"{path} is not a corral mailbox log")
    records = list(_iter_records(data, len(MAGIC)))
    end = records[-1][1] if records else len(MAGIC)
    return [r for r, _ in records], end


def _iter_records(data: bytes, pos: int) -> Iterator[tuple[LogRecord, int]]:
    size = len(data)
    while pos + _HEADER.size <= size:
        length, crc = _HEADER.unpack_from(data, pos)
        start = pos + _HEADER.size
        end = start + length
        if end > size:
            return
        payload = data[start:end]
        if zlib.crc32(payload) != crc:
            return
        try:
            record = _decoder.decode(payload)
        except msgspec.DecodeError:
            return
        yield record, end
        pos = end


class MailboxLog:
    """The writer side of the log. Not thread-safe: one owner appends and syncs.

    :meth:`write` buffers in the OS; :meth:`sync` makes everything written so far durable.
    Both are blocking and meant to run in a worker thread, one call at a time.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = -1
        self.size = 0

    def open(self) -> list[LogRecord]:
        """Open (creating if needed), repair a torn tail, and return the intact records."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        records, end = replay(self.path)
        created = not self.path.exists()
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        if end == 0:
            os.ftruncate(self._fd, 0)
            os.write(self._fd, MAGIC)
            end = len(MAGIC)
        elif os.fstat(self._fd).st_size != end:
            os.ftruncate(self._fd, end)
        os.fsync(self._fd)
        if created:
            fsync_dir(self.path.parent)
        self.size = end
        return records

    def write(self, data: bytes) -> None:
        """Append already-framed records."""
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
        self.size += len(data)

    def sync(self) -> None:
        """fsync everything written so far."""
        os.fdatasync(self._fd)

    def rewrite(self, records: Iterable[LogRecord]) -> None:
        """Replace the log with ``records`` atomically (compaction)."""
        data = b"".join([MAGIC, *(frame_record(r) for r in records)])
        write_atomically(self.path, data)
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
        self.size = len(data)

    def close(self) -> None:
        """Close the file (everything synced stays durable)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
