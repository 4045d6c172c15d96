"""JournalWriter: group commit for many concurrent runs on one trio event loop.

An fsync costs about as much for one record as for a hundred, and fsyncs of different files
overlap in the filesystem's journal. So instead of one write+fsync per record, the writer
collects every record submitted while the previous round was on disk, writes each touched
file once, fsyncs those files in worker threads (in parallel past :data:`FILES_PER_THREAD`
files), and only then releases the appenders waiting on that round: many records, one fsync
round.

Ordering: a record's seq is fixed when it is submitted, synchronously, in call order; rounds
are committed one at a time and a round writes each run's records in seq order. So per-run
order equals submission order even with many concurrent appenders (J-32).

Blocking work (opening files, writes, fsyncs) runs in ``trio.to_thread.run_sync`` under one
:class:`trio.CapacityLimiter`. Committing is shielded from cancellation: a submitted record is
always written, and closing the writer commits everything still pending.
"""

from __future__ import annotations

import contextlib
import math
import os
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Any, Self

import msgspec
import trio

from ._errors import JournalIOError
from ._files import FsyncPolicy, RunCursor, append_bytes, close, sync
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
from ._shapes import StoredRecord
from ._store import RunJournal, parse_policy

_Key = tuple[str, str]


class WriterStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """Counters of one :class:`JournalWriter`.

    ``appends`` counts records written; ``fsyncs`` counts file fsyncs and ``fsync_rounds``
    the rounds that issued at least one, so ``appends / fsync_rounds`` is the group-commit
    factor. ``pending`` records are submitted but not yet written.
    """

    appends: int
    rounds: int
    fsync_rounds: int
    fsyncs: int
    largest_round: int
    pending: int
    open_runs: int
    errors: int


class PendingAppend:
    """A submitted record: its seq is fixed; :meth:`wait` returns it once it is durable."""

    __slots__ = (
        "_created_at",
        "_done",
        "_error",
        "_event",
        "_finished",
        "_key",
        "_line",
        "_payload",
        "_record",
        "_run",
        "_seq",
        "_session_seq",
        "_state",
    )

    def __init__(
        self,
        run: _Run,
        event: str,
        payload: msgspec.Raw,
        state: str | None,
        created_at: float,
        key: str | None = None,
        session_seq: int | None = None,
    ) -> None:
        self._run = run
        self._event = event
        self._key = key
        self._session_seq = session_seq
        self._payload = payload
        self._state = state
        self._created_at = created_at
        self._seq: int | None = None
        self._line = b""
        self._record: StoredRecord | None = None
        self._error: BaseException | None = None
        # Made by a waiter that finds the record not yet durable: the records of one batch
        # become durable together, so its waiter, going through them in order, makes one.
        self._done: trio.Event | None = None
        self._finished = False

    @property
    def seq(self) -> int | None:
        """The record's seq; ``None`` only while its run's file is still being opened."""
        return self._seq

    def done(self) -> bool:
        """Whether the record's fate is decided (durable per the policy, or failed)."""
        return self._finished

    async def _wait_done(self) -> None:
        if self._finished:
            await trio.lowlevel.checkpoint()
            return
        if self._done is None:
            self._done = trio.Event()
        await self._done.wait()

    def _set_done(self) -> None:
        self._finished = True
        if self._done is not None:
            self._done.set()

    async def wait(self) -> StoredRecord:
        """Wait until the record is durable per the writer's policy, and return it.

        Raises :class:`JournalIOError` if the disk refused it. Cancelling the wait does not
        withdraw the record: it is still written.
        """
        await self._wait_done()
        if self._error is not None:
            raise self._error
        if self._record is None:
            self._record = decode_json(self._line)
        return self._record

    async def wait_seq(self) -> int:
        """Like :meth:`wait`, but return only the record's seq (nothing is decoded)."""
        await self._wait_done()
        return self._result_seq()

    def _result_seq(self) -> int:
        if self._error is not None:
            raise self._error
        assert self._seq is not None
        return self._seq


class _Run:
    __slots__ = ("cursor", "key", "opened", "pending", "terminal", "waiting")

    def __init__(self, key: _Key) -> None:
        self.key = key
        self.cursor: RunCursor | None = None
        # Set once the file is open (or failed to open) and ``waiting`` has been handed on.
        self.opened = trio.Event()
        # Submitted before the file was open: they get their seqs, in order, once it is.
        self.waiting: list[PendingAppend] = []
        self.pending = 0
        self.terminal = False


