"""The broker's durable side: every actor's mailbox, and the log that keeps them.

A durable message is put in its recipient's :class:`~corral.bus._mailbox.Mailbox` and a
``Put`` record is queued for the :mod:`mailbox log <corral.bus._log>` at once; a **group
commit** writes everything queued during the previous fsync with one ``fdatasync`` and then
tells each sender, with one :class:`~corral.bus.Accepted` per sender, which of its messages
are now durable. Acks, attempts, parks and dead letters are records in the same log, queued
behind the ``Put`` of the message they are about, so a log that holds an effect also holds
its cause. When the log is more than four times its live data it is compacted; when the
broker starts, it is replayed into mailboxes.

:class:`DurableStore` keeps this state and its bookkeeping; it never touches a socket. The
:class:`~corral.bus.Broker` decides what to deliver and when, and gives the store the one
way it answers a sender (``reply``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import trio

from .._exceptions import ProtocolError
from ..config import BusSettings
from ._codec import decode_envelope, encode_envelope
from ._log import (
    Acked,
    Attempted,
    DeadLettered,
    LogRecord,
    MailboxLog,
    Parked,
    Put,
    Undead,
    Unparked,
    frame_record,
)
from ._mailbox import DeadLetter, Entry, Mailbox
from ._messages import (
    Accepted,
    Envelope,
    ErrorReply,
    Message,
    Nack,
    ParkedEntry,
    Reject,
    Unpark,
)

log = logging.getLogger("corral.bus.broker")

_DEAD_FRAME_KEEP = 64 * 1024

#: How the store answers a sender: ``(to, correlation_id, msg)``.
Reply = Callable[[str, str | None, Message], None]


class DurableStore:
    """The mailboxes of every known actor, the dead letters, and the mailbox log.

    Args:
        log_path: the durable mailbox log.
        settings: limits from ``[bus]`` in corral.toml.
        reply: sends a broker message to a peer (``Accepted``, a dead letter's error).
    """

    def __init__(self, log_path: Path, settings: BusSettings, *, reply: Reply) -> None:
        self.settings = settings
        self._reply = reply
        self._log = MailboxLog(log_path)
        #: Every mailbox, by actor name.
        self.boxes: dict[str, Mailbox] = {}
        #: Names durable messages may be sent to (declared, said hello, or in the log).
        self.known: set[str] = set()
        self._dead: deque[DeadLetter] = deque(maxlen=settings.max_dead_letters)
        self._resolved: deque[tuple[Entry, str, str | None, float]] = deque(maxlen=1000)
        self._pending: list[tuple[bytes, Entry | None]] = []
        #: Whether anything pending must be on disk before the commit is done: anything but
        #: acknowledgements (see :meth:`commit_once`).
        self._sync_wanted = False
        #: Whether the log holds writes no fsync has covered yet (acks alone).
        self._unsynced = False
        self._commit_wanted = trio.Event()
        self._io_limiter = trio.CapacityLimiter(1)
        self._live_bytes = 0
        #: ``commits``: rounds written; ``syncs``: those forced to disk (an fdatasync each).
        self.stats = {"commits": 0, "syncs": 0, "compactions": 0}

    # --- opening and recovery --------------------------------------------------------------

    async def open(self) -> None:
        """Open the log (repairing a torn tail) and rebuild the mailboxes from it."""
        records = await trio.to_thread.run_sync(self._log.open, limiter=self._io_limiter)
        self._recover(records)

    def close(self) -> None:
        """Close the log (after the last :meth:`commit_once`), forcing to disk what no
        commit did: an orderly stop leaves no ack to a crash of the machine."""
        if self._unsynced:
            self._log.sync()
            self._unsynced = False
            self.stats["syncs"] += 1
        self._log.close()

    def _recover(self, records: list[LogRecord]) -> None:
        entries: dict[str, Entry] = {}
        for record in records:
            if isinstance(record, Put):
                try:
                    env = decode_envelope(record.frame)
                except ProtocolError:
                    continue
                entries[record.id] = entry_of(env, record.frame)
            elif isinstance(record, Acked):
                for mid in record.ids:
                    entries.pop(mid, None)
            elif isinstance(record, Attempted):
                if record.id in entries:
                    entries[record.id].attempt = record.attempt
            elif isinstance(record, DeadLettered):
                entries.pop(record.id, None)
                self._dead.append(
                    DeadLetter(
                        record.id,
                        record.actor,
                        record.type,
                        record.attempts,
                        record.error,
                        record.at,
                        record.frame,
                    )
                )
                self.mailbox(record.actor).dead_letters += 1
            elif isinstance(record, Undead):
                self._forget_dead(record.ids)
            elif isinstance(record, Parked):
                if record.id in entries:
                    entries[record.id].owner = record.owner
            elif isinstance(record, Unparked):
                entry = entries.pop(record.id, None)
                if entry is not None:
                    self._remember_resolved(entry, record.state, record.reason)
        for entry in entries.values():
            box = self.mailbox(entry.recipient)
            self.known.add(entry.recipient)
            if entry.owner is not None:
                box.parked[entry.id] = entry
            else:
                box.queued.append(entry)
            self._live_bytes += len(entry.frame)
        if entries:
            log.info("recovered %d durable messages from %s", len(entries), self._log.path)

    # --- registry and inspection -----------------------------------------------------------

    def register(self, name: str) -> None:
        """Declare an actor name: durable messages to it are kept even while it is down."""
        self.known.add(name)
        self.mailbox(name)

    def mailbox(self, name: str) -> Mailbox:
        """The mailbox of ``name`` (created empty if needed)."""
        box = self.boxes.get(name)
        if box is None:
            box = self.boxes[name] = Mailbox(name)
        return box

    def mailboxes(self, actor: str | None = None, *, peek: int = 0) -> list[dict[str, Any]]:
        """Rows for ``corral mailboxes``."""
        names = [actor] if actor else sorted(self.boxes)
        stuck = self.settings.stuck_after_s
        return [
            self.boxes[n].statistics(peek=peek, stuck_after_s=stuck)
            for n in names
            if n in self.boxes
        ]

    def dead_letters(self) -> list[dict[str, Any]]:
        """Rows for ``corral dead-letters``, oldest first."""
        return [d.to_json() for d in self._dead]

    def parked(self) -> list[dict[str, Any]]:
        """Every parked entry and the recently resolved ones, for ``corral elicitations``.

        Each row: ``id``, ``owner``, ``type``, ``state`` (parked/resolved/cancelled),
        ``reason``, ``age_s`` and ``frame`` (the envelope, for the caller to decode).
        """
        now = time.monotonic()
        rows = [
            {
                "id": e.id,
                "owner": e.owner,
                "type": e.type,
                "state": state,
                "reason": reason,
                "frame": e.frame,
                "age_s": None,
                "resolved_at": at,
            }
            for e, state, reason, at in self._resolved
        ]
        for box in self.boxes.values():
            rows.extend(
                {
                    "id": e.id,
                    "owner": e.owner,
                    "type": e.type,
                    "state": "parked",
                    "reason": None,
                    "frame": e.frame,
                    "age_s": now - e.enqueued,
                    "resolved_at": None,
                }
                for e in box.parked.values()
            )
        return rows

    def parked_entries(self, name: str) -> list[ParkedEntry]:
        """The parked entries of ``name``, for its :class:`~corral.bus.ListParked`."""
        box = self.mailbox(name)
        now = time.monotonic()
        return [
            ParkedEntry(id=e.id, owner=e.owner, type=e.type, frame=e.frame, age_s=now - e.enqueued)
            for e in box.parked.values()
        ]

    # --- what recipients say about their messages ------------------------------------------

    def put(self, env: Envelope, frame: bytes) -> Mailbox:
        """Queue a validated durable message in its recipient's mailbox; return the box.

        Delivered while its commit runs; only the sender's Accepted waits for the fsync.
        The Put precedes anything the recipient's answer (an Ack, a Park, its own durable
        sends) can add to the log, so a log that holds the effect holds the cause. A crash
        before the commit loses a message its sender was never told was durable — the
        recipient may have seen it, hence recipients dedup by id or seq.
        """
        entry = entry_of(env, frame)
        self._pending.append(
            (frame_record(Put(id=env.id, recipient=env.recipient, frame=frame)), entry)
        )
        self._sync_wanted = True
        self._commit_wanted.set()
        box = self.mailbox(env.recipient)
        box.queued.append(entry)
        self._live_bytes += len(frame)
        return box

    def ack(self, name: str, ids: list[str]) -> Mailbox | None:
        """``name`` handled these; forget them. The box to refill, if any were in flight."""
        box = self.boxes.get(name)
        if box is None:
            return None
        done = []
        for mid in ids:
            entry = box.in_flight.pop(mid, None)
            if entry is not None:
                done.append(mid)
                self._live_bytes -= len(entry.frame)
        if not done:
            return None
        self.append(Acked(ids=done))
        return box

    def nack(self, name: str, msg: Nack) -> Mailbox | None:
        """``name``'s handler failed: queue the entry again, counting the attempt."""
        box = self.boxes.get(name)
        entry = box.in_flight.pop(msg.id, None) if box else None
        if box is None or entry is None:
            return None
        entry.delivered_to = None
        box.queued.appendleft(entry)
        box.redelivered += 1
        self.retry_or_bury(box, entry, msg.error)
        return box

    def reject(self, name: str, msg: Reject) -> Mailbox | None:
        """``name`` cannot decode the message at all: dead-letter it now.

        The broker never decodes bodies, so this is where a durable message with a bad body
        ends: its sender is told ``protocol_error``, as a stream sender waiting for a reply
        is told by the recipient itself (which is why a sender that waits is not told twice).
        """
        box = self.boxes.get(name)
        entry = box.in_flight.pop(msg.id, None) if box else None
        if entry is not None:
            self._bury(entry, msg.error, tell=False)
            if not entry.wants_reply:
                error = ErrorReply(code="protocol_error", message=msg.error)
                self._reply(entry.sender, entry.id, error)
            return box
        self.record_dead(msg.id, name, msg.message_type, 1, msg.error, b"")
        return None

    def park(self, name: str, mid: str) -> Mailbox | None:
        """Move ``name``'s in-flight entry ``mid`` to its parked set."""
        box = self.boxes.get(name)
        entry = box.in_flight.pop(mid, None) if box else None
        if box is None or entry is None:
            log.warning("%s asked to park %s, which it does not hold", name, mid)
            return None
        entry.owner = name
        box.parked[entry.id] = entry
        self.append(Parked(id=entry.id, owner=name))
        return box

    def hold(self, name: str, mid: str) -> None:
        """``name``'s own work on its in-flight entry ``mid`` is done (it waits on another
        process): a restart of ``name`` is not charged to it. Kept in memory only: a broker
        that restarts redelivers everything without counting an attempt anyway."""
        box = self.boxes.get(name)
        entry = box.in_flight.get(mid) if box else None
        if entry is not None:
            entry.held = True

    def unpark(self, name: str, msg: Unpark) -> None:
        """Resolve one of ``name``'s parked entries."""
        box = self.boxes.get(name)
        entry = box.parked.pop(msg.id, None) if box else None
        if entry is None:
            return
        self._live_bytes -= len(entry.frame)
        self.append(Unparked(id=msg.id, state=msg.state, reason=msg.reason))
        self._remember_resolved(entry, msg.state, msg.reason)

    def _remember_resolved(self, entry: Entry, state: str, reason: str | None) -> None:
        self._resolved.append((entry, state, reason, time.time()))

    def retry_or_bury(self, box: Mailbox, entry: Entry, error: str) -> None:
        """Count a failed delivery; past ``max_attempts`` the entry is dead-lettered."""
        if entry.attempt >= self.settings.max_attempts:
            with contextlib.suppress(ValueError):
                box.queued.remove(entry)
            self._bury(entry, f"{error}; gave up after {entry.attempt} attempts")
            return
        entry.attempt += 1
        self.append(Attempted(id=entry.id, attempt=entry.attempt))

    # --- dead letters ----------------------------------------------------------------------

    def _bury(self, entry: Entry, error: str, *, tell: bool = True) -> None:
        """Dead-letter an entry; ``tell`` a sender waiting for a reply (``dead_letter``)."""
        self._live_bytes -= len(entry.frame)
        self.record_dead(entry.id, entry.recipient, entry.type, entry.attempt, error, entry.frame)
        if tell and entry.wants_reply:
            self._reply(entry.sender, entry.id, ErrorReply(code="dead_letter", message=error))

    def record_dead(
        self, mid: str, actor: str, mtype: str, attempts: int, error: str, frame: bytes
    ) -> None:
        """Keep a dead letter (in memory and in the log, with the start of its frame)."""
        at = time.time()
        kept = frame[:_DEAD_FRAME_KEEP]
        self._dead.append(DeadLetter(mid, actor, mtype, attempts, error, at, kept))
        self.mailbox(actor).dead_letters += 1
        self.append(DeadLettered(mid, actor, mtype, attempts, error, at, kept))
        log.warning("dead letter %s for %s (%s): %s", mid, actor, mtype, error)

    def purge_dead(self, ids: list[str]) -> list[str]:
        """Drop these dead letters for good; returns the ids that were dead letters."""
        gone = self._forget_dead(ids)
        if gone:
            self.append(Undead(ids=[d.id for d in gone]))
            log.info("purged dead letters %s", ", ".join(d.id for d in gone))
        return [d.id for d in gone]

    def requeue_dead(self, mid: str) -> Mailbox:
        """Put dead letter ``mid`` back in its recipient's mailbox, as a new delivery (its
        attempts start again at 1); it keeps its id, so a recipient that did handle it
        before (and dedups by id) does not handle it twice. The caller pumps the box.

        Raises:
            KeyError: ``mid`` is not a dead letter.
            ValueError: it cannot be delivered again (not a durable message, kept only in
                part, or for an actor this host does not know); it stays a dead letter.
        """
        dead = next((d for d in self._dead if d.id == mid), None)
        if dead is None:
            raise KeyError(mid)
        try:
            env = decode_envelope(dead.frame)
        except ProtocolError:
            raise ValueError(
                "its message was not kept whole (malformed, or larger than 64 KiB)"
            ) from None
        if env.durability != "durable":
            raise ValueError("it is a stream message, which is never redelivered")
        if env.recipient not in self.known:
            raise ValueError(f"no actor named {env.recipient!r} runs on this host")
        frame = encode_envelope(msgspec.structs.replace(env, attempt=1))
        self._forget_dead([mid])
        self.append(Undead(ids=[mid]))
        self.append(Put(id=mid, recipient=env.recipient, frame=frame))
        box = self.mailbox(env.recipient)
        box.queued.append(entry_of(msgspec.structs.replace(env, attempt=1), frame))
        self._live_bytes += len(frame)
        log.info("requeued dead letter %s for %s", mid, env.recipient)
        return box

    def _forget_dead(self, ids: list[str]) -> list[DeadLetter]:
        wanted = set(ids)
        gone = [d for d in self._dead if d.id in wanted]
        for dead in gone:
            self._dead.remove(dead)
            box = self.mailbox(dead.actor)
            box.dead_letters = max(box.dead_letters - 1, 0)
        return gone

    # --- the group commit ------------------------------------------------------------------

    def append(self, record: LogRecord) -> None:
        """Queue a record for the next commit."""
        self._pending.append((frame_record(record), None))
        if not isinstance(record, Acked):
            self._sync_wanted = True
        self._commit_wanted.set()

    async def commit_loop(self) -> None:
        """Commit whatever is queued, one batch per fsync, until cancelled."""
        window = self.settings.group_commit_window_ms / 1000
        while True:
            await self._commit_wanted.wait()
            if window:
                await trio.sleep(window)
            await self.commit_once()

    async def commit_once(self) -> None:
        """Write and fsync what is queued, then tell each sender what became durable.

        A round of acknowledgements alone is written at once and not forced to disk: the
        next round that holds anything else forces it too (one ``fdatasync`` covers the
        file). A written record survives any crash of a process, ``kill -9`` of the broker
        included (it is in the page cache); only a crash of the machine before the next
        fsync can lose it, and a lost ack only means its message is delivered again, which
        delivery at least once allows for. With sessions streaming at a model's pace, the
        acks of their deltas had cost an fsync round each, half of the broker's rounds.
        """
        self._commit_wanted = trio.Event()
        batch, self._pending = self._pending, []
        sync, self._sync_wanted = self._sync_wanted, False
        if not batch:
            return
        data = b"".join(chunk for chunk, _ in batch)
        if sync:
            await trio.to_thread.run_sync(self._write_sync, data, limiter=self._io_limiter)
            self.stats["syncs"] += 1
            self._unsynced = False
        else:
            # A few hundred bytes into the page cache; a thread would cost more than this.
            async with self._io_limiter:
                self._log.write(data)
            self._unsynced = True
        self.stats["commits"] += 1
        accepted: dict[str, list[str]] = {}
        for _, entry in batch:
            if entry is not None:
                accepted.setdefault(entry.sender, []).append(entry.id)
        # One acknowledgement per sender per commit: a send per message would cost more
        # than the commit itself.
        for sender, ids in accepted.items():
            self._reply(sender, None, Accepted(ids=ids))
        if (
            self._log.size > self.settings.compact_min_bytes
            and self._log.size > 4 * self._live_bytes
        ):
            await self._compact()

    def _write_sync(self, data: bytes) -> None:
        self._log.write(data)
        self._log.sync()

    async def _compact(self) -> None:
        records: list[LogRecord] = []
        live = 0
        for box in self.boxes.values():
            for entry in box.entries():
                records.append(Put(id=entry.id, recipient=entry.recipient, frame=entry.frame))
                if entry.attempt > 1:
                    records.append(Attempted(id=entry.id, attempt=entry.attempt))
                if entry.owner is not None:
                    records.append(Parked(id=entry.id, owner=entry.owner))
                live += len(entry.frame)
        records.extend(
            DeadLettered(d.id, d.actor, d.type, d.attempts, d.error, d.at, d.frame)
            for d in self._dead
        )
        before = self._log.size
        await trio.to_thread.run_sync(self._log.rewrite, records, limiter=self._io_limiter)
        self._live_bytes = live
        self.stats["compactions"] += 1
        log.info("compacted mailbox log %d → %d bytes", before, self._log.size)


def entry_of(env: Envelope, frame: bytes) -> Entry:
    """The mailbox entry of a durable message."""
    return Entry(
        id=env.id,
        recipient=env.recipient,
        sender=env.sender,
        type=env.type,
        session_id=env.session_id,
        frame=frame,
        wants_reply=env.wants_reply,
        attempt=env.attempt,
    )
