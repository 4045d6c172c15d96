"""The durable session store: ``sessions.log``, one fsynced JSON line per save.

Dispatch answers a request only after what it changed is on disk, so the store is an
append-only log of :class:`~._session.SessionRecord` lines: a save appends the whole record
and fsyncs, and the last line of an id wins when the log is read back. A deleted session
leaves a tombstone line (``deleted: true``) that wins over its earlier lines, so a restart
cannot bring it back. A torn last line (a crash mid-write) is skipped. A log past
:data:`_REWRITE_BYTES` is rewritten at load, atomically, to the live records only.

The store also numbers incarnations (``epoch``, a counter file bumped at every start): the
stream sequence of an incarnation starts at ``epoch << EPOCH_SHIFT``, above anything an
earlier one could have published after its last save.

All file I/O runs in a worker thread, one operation at a time (a capacity limiter of 1), so
the appends of different sessions never interleave within a line.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import trio

from ..._jsonlines import write_atomically
from ._session import SessionRecord

#: Stream sequence numbers of a dispatch incarnation start at ``epoch << EPOCH_SHIFT``.
EPOCH_SHIFT = 32
#: A log larger than this is compacted when it is read at start.
_REWRITE_BYTES = 4 * 1024 * 1024


class SessionStore:
    """``sessions.log`` and the epoch counter in one actor's data directory."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / "sessions.log"
        self._epoch_path = data_dir / "epoch"
        self._io = trio.CapacityLimiter(1)

    async def next_epoch(self) -> int:
        """Bump and return the incarnation counter (1 for the first start)."""
        return await trio.to_thread.run_sync(self._next_epoch, limiter=self._io)

    async def load(self) -> list[SessionRecord]:
        """The live records, the last line of each id winning; tombstoned ids are left out."""
        return await trio.to_thread.run_sync(self._load, limiter=self._io)

    async def find(self, session_id: str) -> SessionRecord | None:
        """The live record of one id (None if it has none or was deleted): a read of the
        whole log, for a session reclaimed from memory while idle and needed again."""
        return await trio.to_thread.run_sync(self._find, session_id, limiter=self._io)

    async def append(self, record: SessionRecord) -> None:
        """Append ``record`` and fsync: it is what a restart sees of the session."""
        line = msgspec.json.encode(record) + b"\n"
        await trio.to_thread.run_sync(self._append, line, limiter=self._io)

    async def tombstone(self, session_id: str) -> None:
        """Record that the session was deleted (fsynced), so that a restart forgets it."""
        await self.append(SessionRecord(id=session_id, deleted=True))

    def _next_epoch(self) -> int:
        try:
            epoch = int(self._epoch_path.read_text()) + 1
        except (FileNotFoundError, ValueError):
            epoch = 1
        write_atomically(self._epoch_path, str(epoch).encode())
        return epoch

    def _load(self) -> list[SessionRecord]:
        records: dict[str, SessionRecord] = {}
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        for line in data.splitlines():
            try:
                record = msgspec.json.decode(line, type=SessionRecord)
            except msgspec.DecodeError:
                continue  # a torn last line
            records[record.id] = record
        live = [r for r in records.values() if not r.deleted]
        if len(data) > _REWRITE_BYTES:
            self._rewrite(live)
        return live

    def _find(self, session_id: str) -> SessionRecord | None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        needle = msgspec.json.encode(session_id)
        found: SessionRecord | None = None
        for line in data.splitlines():
            if needle not in line:
                continue  # decoding only the lines that can be the id's keeps it fast
            try:
                record = msgspec.json.decode(line, type=SessionRecord)
            except msgspec.DecodeError:
                continue
            if record.id == session_id:
                found = record
        return None if found is None or found.deleted else found

    def _rewrite(self, records: list[SessionRecord]) -> None:
        write_atomically(self.path, b"".join(msgspec.json.encode(r) + b"\n" for r in records))

    def _append(self, line: bytes) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