class _SyncRequest:
    __slots__ = ("done", "error")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.error: JournalIOError | None = None


def _write_jobs(
    jobs: list[tuple[RunCursor, bytes, bool]],
) -> list[tuple[RunCursor, OSError | None, bool]]:
    # One worker thread's share of a round: append each file's bytes, fsync if asked.
    results: list[tuple[RunCursor, OSError | None, bool]] = []
    for cursor, data, want_sync in jobs:
        try:
            append_bytes(cursor, data)
            if want_sync:
                sync(cursor)
        except OSError as exc:
            results.append((cursor, exc, False))
        else:
            results.append((cursor, None, want_sync))
    return results


def _sync_all(cursors: list[RunCursor]) -> list[tuple[RunCursor, OSError | None]]:
    results: list[tuple[RunCursor, OSError | None]] = []
    for cursor in cursors:
        try:
            sync(cursor)
        except OSError as exc:
            results.append((cursor, exc))
        else:
            results.append((cursor, None))
    return results


def _close_all(cursors: list[RunCursor]) -> int:
    failures = 0
    for cursor in cursors:
        try:
            close(cursor)
        except OSError:
            failures += 1
    return failures


#: Files a round gives each worker thread before it takes another. Parallel fsyncs of a few
#: files save less wall time than each handoff to a thread costs the event loop: at 20
#: sessions streaming 10 deltas/s, rounds of ~4 files over four threads cost the journal 427
#: µs of CPU per delta, over one 303-327 (docs/journal.md, *Group commit*).
FILES_PER_THREAD = 4


