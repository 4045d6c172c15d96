"""The durable per-session event buffer: :class:`StreamBuffer` and its file, ``streams.log``.

Every session event the gateway receives is kept here before it goes anywhere, and stays
until the server is known to have it — not when its frame was handed to the kernel: a kernel
that took a frame loses it with the socket when either end is killed. The buffer survives
``kill -9`` of the gateway, so events are neither lost nor sent twice.

Each session's events move through three states:

* *unsent* — not yet written on the session's current stream;
* *sent* — written, not yet confirmed (kept in memory and in the file: a stream that opens
  again sends them again);
* *confirmed* — the server has them: a kind-1 record says so and they leave the buffer.

What confirms an event depends on the server (:meth:`StreamBuffer.received`,
:meth:`StreamBuffer.rewind`): a server that opens the stream with ``Last-Event-ID`` (corral's
control plane, which stores each event's ``seq``) confirms everything up to that id, and the
events after it are sent again whatever the gateway had written before; a server that does
not (omnigent's, which has no acknowledgement for stream events) confirms what a WebSocket
ping sent after the frame proved its process read.
"""

from __future__ import annotations

import logging
import math
import os
import struct
import time
import zlib
from collections import deque
from collections.abc import Callable
from pathlib import Path

import msgspec
import trio

from ..._changes import Changes
from ..._jsonlines import write_atomically
from .._deferred import Deferred

log = logging.getLogger("corral.actors.gateway")

_MAGIC = b"corral-gateway-streams 1\n"
_RECORD = struct.Struct("<II")  # payload length, crc32 of the payload
_EVENT, _DONE = 0, 1
_Record = tuple[int, str, int, bytes]
_encode_record = msgspec.msgpack.Encoder().encode
_decode_record = msgspec.msgpack.Decoder(_Record).decode
#: What one pending event costs in the file, roughly (for the compaction rule).
_OVERHEAD = 48


def _record(kind: int, session_id: str, seq: int, data: bytes = b"") -> bytes:
    payload = _encode_record((kind, session_id, seq, data))
    return _RECORD.pack(len(payload), zlib.crc32(payload)) + payload


class _Session:
    __slots__ = ("done", "events", "last", "marked", "moves", "sent")

    def __init__(self) -> None:
        #: Unsent events, oldest first: (seq, JSON bytes).
        self.events: deque[tuple[int, bytes]] = deque()
        #: Events written on the current stream and not confirmed, oldest first.
        self.sent: deque[tuple[int, bytes]] = deque()
        #: The highest seq seen, and the highest one no longer pending (confirmed or dropped).
        self.last = 0
        self.done = 0
        #: The highest seq the file says is no longer pending (at least ``done``): a stream
        #: without a cursor marks what it wrote at once (see :meth:`StreamBuffer.sent`).
        self.marked = 0
        #: How often its events were written on a stream or confirmed (a progress mark,
        #: :meth:`StreamBuffer.moves`).
        self.moves = 0

    def __len__(self) -> int:
        return len(self.events) + len(self.sent)


