"""RunJournal: the per-(session, run) append-only journal as a plain synchronous library.

Layout under ``root`` (format version 1, see docs/journal.md)::

    <root>/<session_id>/<run_id>.jsonl      one JSON record per line, seq from 1

The journal keeps an in-memory cursor per open run (next seq, file size, open descriptor),
so an append costs one ``write`` (plus the fsync its policy asks for) and never rescans the
file. It is meant to have one appender per root: the synchronous :meth:`RunJournal.append`,
or, while one is open, a :class:`JournalWriter` (which then owns appends; see there).
Readers (:meth:`read`, :meth:`summary`, :meth:`snapshot`) only read files and may run
anywhere, even in another process.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import msgspec

from .._jsonlines import fsync_dir, write_atomically
from ._errors import ActiveRunError, JournalError, JournalIOError, WriterAttachedError
from ._files import FsyncPolicy, RunCursor, append_bytes, close, open_run, sync
from ._read import StoredIds, load_events, load_ids, read_bytes, replay
from ._records import (
    decode_json,
    encode_payload,
    encode_record,
    terminal_state_for,
    validate_event,
    validate_id,
    validate_key,
    validate_session_seq,
)
from ._retention import RetentionReport, RunInfo, candidates, compact, is_due
from ._shapes import (
    Listing,
    Replay,
    RunRow,
    SessionPayload,
    SessionRow,
    Snapshot,
    StoredRecord,
    Summary,
)
from ._snapshot import build_snapshot, session_payload
from ._summary import summarize

_Key = tuple[str, str]
_SUFFIX = ".jsonl"


class JournalStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """Counters of one :class:`RunJournal` since it was created."""

    appends: int
    fsyncs: int
    torn_repairs: int
    open_runs: int
    writer_attached: bool


def parse_policy(value: FsyncPolicy | str) -> FsyncPolicy:
    """Return ``value`` as an :class:`FsyncPolicy`, or raise a ``ValueError`` naming the choices."""
    try:
        return FsyncPolicy(value)
    except ValueError:
        choices = ", ".join(policy.value for policy in FsyncPolicy)
        raise ValueError(f"fsync policy must be one of {choices}; got {value!r}") from None


class RunJournal:
    """The run journal under ``root``: append, replay, summarise, snapshot, retain.

    Usable without a running host: every method works on the files directly. Appends are
    durable according to ``fsync`` (:class:`FsyncPolicy`); ``interval`` seconds is the
    longest a record may stay unsynced under the ``interval`` policy. Thread-safe.

    Args:
        root: directory holding one sub-directory per session (created on first append).
        fsync: ``every`` (default), ``terminal`` or ``interval``.
        interval: seconds, for the ``interval`` policy.
        max_open_runs: how many run files stay open between appends.
        clock: wall clock for ``created_at`` (tests inject one).
    """

    def __init__(
        self,
        root: Path | str,
        *,
        fsync: FsyncPolicy | str = FsyncPolicy.EVERY,
        interval: float = 1.0,
        max_open_runs: int = 256,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be > 0 seconds; got {interval!r}")
        if max_open_runs < 1:
            raise ValueError(f"max_open_runs must be >= 1; got {max_open_runs!r}")
        self._root = Path(root)
        self._policy = parse_policy(fsync)
        self._interval = float(interval)
        self._max_open_runs = max_open_runs
        self._clock = clock
        self._lock = threading.Lock()
        self._cursors: OrderedDict[_Key, RunCursor] = OrderedDict()
        # Runs an attached writer has open: retention and deletes must leave them alone.
        self._held: set[_Key] = set()
        self._writer: object | None = None
        self._appends = 0
        self._fsyncs = 0
        self._torn_repairs = 0

    @property
    def root(self) -> Path:
        """The directory holding the journals."""
        return self._root

    @property
    def policy(self) -> FsyncPolicy:
        """The fsync policy appends follow."""
        return self._policy

    @property
    def interval(self) -> float:
        """Seconds a record may stay unsynced under the ``interval`` policy."""
        return self._interval

    @property
    def clock(self) -> Callable[[], float]:
        """The wall clock that stamps ``created_at``."""
        return self._clock

    def path(self, session_id: str, run_id: str) -> Path:
        """The run's file (one JSON record per line). Raises :class:`InvalidIdError`."""
        session_id = validate_id(session_id, "session_id")
        run_id = validate_id(run_id, "run_id")
        return self._root / session_id / f"{run_id}{_SUFFIX}"

    def append(
        self,
        session_id: str,
        run_id: str,
        event: str,
        payload: Any = None,
        *,
        key: str | None = None,
        session_seq: int | None = None,
    ) -> StoredRecord:
        """Append one event to the run and return the stored record (J-01).

        The record gets the run's next seq. ``payload`` ``None`` is stored as ``{}`` (J-03).
        ``key``, if given, is stored with the record as an idempotency key (see :meth:`keys`),
        and ``session_seq`` (an int >= 1) as the event's seq in its session's stream (see
        :meth:`stored`); the journal stores either as given and drops nothing itself.
        The returned dict equals what :meth:`read` gives back for it.

        Raises:
            InvalidIdError, InvalidEventError, PayloadError: bad input; nothing was written.
            WriterAttachedError: a :class:`JournalWriter` owns appends right now.
            JournalIOError: the disk refused the write or the fsync.
        """
        path = self.path(session_id, run_id)
        event = validate_event(event)
        key = validate_key(key)
        session_seq = validate_session_seq(session_seq)
        raw = encode_payload(payload)
        state = terminal_state_for(event, payload)
        run_key = (session_id, run_id)
        with self._lock:
            if self._writer is not None:
                raise WriterAttachedError("a JournalWriter is open on this journal; append via it")
            cursor = self._cursor(run_key, path)
            line = encode_record(
                session_id=session_id,
                run_id=run_id,
                seq=cursor.next_seq,
                event=event,
                payload=raw,
                terminal_state=state,
                created_at=self._clock(),
                key=key,
                session_seq=session_seq,
            )
            try:
                append_bytes(cursor, line)
                if self._needs_sync(cursor, state):
                    sync(cursor)
                    self._fsyncs += 1
            except OSError as exc:
                # Reopen from disk next time: the file, not this cursor, says what is there.
                self._drop_cursor(run_key)
                raise JournalIOError(f"could not append to {path}: {exc}") from exc
            cursor.next_seq += 1
            self._appends += 1
        return decode_json(line)

    def read(
        self,
        session_id: str,
        run_id: str,
        *,
        after_seq: int | str = 0,
        limit: int | None = None,
        max_bytes: int | None = None,
        strict: bool = False,
    ) -> Replay:
        """Replay the run's records after a cursor.

        ``after_seq`` is a seq (records with a greater seq are returned) or an event id
        ``"<run_id>:<seq>"`` with Last-Event-ID semantics: an id from another run, or past
        this run's last record, replays from the start (and sets ``cursor_reset``).

        Returns ``{"events", "malformed", "complete", "limit_reason", "next_after_seq",
        "last_seq", "cursor_reset", "incomplete_tail", "session_id", "run_id"}``. Lines that do
        not decode are reported in ``malformed`` (``{"line", "reason", "raw"}``) and skipped.
        ``limit`` bounds the rows and ``max_bytes`` the encoded bytes returned (the first
        record always fits); when a bound stops the read, ``complete`` is false and
        ``next_after_seq`` is where to continue. With ``strict``, records must run 1, 2, 3...
        for this run; the first that does not is reported (``non_contiguous`` or
        ``foreign_record``) and nothing from it on is returned.

        Raises:
            InvalidIdError: a bad id. InvalidCursorError: a cursor of neither form.
        """
        path = self.path(session_id, run_id)
        return replay(
            read_bytes(path),
            session_id=session_id,
            run_id=run_id,
            after_seq=after_seq,
            limit=limit,
            max_bytes=max_bytes,
            strict=strict,
        )

    def summary(self, session_id: str, run_id: str) -> Summary:
        """The run's summary: cursor, terminal state and observed runtime model.

        Always a dict with ``runtime_model`` (an observation or ``None``), ``terminal_state``
        (``unknown`` for a run with no records) and ``last_seq`` (0 when empty); see
        :mod:`corral.journal._summary` for the rules. Each call returns fresh objects.
        """
        path = self.path(session_id, run_id)
        return summarize(session_id, run_id, load_events(path))

    def keys(self, session_id: str, run_id: str) -> dict[str, int]:
        """The idempotency keys stored in the run (records appended with ``key=``), each with
        its record's seq.

        An appender that may have crashed between storing a record and learning that it was
        stored asks this to skip what is already there. Reads the file; never modifies it.
        """
        return self.stored(session_id, run_id).keys

    def stored(self, session_id: str, run_id: str) -> StoredIds:
        """What the run holds of what its appenders numbered: the idempotency keys (as
        :meth:`keys`) and the highest ``session_seq`` stored (0 if none), in one read.

        The journal actor reads it at its first append to a run after a (re)start, so that
        an event sent again — by key, or at or below that ``session_seq`` — is not stored
        twice. Reads the file; never modifies it.
        """
        return load_ids(self.path(session_id, run_id))

    def listing(self, session_id: str | None = None) -> Listing:
        """What the journal holds, for ``corral journal ls`` and the journal actor.

        Without ``session_id``: ``{"sessions": [{"session_id", "runs", "bytes",
        "modified_at"}]}`` from directory listings and ``stat`` alone. With it:
        ``{"session_id", "runs": [<the run's summary plus "bytes">]}``, oldest run first
        (each run is read once). Raises :class:`InvalidIdError`; an unknown session lists as
        no runs.
        """
        if session_id is None:
            return {"sessions": [self._session_row(sid) for sid in self.sessions()]}
        rows: list[RunRow] = []
        for run_id in self.runs(session_id):
            path = self.path(session_id, run_id)
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                continue
            rows.append({**summarize(session_id, run_id, load_events(path)), "bytes": size})
        rows.sort(key=_started)
        return {"session_id": session_id, "runs": rows}

    def snapshot(self, run_id: str) -> Snapshot | None:
        """The live snapshot of a run found by its id alone, or ``None`` if it has no records.

        Has the summary's keys plus ``last_assistant_text`` and ``reasoning_text``. If two
        sessions hold a run with this id, the most recently written one is used.
        """
        run_id = validate_id(run_id, "run_id")
        found: list[tuple[int, str, Path]] = []
        for session_id in self.sessions():
            path = self._root / session_id / f"{run_id}{_SUFFIX}"
            with contextlib.suppress(FileNotFoundError):
                found.append((path.stat().st_mtime_ns, session_id, path))
        if not found:
            return None
        _mtime, session_id, path = max(found)
        return build_snapshot(session_id, run_id, load_events(path))

    def session_payload(self, snapshot: Mapping[str, object]) -> SessionPayload:
        """The projection of a snapshot embedded in a session payload (J-19).

        An independent copy; ``runtime_model`` is carried verbatim.
        """
        return session_payload(snapshot)

    def sessions(self) -> list[str]:
        """The ids of the sessions that have a journal directory, sorted."""
        try:
            entries = list(os.scandir(self._root))
        except FileNotFoundError:
            return []
        return sorted(entry.name for entry in entries if entry.is_dir() and _is_id(entry.name))

    def runs(self, session_id: str) -> list[str]:
        """The ids of the session's runs that have a file, sorted."""
        directory = self._root / validate_id(session_id, "session_id")
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return []
        return sorted(
            name[: -len(_SUFFIX)]
            for name in names
            if name.endswith(_SUFFIX) and _is_id(name[: -len(_SUFFIX)])
        )

    def delete_run(self, session_id: str, run_id: str) -> bool:
        """Delete one run's journal; ``False`` if it had none.

        Raises :class:`ActiveRunError` if an open writer holds the run.
        """
        path = self.path(session_id, run_id)
        key = (session_id, run_id)
        with self._lock:
            if key in self._held:
                raise ActiveRunError(
                    f"run {run_id!r} is held by an open writer",
                    session_id=session_id,
                    run_id=run_id,
                )
            self._drop_cursor(key)
            try:
                path.unlink()
            except FileNotFoundError:
                return False
            fsync_dir(path.parent)
            return True

    def delete_session(self, session_id: str) -> int:
        """Delete every journal of a session; return how many run files were removed.

        Raises :class:`ActiveRunError` (and deletes nothing) if an open writer holds one of
        the session's runs.
        """
        runs = self.runs(session_id)
        with self._lock:
            held = sorted(run for sid, run in self._held if sid == session_id)
            if held:
                raise ActiveRunError(
                    f"session {session_id!r} has runs held by an open writer: {held}",
                    session_id=session_id,
                    run_id=held[0],
                )
            for key in [key for key in self._cursors if key[0] == session_id]:
                self._drop_cursor(key)
            directory = self._root / session_id
            if not directory.exists():
                return 0
            shutil.rmtree(directory)
            fsync_dir(self._root)
            return len(runs)

    def retain(
        self,
        session_id: str,
        *,
        max_age_s: float | None = None,
        max_bytes: int | None = None,
        now: float | None = None,
    ) -> RetentionReport:
        """Compact finished runs of a session that are too old, or while it is too big.

        Every finished run whose last record is older than ``max_age_s`` is compacted; then,
        oldest first, finished runs are compacted while the session's files exceed
        ``max_bytes``. Compaction folds stream events (tokens, ``*.delta``, heartbeats) into
        ``journal.compacted`` records and keeps every state and terminal record verbatim.
        A run without a terminal record, or held by an open writer, is never touched.
        """
        directory = self._root / validate_id(session_id, "session_id")
        now = self._clock() if now is None else now
        with self._lock:
            _remove_stale_temp_files(directory)
            infos = [self._run_info(session_id, run_id) for run_id in self.runs(session_id)]
            total = before = sum(info.size for info in infos)
            compacted: list[str] = []
            folded = 0
            for info in candidates(infos):
                if not is_due(info, total=total, max_age_s=max_age_s, max_bytes=max_bytes, now=now):
                    continue
                path = directory / f"{info.run_id}{_SUFFIX}"
                data = read_bytes(path)
                result = compact(data)
                if result is None:
                    continue
                content, count = result
                self._drop_cursor((session_id, info.run_id))
                write_atomically(path, content)
                total -= len(data) - len(content)
                compacted.append(info.run_id)
                folded += count
        return RetentionReport(
            session_id=session_id,
            compacted=tuple(compacted),
            skipped_active=tuple(info.run_id for info in infos if info.active),
            folded_records=folded,
            bytes_before=before,
            bytes_after=total,
        )

    def sync(self) -> None:
        """Force every record appended through this journal to disk, whatever the policy."""
        with self._lock:
            for cursor in self._cursors.values():
                if cursor.dirty:
                    sync(cursor)
                    self._fsyncs += 1

    def close(self) -> None:
        """Sync and close every open run file. The journal stays usable (files reopen)."""
        with self._lock:
            while self._cursors:
                _key, cursor = self._cursors.popitem(last=False)
                close(cursor)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def statistics(self) -> JournalStatistics:
        """A frozen snapshot of this journal's counters."""
        return JournalStatistics(
            appends=self._appends,
            fsyncs=self._fsyncs,
            torn_repairs=self._torn_repairs,
            open_runs=len(self._cursors),
            writer_attached=self._writer is not None,
        )

    # -- the writer's side: it owns appends while attached ------------------------------

    def _attach(self, writer: object) -> None:
        with self._lock:
            if self._writer is not None:
                raise JournalError("another JournalWriter is already open on this journal")
            # The writer reopens runs from disk: hand over every file in its final state.
            while self._cursors:
                _key, cursor = self._cursors.popitem(last=False)
                close(cursor)
            self._writer = writer

    def _detach(self, writer: object) -> None:
        with self._lock:
            if self._writer is writer:
                self._writer = None
                self._held.clear()

    def _open_for_writer(self, key: _Key) -> RunCursor:
        # Runs in a worker thread. Under the lock, so a compaction is never half-way through
        # the file the writer opens, and the run counts as held before the lock is released.
        with self._lock:
            cursor, cut = open_run(self._root / key[0] / f"{key[1]}{_SUFFIX}")
            self._torn_repairs += cut > 0
            self._held.add(key)
            return cursor

    def _release_for_writer(self, key: _Key) -> None:
        self._held.discard(key)

    # -- internals ------------------------------------------------------------------------

    def _session_row(self, session_id: str) -> SessionRow:
        size = 0
        modified = 0.0
        count = 0
        for run_id in self.runs(session_id):
            try:
                stat = (self._root / session_id / f"{run_id}{_SUFFIX}").stat()
            except FileNotFoundError:
                continue
            count += 1
            size += stat.st_size
            modified = max(modified, stat.st_mtime)
        return {
            "session_id": session_id,
            "runs": count,
            "bytes": size,
            "modified_at": modified or None,
        }

    def _needs_sync(self, cursor: RunCursor, terminal_state: str | None) -> bool:
        if self._policy is FsyncPolicy.EVERY:
            return True
        if self._policy is FsyncPolicy.TERMINAL:
            return terminal_state is not None
        return time.monotonic() - cursor.last_sync >= self._interval

    def _cursor(self, key: _Key, path: Path) -> RunCursor:
        cursor = self._cursors.get(key)
        if cursor is not None:
            self._cursors.move_to_end(key)
            return cursor
        try:
            cursor, cut = open_run(path)
        except OSError as exc:
            raise JournalIOError(f"could not open {path}: {exc}") from exc
        self._torn_repairs += cut > 0
        self._cursors[key] = cursor
        while len(self._cursors) > self._max_open_runs:
            _old, evicted = self._cursors.popitem(last=False)
            close(evicted)
        return cursor

    def _drop_cursor(self, key: _Key) -> None:
        cursor = self._cursors.pop(key, None)
        if cursor is not None:
            with contextlib.suppress(OSError):
                close(cursor)

    def _run_info(self, session_id: str, run_id: str) -> RunInfo:
        path = self._root / session_id / f"{run_id}{_SUFFIX}"
        size = path.stat().st_size
        summary = summarize(session_id, run_id, load_events(path))
        updated_at = summary["updated_at"]
        if not isinstance(updated_at, int | float):
            updated_at = path.stat().st_mtime
        return RunInfo(
            run_id=run_id,
            size=size,
            finished=summary["terminal"],
            active=not summary["terminal"] or (session_id, run_id) in self._held,
            updated_at=float(updated_at),
        )


def _started(row: RunRow) -> tuple[float, str]:
    # A hand-edited file may hold anything in created_at; such runs sort first.
    created = row["created_at"]
    is_time = isinstance(created, int | float) and not isinstance(created, bool)
    return (float(created) if is_time else 0.0, row["run_id"])


def _is_id(name: str) -> bool:
    try:
        validate_id(name, "id")
    except JournalError:
        return False
    return True


def _remove_stale_temp_files(directory: Path) -> None:
    # A crash during a compaction leaves its temp file; the original is still intact.
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(directory):
            if name.endswith(".tmp"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(directory / name)