def _spread(items: list[Any], ways: int) -> list[list[Any]]:
    # Deal items round-robin into one share per FILES_PER_THREAD items (rounded up), at most
    # ``ways`` shares, one worker thread each.
    ways = max(1, min(ways, -(-len(items) // FILES_PER_THREAD)))
    return [items[index::ways] for index in range(ways)]


class JournalWriter:
    """Appends to a :class:`RunJournal` from trio tasks, with group commit.

    An async context manager that owns its background tasks in a nursery::

        async with JournalWriter(journal) as writer:
            record = await writer.append("session-a", "run-a", "token", {"text": "hi"})

    While it is open it owns the journal's appends (a synchronous
    :meth:`RunJournal.append` raises :class:`WriterAttachedError`), and the runs it holds
    open are safe from retention and deletes. Closing it commits and fsyncs everything
    submitted, even when the block is cancelled.

    Args:
        journal: the journal to append to.
        policy: fsync policy; defaults to the journal's.
        interval: seconds, for the ``interval`` policy; defaults to the journal's.
        window: extra seconds a round waits to gather more records (0: only the records that
            arrive while the previous round is on disk share it).
        fsync_threads: worker threads a round's writes and fsyncs spread over, at most (a
            thread takes :data:`FILES_PER_THREAD` files before another is used).
        max_open_runs: idle run files kept open; finished runs are closed right away.
    """

    def __init__(
        self,
        journal: RunJournal,
        *,
        policy: FsyncPolicy | str | None = None,
        interval: float | None = None,
        window: float = 0.0,
        fsync_threads: int = 8,
        max_open_runs: int = 1024,
    ) -> None:
        interval = journal.interval if interval is None else interval
        if not interval > 0:
            raise ValueError(f"interval must be > 0 seconds; got {interval!r}")
        if not window >= 0:
            raise ValueError(f"window must be >= 0 seconds; got {window!r}")
        if fsync_threads < 1:
            raise ValueError(f"fsync_threads must be >= 1; got {fsync_threads!r}")
        self._journal = journal
        self._policy = journal.policy if policy is None else parse_policy(policy)
        self._interval = float(interval)
        self._window = float(window)
        self._threads = fsync_threads
        self._max_open_runs = max_open_runs
        self._limiter = trio.CapacityLimiter(fsync_threads)
        self._commit_lock = trio.Lock()
        self._kick = trio.Event()
        self._runs: dict[_Key, _Run] = {}
        self._batch: list[PendingAppend] = []
        self._unfinished: set[PendingAppend] = set()
        self._sync_requests: list[_SyncRequest] = []
        # trio time at which unsynced writes first appeared (``interval`` policy).
        self._dirty_since: float | None = None
        self._state = "new"
        self._stack = AsyncExitStack()
        self._nursery: trio.Nursery | None = None
        self._appends = 0
        self._rounds = 0
        self._fsync_rounds = 0
        self._fsyncs = 0
        self._largest_round = 0
        self._errors = 0

    @property
    def policy(self) -> FsyncPolicy:
        """The fsync policy this writer follows."""
        return self._policy

    async def __aenter__(self) -> Self:
        if self._state != "new":
            raise RuntimeError("a JournalWriter can only be entered once")
        self._journal._attach(self)
        try:
            self._nursery = await self._stack.enter_async_context(trio.open_nursery())
        except BaseException:
            self._journal._detach(self)
            raise
        self._nursery.start_soon(self._flusher)
        self._state = "open"
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._state = "closed"
        assert self._nursery is not None
        try:
            with trio.CancelScope(shield=True):
                await self._drain()
        finally:
            self._nursery.cancel_scope.cancel()
            try:
                # A nursery never suppresses an exception, so its answer is always "no".
                await self._stack.__aexit__(exc_type, exc, tb)
            except BaseExceptionGroup as group:
                # The nursery wraps the block's own exception; give the caller it back as is.
                if exc is not None and group.exceptions == (exc,):
                    raise exc from None
                raise
            finally:
                with trio.CancelScope(shield=True):
                    await self._close_runs(list(self._runs.values()))
                self._journal._detach(self)

    def submit(
        self,
        session_id: str,
        run_id: str,
        event: str,
        payload: Any = None,
        *,
        key: str | None = None,
        session_seq: int | None = None,
    ) -> PendingAppend:
        """Queue one record without waiting; its place in the run is fixed by this call.

        Use it to pipeline a stream: submit events as they arrive, wait on them later.
        ``key`` and ``session_seq`` are stored with the record (see
        :meth:`RunJournal.stored`). Bad input raises right here (:class:`InvalidIdError`,
        :class:`InvalidEventError`, :class:`PayloadError`, ``ValueError`` for a bad key or
        session_seq) and nothing is queued;
        :class:`trio.ClosedResourceError` if the writer is not open.
        """
        if self._state != "open":
            raise trio.ClosedResourceError("this JournalWriter is not open")
        run_key = (session_id, run_id)
        # A run already open here was checked by its first record (a delta stream submits
        # thousands to one run).
        if not (type(session_id) is str and type(run_id) is str and run_key in self._runs):
            validate_id(session_id, "session_id")
            validate_id(run_id, "run_id")
        event = validate_event(event)
        key = validate_key(key)
        session_seq = validate_session_seq(session_seq)
        raw = encode_payload(payload)
        state = terminal_state_for(event, payload)
        run = self._runs.get(run_key)
        if run is None:
            run = self._runs[run_key] = _Run(run_key)
            assert self._nursery is not None
            self._nursery.start_soon(self._open_run, run)
        entry = PendingAppend(run, event, raw, state, self._journal.clock(), key, session_seq)
        run.pending += 1
        self._unfinished.add(entry)
        if run.cursor is None:
            run.waiting.append(entry)
        else:
            self._assign(run.cursor, entry)
        return entry

    async def append(
        self,
        session_id: str,
        run_id: str,
        event: str,
        payload: Any = None,
        *,
        key: str | None = None,
        session_seq: int | None = None,
    ) -> StoredRecord:
        """Append one record and return it once it is durable per the policy.

        Under ``every`` that means fsynced; under ``terminal`` and ``interval`` it means
        written to the file (fsynced at the run's terminal record, or within the interval).
        Same errors as :meth:`submit`, plus :class:`JournalIOError` from the disk.
        """
        return await self.submit(
            session_id, run_id, event, payload, key=key, session_seq=session_seq
        ).wait()

    @staticmethod
    async def wait_seqs(entries: list[PendingAppend | int]) -> list[int]:
        """Each entry's :meth:`~PendingAppend.wait_seq` (an int stands for itself), in order,
        with one checkpoint for the lot: awaiting each record of a 5,000-delta append went
        round the scheduler once per record, 4.4 of the 9.6 µs an event cost the journal's
        append path."""
        for entry in entries:
            if not isinstance(entry, int) and not entry.done():
                await entry._wait_done()
        await trio.lowlevel.checkpoint()
        return [entry if isinstance(entry, int) else entry._result_seq() for entry in entries]

    async def flush(self) -> None:
        """Wait until everything submitted so far is written and fsynced, whatever the policy.

        Raises :class:`JournalIOError` if an fsync failed.
        """
        for entry in list(self._unfinished):
            await entry._wait_done()
        request = _SyncRequest()
        self._sync_requests.append(request)
        self._kick.set()
        await request.done.wait()
        if request.error is not None:
            raise request.error

    def statistics(self) -> WriterStatistics:
        """A frozen snapshot of this writer's counters."""
        return WriterStatistics(
            appends=self._appends,
            rounds=self._rounds,
            fsync_rounds=self._fsync_rounds,
            fsyncs=self._fsyncs,
            largest_round=self._largest_round,
            pending=len(self._unfinished),
            open_runs=len(self._runs),
            errors=self._errors,
        )

    # -- submission ------------------------------------------------------------------------

    def _assign(self, cursor: RunCursor, entry: PendingAppend) -> None:
        session_id, run_id = entry._run.key
        entry._seq = cursor.next_seq
        entry._line = encode_record(
            session_id=session_id,
            run_id=run_id,
            seq=cursor.next_seq,
            event=entry._event,
            payload=entry._payload,
            terminal_state=entry._state,
            created_at=entry._created_at,
            key=entry._key,
            session_seq=entry._session_seq,
        )
        cursor.next_seq += 1
        self._batch.append(entry)
        self._kick.set()

    async def _open_run(self, run: _Run) -> None:
        # Shielded from its first step: records already submitted to this run must get
        # their seqs and be committed even if the writer is being cancelled.
        try:
            with trio.CancelScope(shield=True):
                cursor = await trio.to_thread.run_sync(
                    self._journal._open_for_writer, run.key, limiter=self._limiter
                )
        except OSError as exc:
            if self._runs.get(run.key) is run:
                del self._runs[run.key]
            self._errors += 1
            self._fail(run.waiting, f"could not open run {run.key}: {exc}", exc)
        else:
            run.cursor = cursor
            for entry in run.waiting:
                self._assign(cursor, entry)
        finally:
            run.waiting.clear()
            run.opened.set()

    def _finish(self, entry: PendingAppend, error: BaseException | None = None) -> None:
        entry._error = error
        entry._run.pending -= 1
        self._unfinished.discard(entry)
        entry._set_done()

    def _fail(self, entries: list[PendingAppend], message: str, cause: OSError) -> None:
        # One exception object per waiter: a shared one would grow a traceback per raise.
        for entry in entries:
            error = JournalIOError(message)
            error.__cause__ = cause
            self._finish(entry, error)

    # -- committing ------------------------------------------------------------------------

    async def _flusher(self) -> None:
        while True:
            while not (self._batch or self._sync_requests or self._interval_due()):
                self._kick = trio.Event()
                with trio.move_on_at(self._interval_deadline()):
                    await self._kick.wait()
            if self._window and self._batch:
                await trio.sleep(self._window)
            async with self._commit_lock:
                await self._round()

    def _interval_deadline(self) -> float:
        if self._policy is not FsyncPolicy.INTERVAL or self._dirty_since is None:
            return math.inf
        return self._dirty_since + self._interval

    def _interval_due(self) -> bool:
        return trio.current_time() >= self._interval_deadline()

    async def _round(self) -> None:
        # Callers hold the commit lock: one round at a time keeps each file's writes in seq
        # order. Shielded: once a batch is taken off the queue it is written, full stop.
        with trio.CancelScope(shield=True):
            batch, self._batch = self._batch, []
            requests, self._sync_requests = self._sync_requests, []
            if batch:
                await self._commit(batch)
            if requests or self._interval_due():
                error = await self._sync_dirty()
                for request in requests:
                    request.error = error
                    request.done.set()
            await self._release_idle()

    async def _commit(self, batch: list[PendingAppend]) -> None:
        groups: dict[RunCursor, list[PendingAppend]] = {}
        for entry in batch:
            cursor = entry._run.cursor
            assert cursor is not None
            groups.setdefault(cursor, []).append(entry)
        jobs = [
            (cursor, b"".join(entry._line for entry in entries), self._wants_sync(entries))
            for cursor, entries in groups.items()
        ]
        results: list[tuple[RunCursor, OSError | None, bool]] = []

        async def run_share(share: list[tuple[RunCursor, bytes, bool]]) -> None:
            results.extend(await trio.to_thread.run_sync(_write_jobs, share, limiter=self._limiter))

        async with trio.open_nursery() as nursery:
            for share in _spread(jobs, self._threads):
                nursery.start_soon(run_share, share)

        synced = 0
        for cursor, error, did_sync in results:
            entries = groups[cursor]
            if error is not None:
                self._fail_run(entries[0]._run, entries, error)
                continue
            synced += did_sync
            self._appends += len(entries)
            for entry in entries:
                entry._run.terminal = entry._run.terminal or entry._state is not None
                self._finish(entry)
        self._rounds += 1
        self._fsyncs += synced
        self._fsync_rounds += synced > 0
        self._largest_round = max(self._largest_round, len(batch))
        if self._dirty_since is None and any(cursor.dirty for cursor in groups):
            self._dirty_since = trio.current_time()

    def _wants_sync(self, entries: list[PendingAppend]) -> bool:
        if self._policy is FsyncPolicy.EVERY:
            return True
        if self._policy is FsyncPolicy.TERMINAL:
            return any(entry._state is not None for entry in entries)
        return False

    def _fail_run(self, run: _Run, entries: list[PendingAppend], exc: OSError) -> None:
        # The file refused this round. Records queued behind it already hold later seqs;
        # fail them too and forget the cursor, so the next append reopens the file and
        # continues from what is really on disk: no gap, no duplicate.
        self._errors += 1
        later = [entry for entry in self._batch if entry._run is run]
        self._batch = [entry for entry in self._batch if entry._run is not run]
        self._fail(entries + later, f"could not append to run {run.key}: {exc}", exc)
        if self._runs.get(run.key) is run:
            del self._runs[run.key]
        self._journal._release_for_writer(run.key)
        if run.cursor is not None:
            # Just close: its unsynced bytes are suspect anyway, and a sync would block here.
            with contextlib.suppress(OSError):
                os.close(run.cursor.fd)
            run.cursor = None

    async def _sync_dirty(self) -> JournalIOError | None:
        cursors = [
            run.cursor for run in self._runs.values() if run.cursor is not None and run.cursor.dirty
        ]
        self._dirty_since = None
        results: list[tuple[RunCursor, OSError | None]] = []

        async def run_share(share: list[RunCursor]) -> None:
            results.extend(await trio.to_thread.run_sync(_sync_all, share, limiter=self._limiter))

        async with trio.open_nursery() as nursery:
            for share in _spread(cursors, self._threads):
                nursery.start_soon(run_share, share)
        failures = [(cursor, exc) for cursor, exc in results if exc is not None]
        self._fsyncs += len(results) - len(failures)
        self._fsync_rounds += len(results) > len(failures)
        self._errors += len(failures)
        if failures:
            cursor, exc = failures[0]
            return JournalIOError(f"could not fsync {cursor.path}: {exc}")
        return None

    async def _release_idle(self) -> None:
        # Finished runs are closed at once (so retention may compact them); past
        # max_open_runs, the oldest idle runs are closed too.
        idle = [run for run in self._runs.values() if run.cursor is not None and not run.pending]
        excess = len(self._runs) - self._max_open_runs
        release = [run for run in idle if run.terminal]
        release += [run for run in idle if not run.terminal][: max(0, excess - len(release))]
        await self._close_runs(release)

    async def _close_runs(self, runs: list[_Run]) -> None:
        cursors = []
        for run in runs:
            if self._runs.get(run.key) is run:
                del self._runs[run.key]
            self._journal._release_for_writer(run.key)
            if run.cursor is not None:
                cursors.append(run.cursor)
                run.cursor = None
        if cursors:
            self._errors += await trio.to_thread.run_sync(
                _close_all, cursors, limiter=self._limiter
            )

    async def _drain(self) -> None:
        # Commit everything submitted, then fsync whatever a lax policy left unsynced. The
        # flusher may already be gone (cancelled), so this commits by itself; an unfinished
        # record is either waiting for its run to open, queued, or in the flusher's round
        # (which the commit lock waits out).
        while self._unfinished:
            opening = [run for run in self._runs.values() if run.waiting]
            if opening:
                await opening[0].opened.wait()
                continue
            async with self._commit_lock:
                await self._round()
        async with self._commit_lock:
            await self._sync_dirty()