class StreamBuffer:
    """Session events not yet delivered to the server, kept in ``streams.log``.

    The file holds records ``u32 length | u32 crc32 | msgpack (kind, session, seq, data)``
    after a magic line: ``kind`` 0 is an event, 1 says every event of the session up to
    ``seq`` is no longer pending (sent to the server, or dropped past the bound). Replay
    stops at the first torn or corrupt record and truncates the file there. Event records are
    written in batches and fsynced by :meth:`run` (which then acks their bus messages); the
    delivered mark is written at once when a frame was sent, so that a killed process does not
    resend it. The file is rewritten with only pending events once it is large and mostly
    delivered.
    """

    def __init__(self, path: Path, *, max_events: int, compact_bytes: int) -> None:
        self.path = path
        self.max_events = max_events
        self.compact_bytes = compact_bytes
        self.sessions: dict[str, _Session] = {}
        self.stats = dict.fromkeys(
            (
                "events",
                "duplicates",
                "dropped",
                "forgotten",
                "syncs",
                "compactions",
                "resent",
                "confirmed_by_cursor",
                "confirmed_by_ping",
            ),
            0,
        )
        self._fd = -1
        self._size = 0
        self._live = 0
        self._unwritten: list[bytes] = []
        self._dirty = False
        self._to_ack: list[Deferred] = []
        self._wanted = trio.Event()
        self._warned: dict[str, float] = {}
        #: Bumped whenever events are written on a stream or confirmed, and by :meth:`nudge`.
        self.progress = Changes()

    # -- loading ---------------------------------------------------------------------------

    def load(self, keep: Callable[[bytes], bool] | None = None) -> None:
        """Rebuild the pending events from the file (repairing a torn tail) and open it.

        With ``keep``, an event it refuses is not pending (its seq still counts as seen): a
        buffer written by an older gateway may hold events that no longer go upstream.
        """
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            data = b""
        if data and not data.startswith(_MAGIC):
            aside = self.path.with_suffix(f".unreadable-{int(time.time())}")
            log.error("%s is not a stream buffer; moved it to %s", self.path, aside)
            os.replace(self.path, aside)
            data = b""
        offset = len(_MAGIC) if data else 0
        left_out = 0
        while offset + _RECORD.size <= len(data):
            length, crc = _RECORD.unpack_from(data, offset)
            payload = data[offset + _RECORD.size : offset + _RECORD.size + length]
            if len(payload) < length or zlib.crc32(payload) != crc:
                break
            try:
                kind, session_id, seq, event = _decode_record(payload)
            except msgspec.DecodeError:
                break
            if kind == _EVENT and (keep is None or keep(event)):
                self._add(session_id, seq, event)
            elif kind == _EVENT:
                self._note(session_id, seq)
                left_out += 1
            else:
                self._done(session_id, seq)
            offset += _RECORD.size + length
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        if not data:
            os.ftruncate(self._fd, 0)
            os.write(self._fd, _MAGIC)
            offset = len(_MAGIC)
        elif offset < len(data):
            log.warning("%s: dropped a torn tail of %d bytes", self.path, len(data) - offset)
            os.ftruncate(self._fd, offset)
        os.fsync(self._fd)
        self._size = offset
        self._unwritten.clear()
        pending = self.pending_count()
        if pending:
            log.info("stream buffer: %d undelivered events of %d sessions", pending, len(self))
        if left_out:
            log.info("stream buffer: %d undelivered events no longer go upstream", left_out)

    def __len__(self) -> int:
        return sum(1 for s in self.sessions.values() if len(s))

    def pending_count(self) -> int:
        """Events the server is not known to have (unsent and sent)."""
        return sum(len(s) for s in self.sessions.values())

    def unsent_count(self) -> int:
        """Events not yet written on any stream."""
        return sum(len(s.events) for s in self.sessions.values())

    # -- the event path --------------------------------------------------------------------

    def add(self, session_id: str, seq: int, event: bytes) -> bool:
        """Keep an event; False (and nothing kept) if it is not newer than the last one."""
        if not self._add(session_id, seq, event):
            self.stats["duplicates"] += 1
            return False
        self.stats["events"] += 1
        self._wanted.set()
        return True

    def _add(self, session_id: str, seq: int, event: bytes) -> bool:
        if not self._note(session_id, seq):
            return False
        s = self.sessions[session_id]
        s.events.append((seq, event))
        self._unwritten.append(_record(_EVENT, session_id, seq, event))
        self._live += len(event) + _OVERHEAD
        if len(s) > self.max_events:
            dropped, data = (s.sent or s.events).popleft()
            self._live -= len(data) + _OVERHEAD
            s.done = dropped
            s.marked = max(s.marked, dropped)
            self._unwritten.append(_record(_DONE, session_id, dropped))
            self.stats["dropped"] += 1
            self._warn_dropped(session_id)
        return True

    def skip(self, session_id: str, seq: int) -> bool:
        """Note an event that is not kept (it never goes upstream); False if not newer.

        Its seq counts as seen, so that a redelivery of it is a duplicate and a later event
        still has to be newer. Nothing is written: there is nothing to deliver, and after a
        restart a redelivery of it is simply left out again.
        """
        if not self._note(session_id, seq):
            self.stats["duplicates"] += 1
            return False
        return True

    def _note(self, session_id: str, seq: int) -> bool:
        s = self.sessions.get(session_id)
        if s is None:
            s = self.sessions[session_id] = _Session()
        if seq <= s.last or seq <= s.done:
            return False
        s.last = seq
        return True

    def forget(self, session_id: str) -> int:
        """Drop every undelivered event of a session (it was deleted); returns how many."""
        s = self.sessions.get(session_id)
        if s is None:
            return 0
        count = len(s)
        if s.last > s.done:
            self._done(session_id, s.last)
            self._write(_record(_DONE, session_id, s.done))
        self.stats["forgotten"] += count
        return count

    def ack_when_synced(self, deferred: Deferred) -> None:
        """Ack a bus message once the records written so far are fsynced."""
        self._to_ack.append(deferred)
        self._wanted.set()

    def has_pending(self, session_id: str) -> bool:
        """Whether the session has unsent events."""
        s = self.sessions.get(session_id)
        return bool(s and s.events)

    def pending_in(self, session_id: str) -> int:
        """How many unsent events the session has."""
        s = self.sessions.get(session_id)
        return len(s.events) if s else 0

    def full(self, session_id: str) -> bool:
        """Whether the session holds ``max_events`` events not yet confirmed (unsent, or
        written and not proven read): one more drops the oldest."""
        s = self.sessions.get(session_id)
        return s is not None and len(s) >= self.max_events

    def moves(self, session_id: str) -> int:
        """How often the session's events were written on a stream or confirmed so far."""
        s = self.sessions.get(session_id)
        return s.moves if s else 0

    def nudge(self) -> None:
        """Wake whoever waits on :attr:`progress`: a stream closed, and what it waited for
        may never come."""
        self.progress.bump()

    def take(self, session_id: str, max_events: int, max_bytes: int) -> list[tuple[int, bytes]]:
        """The oldest unsent events of a session (they stay unsent until :meth:`sent`)."""
        s = self.sessions.get(session_id)
        out: list[tuple[int, bytes]] = []
        size = 0
        for seq, event in s.events if s else ():
            if out and (len(out) >= max_events or size + len(event) > max_bytes):
                break
            out.append((seq, event))
            size += len(event)
        return out

    def sent(self, session_id: str, seq: int, *, mark: bool = False) -> None:
        """Every unsent event of the session up to ``seq`` was written on its stream: not
        sent again on that stream, kept in memory until confirmed.

        With ``mark`` the file says at once that they are no longer pending, so that a
        gateway restarted after ``kill -9`` does not send them again. That is for a server
        that cannot tell a replay (omnigent's relay reads no event id, and appends a
        replayed delta to its text a second time): after a restart it is not known which
        of them its process had read. A tunnel that drops while this process lives still
        sends what no ping proved read again (:meth:`rewind`): that server lost them with
        its process.
        """
        s = self.sessions.get(session_id)
        if s is None:
            return
        while s.events and s.events[0][0] <= seq:
            s.sent.append(s.events.popleft())
        self._moved(s)
        if mark and seq > s.marked:
            s.marked = seq
            self._write(_record(_DONE, session_id, seq))

    def rewind(self, session_id: str, cursor: int | None) -> None:
        """A stream of the session opened: what the server may not have goes again.

        ``cursor`` is its ``Last-Event-ID``: the server has every event up to it (they are
        confirmed) and none after it, so every later event is unsent again, even one written
        before. Without a cursor the sent events that no ping confirmed go again (a server
        that read them and died with them in memory gets them once more: at least once).
        """
        s = self.sessions.get(session_id)
        if s is None:
            s = self.sessions[session_id] = _Session()
        if cursor is not None and cursor > s.done:
            self.delivered(session_id, cursor, "confirmed_by_cursor")
        if s.sent:
            self.stats["resent"] += len(s.sent)
            s.events.extendleft(reversed(s.sent))
            s.sent.clear()
        if s.events:
            self._wanted.set()

    def received(self, session_id: str, seq: int, *, keep: int = 0) -> None:
        """A ping answered after the frame that carried ``seq``: the server's process read
        every sent event up to it.

        With ``keep`` 0 that confirms them. A server that confirms by cursor may still lose
        what it read and had not stored when it dies, so the newest ``keep`` of them stay,
        to go again if its next cursor is behind them; older ones are confirmed, which
        bounds the buffer of a stream that stays open for days.
        """
        s = self.sessions.get(session_id)
        if s is None or seq <= s.done:
            return
        upto = seq
        if keep:
            excess = len(s.sent) - keep
            if excess <= 0:
                return
            upto = min(upto, s.sent[excess - 1][0])
        self.delivered(session_id, upto)

    def delivered(self, session_id: str, seq: int, how: str = "confirmed_by_ping") -> None:
        """The server has every event of the session up to ``seq``: never send it again
        (``how`` names the stat that counts them)."""
        s = self.sessions.get(session_id)
        if s is None or seq <= s.done:
            return
        before, unmarked = len(s), seq > s.marked
        self._done(session_id, seq)
        self.stats[how] += before - len(s)
        if unmarked:
            self._write(_record(_DONE, session_id, seq))

    def _done(self, session_id: str, seq: int) -> None:
        s = self.sessions.get(session_id)
        if s is None:
            s = self.sessions[session_id] = _Session()
        s.done = max(s.done, seq)
        s.marked = max(s.marked, seq)
        s.last = max(s.last, seq)
        for queue in (s.sent, s.events):
            while queue and queue[0][0] <= s.done:
                self._live -= len(queue.popleft()[1]) + _OVERHEAD
        self._moved(s)

    def _moved(self, s: _Session) -> None:
        s.moves += 1
        self.nudge()

    def _warn_dropped(self, session_id: str) -> None:
        now = time.monotonic()
        if now - self._warned.get(session_id, -math.inf) > 10:
            self._warned[session_id] = now
            log.warning(
                "session %s: more than %d undelivered events; dropping the oldest",
                session_id,
                self.max_events,
            )

    # -- writing ---------------------------------------------------------------------------

    def _write(self, extra: bytes = b"") -> None:
        if self._unwritten:
            extra = b"".join(self._unwritten) + extra
            self._unwritten.clear()
        if extra:
            os.write(self._fd, extra)
            self._size += len(extra)
            self._dirty = True

    async def run(self) -> None:
        """Write, fsync (one round at a time, so rounds group), ack, compact; forever."""
        while True:
            await self._wanted.wait()
            self._wanted = trio.Event()
            self._write()
            acks, self._to_ack = self._to_ack, []
            if self._dirty:
                self._dirty = False
                await trio.to_thread.run_sync(os.fsync, self._fd)
                self.stats["syncs"] += 1
            for deferred in acks:
                deferred.ack()
            if self._size > self.compact_bytes and self._size > 4 * self._live:
                self.compact()

    def compact(self) -> None:
        """Rewrite the file with only what replay needs (synchronous: nothing interleaves)."""
        self._write()
        parts = [_MAGIC]
        for session_id, s in self.sessions.items():
            if s.marked:
                parts.append(_record(_DONE, session_id, s.marked))
            parts.extend(_record(_EVENT, session_id, seq, ev) for seq, ev in s.sent)
            parts.extend(_record(_EVENT, session_id, seq, ev) for seq, ev in s.events)
        data = b"".join(parts)
        write_atomically(self.path, data)
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self._size = len(data)
        self.stats["compactions"] += 1

    def close(self) -> None:
        """Write and fsync what is pending, and close the file."""
        if self._fd < 0:
            return
        self._write()
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = -1
