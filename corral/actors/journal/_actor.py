"""The journal actor: the durable run journal on the bus (BEHAVIOURS.md J-01..J-19, J-32).

What it handles and answers is the table in :mod:`corral.actors.journal.messages`.

Ordering (J-32). Handlers run one at a time in arrival order, and each event is handed to the
:class:`~corral.journal.JournalWriter` with ``submit()``, which fixes its seq synchronously.
So a run's events land in the order their messages arrived, while the handler never waits
for a disk: the reply (and, for a durable message, the ack) is sent from a task once the
records are durable, and every append waiting at that moment shares one fsync round.

Arrival order is send order within one durability class. Across classes it is not: a durable
message is fsynced by the broker before it is delivered, so a stream append sent after it can
overtake it. A sender that mixes the classes on one run names, in each stream append's
``after``, the id of the last durable append it sent to that run (``await peer.cast(...,
durable=True)`` returns it); the actor holds that stream append (and whatever arrives behind
it for the run) until the durable one is applied, or gives up after ``hold_timeout_s``.

Idempotency. A durable message is delivered at least once: the actor may crash after storing
its records but before its ack reaches the broker. So each record of a durable append carries
the key ``"<message id>/<index>"`` (``"<message id>#<append>/<index>"`` for the appends of a
:class:`~corral.actors.journal.messages.JournalAppends`) in the same line, fsynced together
with the record; the first durable append to a run after a (re)start reads the run's stored
keys, and events whose key is already there are skipped (and reported in ``duplicates``), so
a redelivery never appends twice, and a batch torn by a crash is completed rather than
repeated. Stream appends carry no key: they may be lost, never duplicated by the actor.

Replays. An event may carry its ``session_seq`` (its seq in the session's stream; dispatch
numbers a turn's worker events so that a replay after a restart keeps it). The actor keeps
the highest one each run holds (``_RunState.top``, read from the run's file at its first
append after a (re)start, where it is fsynced with its record) and drops an event at or
below it: what dispatch or a worker sends again after a crash is stored once, whichever
class it comes in, as the gateway drops a ``seq`` it has seen.

Options (``[actors.journal] options = {...}`` in corral.toml): see :class:`JournalOptions`.
"""

from __future__ import annotations

import contextlib
import logging
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal

import msgspec
import trio

from ..._exceptions import ConfigError
from ...bus import ErrorReply, Incoming, Message
from ...config import NonNegative, Positive, PositiveInt
from ...instance import Instance
from ...journal import (
    InvalidCursorError,
    InvalidEventError,
    InvalidIdError,
    JournalIOError,
    JournalWriter,
    PayloadError,
    PendingAppend,
    RunJournal,
)
from .._actor import Actor, ActorContext, handles
from .._deferred import Deferred
from ._payloads import encoded_json_problem, json_problem, payload_of
from .messages import (
    JournalAppend,
    JournalAppended,
    JournalAppends,
    JournalList,
    JournalListReply,
    JournalRead,
    JournalReadReply,
    JournalSnapshot,
    JournalSnapshotReply,
    JournalSummary,
    JournalSummaryReply,
)

log = logging.getLogger("corral.actors.journal")

# --- options ---------------------------------------------------------------------------------


class JournalOptions(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """The journal actor's options, from ``[actors.journal] options`` in corral.toml."""

    #: When a record is forced to disk: ``every`` (before the reply), ``terminal``, ``interval``.
    fsync: Literal["every", "terminal", "interval"] = "every"
    #: Seconds a record may stay unsynced under the ``interval`` policy.
    interval_s: Positive = 1.0
    #: Extra milliseconds a group-commit round waits to gather more appends.
    window_ms: NonNegative = 0.0
    #: Worker threads a round's writes and fsyncs spread over, at most (four files a thread).
    fsync_threads: PositiveInt = 8
    #: Idle run files kept open by the writer.
    max_open_runs: PositiveInt = 1024
    #: Events submitted but not yet durable, at most; past it the actor stops taking messages
    #: (its inbox fills and senders slow down) until the disk catches up.
    max_pending_events: PositiveInt = 100_000
    #: How long a stream append waits for the durable append it names in ``after``.
    hold_timeout_s: Positive = 5.0
    #: Stream appends held at once, at most; past it the oldest wait is given up.
    max_held: PositiveInt = 10_000
    #: Durable message ids remembered per run (redeliveries concern the last few hundred).
    remember_ids: Annotated[int, msgspec.Meta(ge=256)] = 1024
    #: Runs whose ids are kept in memory; idle ones beyond this are forgotten (and re-read
    #: from their file if they are appended to again).
    max_tracked_runs: PositiveInt = 4096
    #: Threads for reads, summaries and snapshots.
    read_threads: PositiveInt = 4


# --- the actor -------------------------------------------------------------------------------

_Key = tuple[str, str]
# What is known of one event of a durable message: its stored seq, or its pending append.
_Stored = int | PendingAppend
# What is known of a durable message's events, by index: while it is applied, a dict (seqs
# and pending appends); once complete, its seqs as compactly as they fit (:func:`_compact`).
_Known = dict[int, _Stored] | Sequence[int]


def _known_at(known: _Known, index: int) -> _Stored | None:
    if isinstance(known, dict):
        return known.get(index)
    return known[index] if index < len(known) else None


def _compact(seqs: list[int]) -> Sequence[int]:
    """A complete message's seqs in as little memory as they fit: a range when consecutive,
    as a message's new events are (48 bytes however many), else an array (8 bytes each; a
    replayed event's 0 among them). A dict of them took ~80 bytes an event, and the actor
    keeps them for the last ``remember_ids`` messages of up to ``max_tracked_runs`` runs:
    ~8 MB for one 100,000-event run."""
    if seqs and seqs == list(range(seqs[0], seqs[0] + len(seqs))):
        return range(seqs[0], seqs[0] + len(seqs))
    return array("q", seqs)


class _Resolution:
    """A delivered message whose appends are being written: acked once the last of them is
    durable, or nacked (so redelivered) if one failed."""

    __slots__ = ("deferred", "error", "left")

    def __init__(self, deferred: Deferred, appends: int) -> None:
        self.deferred = deferred
        self.left = appends
        self.error: str | None = None

    @property
    def incoming(self) -> Incoming:
        return self.deferred.incoming

    async def one_done(self, error: str | None) -> None:
        """One of the message's appends is durable, or failed with ``error``."""
        self.error = self.error or error
        self.left -= 1
        if self.left:
            return
        if self.error is None:
            self.deferred.ack()
        else:
            await self.deferred.nack(self.error)


class _Held:
    __slots__ = ("deadline", "done", "msg")

    def __init__(self, msg: JournalAppend, done: _Resolution, deadline: float) -> None:
        self.msg = msg
        self.done = done
        self.deadline = deadline


class _RunState:
    """What the actor tracks of one run: applied durable ids, held appends, the last write."""

    __slots__ = ("applied", "held", "key", "last", "loaded", "pending", "timer", "top")

    def __init__(self, key: _Key) -> None:
        self.key = key
        # Durable message id -> event index -> what is known of it. Also holds the ids a
        # held append gave up waiting for (empty dicts), so that they count as applied.
        self.applied: OrderedDict[str, _Known] = OrderedDict()
        # Whether the keys and the top session_seq stored in the run's file were merged into
        # ``applied`` and ``top``.
        self.loaded = False
        # The highest session_seq the run holds or was submitted: an event at or below it is
        # a replay.
        self.top = 0
        self.held: deque[_Held] = deque()
        self.timer = False
        # Append messages submitted and not yet complete (the state must outlive them).
        self.pending = 0
        self.last: PendingAppend | None = None

    def idle(self) -> bool:
        return not (self.pending or self.held or self.timer)


class JournalActor(Actor):
    """Owns the run journal under ``<state_dir>/journal`` and serves it on the bus."""

    def __init__(self, ctx: ActorContext, peer: Any) -> None:
        super().__init__(ctx, peer)
        try:
            self.options = msgspec.convert(ctx.options, JournalOptions)
        except msgspec.ValidationError as exc:
            raise ConfigError(
                f"invalid config: actors.{ctx.name}.options: {exc}", key=f"actors.{ctx.name}"
            ) from None
        self.journal = RunJournal(
            Instance(ctx.state_dir).journal_dir,
            fsync=self.options.fsync,
            interval=self.options.interval_s,
        )
        self.writer: JournalWriter | None = None
        self._runs: OrderedDict[_Key, _RunState] = OrderedDict()
        self._read_limiter = trio.CapacityLimiter(self.options.read_threads)
        self._pending_events = 0
        self._drained = trio.Event()
        self._held = 0
        self.stats = {
            "append_messages": 0,
            "events": 0,
            "duplicates": 0,
            "replayed": 0,
            "held_total": 0,
            "hold_timeouts": 0,
            "queries": 0,
            "rejected": 0,
            "io_errors": 0,
        }

    # --- lifecycle ---------------------------------------------------------------------------

    async def setup(self) -> None:
        assert self.nursery is not None
        self.writer = await self.nursery.start(self._run_writer)
        log.info(
            "journal at %s (fsync=%s, window=%sms)",
            self.journal.root,
            self.options.fsync,
            self.options.window_ms,
        )

    async def _run_writer(self, *, task_status: trio.TaskStatus[JournalWriter]) -> None:
        # The writer lives in the actor's nursery: when the actor stops (or is cancelled)
        # it commits and fsyncs everything submitted before it closes. Messages whose
        # completion task was cancelled are not acked; their redelivery finds the records.
        async with JournalWriter(
            self.journal,
            window=self.options.window_ms / 1000,
            fsync_threads=self.options.fsync_threads,
            max_open_runs=self.options.max_open_runs,
        ) as writer:
            task_status.started(writer)
            await trio.sleep_forever()

    def snapshot(self) -> dict[str, Any]:
        writer = self.writer.statistics() if self.writer is not None else None
        return {
            **super().snapshot(),
            **self.stats,
            "policy": self.options.fsync,
            "appends": writer.appends if writer else 0,
            "fsync_rounds": writer.fsync_rounds if writer else 0,
            "open_runs": writer.open_runs if writer else 0,
            "pending_events": self._pending_events,
            "held": self._held,
            "tracked_runs": len(self._runs),
            "writer": msgspec.structs.asdict(writer) if writer else None,
        }

    # --- appends -----------------------------------------------------------------------------

    @handles(JournalAppend)
    async def append(self, msg: JournalAppend, incoming: Incoming) -> Message | None:
        problem = self._check_append(msg)
        if problem is not None:
            self.stats["rejected"] += 1
            return problem
        self.stats["append_messages"] += 1
        durable = incoming.env.durability == "durable"
        state = self._state((msg.session_id, msg.run_id))
        await self._admit([state], load=durable or msg.after is not None or _numbered(msg))
        # Keys read just now may be what a held append was waiting for.
        self._release(state)
        done = _Resolution(self.defer(incoming), 1)
        if durable:
            self._apply(state, msg, done, incoming.env.id)
            self._release(state)
        elif state.held or not self._ready(state, msg.after):
            self._hold(state, msg, done)
        else:
            self._apply(state, msg, done, None)
        return None

    @handles(JournalAppends)
    async def append_many(self, msg: JournalAppends, incoming: Incoming) -> None:
        valid: list[tuple[str | None, JournalAppend]] = []
        durable = incoming.env.durability == "durable"
        for index, append in enumerate(msg.appends):
            problem = self._check_append(append)
            if problem is None:
                valid.append((f"{incoming.env.id}#{index}" if durable else None, append))
                continue
            self.stats["rejected"] += 1
            log.warning(
                "%s/%s: append %d of %s refused: %s: %s",
                append.session_id,
                append.run_id,
                index,
                incoming.env.id,
                problem.code,
                problem.message,
            )
        self.stats["append_messages"] += 1
        if not valid:
            return
        states = [self._state((append.session_id, append.run_id)) for _, append in valid]
        await self._admit(states, load=True)
        done = _Resolution(self.defer(incoming), len(valid))
        for state, (mid, append) in zip(states, valid, strict=True):
            self._release(state)
            self._apply(state, append, done, mid)
            self._release(state)

    async def _admit(self, states: list[_RunState], *, load: bool) -> None:
        """Before appends to ``states``: read what their files hold (if ``load``), and wait
        while too many events are not yet durable."""
        # Pinned while this awaits, so that none is forgotten meanwhile.
        for state in states:
            state.pending += 1
        try:
            if load:
                for state in states:
                    await self._load(state)
            while self._pending_events >= self.options.max_pending_events:
                self._drained = trio.Event()
                await self._drained.wait()
        finally:
            for state in states:
                state.pending -= 1

    def _check_append(self, msg: JournalAppend) -> ErrorReply | None:
        # The whole batch is checked before any of it is submitted: all or nothing.
        try:
            self.journal.path(msg.session_id, msg.run_id)
        except InvalidIdError as exc:
            return ErrorReply(code="invalid_id", message=str(exc))
        if not msg.events:
            return ErrorReply(code="invalid_argument", message="an append needs at least 1 event")
        for index, item in enumerate(msg.events):
            if not item.event.strip():
                return ErrorReply(
                    code="invalid_event",
                    message=f"events[{index}].event must be a non-empty name",
                )
            if item.payload_json is None:
                problem = json_problem(item.payload, 0)
            else:
                problem = encoded_json_problem(item.payload_json)
            if problem is not None:
                return ErrorReply(
                    code="invalid_payload",
                    message=f"events[{index}].payload {problem}; payloads must be JSON values",
                )
        return None

    def _apply(
        self, state: _RunState, msg: JournalAppend, done: _Resolution, mid: str | None
    ) -> None:
        """Submit ``msg``'s events; ``mid``, for a durable append, keys them (redeliveries)."""
        # Synchronous from the first submit to the last: nothing can slip in between, so the
        # batch gets consecutive seqs in the order of arrival.
        assert self.writer is not None and self.nursery is not None
        known = state.applied.get(mid, {}) if mid is not None else {}
        entries: list[_Stored] = []
        submitted = replayed = 0
        for index, item in enumerate(msg.events):
            stored = _known_at(known, index)
            if stored is not None:
                entries.append(stored)
                continue
            if item.session_seq is not None and item.session_seq <= state.top:
                entries.append(0)  # sent again after a restart: the run has it (or later)
                replayed += 1
                continue
            key = f"{mid}/{index}" if mid is not None else None
            pending = self.writer.submit(
                msg.session_id,
                msg.run_id,
                item.event,
                payload_of(item),
                key=key,
                session_seq=item.session_seq,
            )
            if item.session_seq is not None:
                state.top = item.session_seq
            entries.append(pending)
            state.last = pending
            submitted += 1
        duplicates = len(entries) - submitted
        if mid is not None:
            state.applied[mid] = dict(enumerate(entries))
            state.applied.move_to_end(mid)
            while len(state.applied) > self.options.remember_ids:
                state.applied.popitem(last=False)
        self.stats["events"] += submitted
        self.stats["duplicates"] += duplicates - replayed
        self.stats["replayed"] += replayed
        if replayed:
            log.info(
                "%s: %d of %d events at or below session_seq %d, already stored (a replay)",
                msg.run_id,
                replayed,
                len(entries),
                state.top,
            )
        if duplicates > replayed:
            log.info(
                "%s: %d of %d events already stored for %s (redelivery)",
                msg.run_id,
                duplicates - replayed,
                len(entries),
                mid,
            )
        state.pending += 1
        self._pending_events += submitted
        self.nursery.start_soon(self._complete, state, msg, done, mid, entries, submitted)

    async def _complete(
        self,
        state: _RunState,
        msg: JournalAppend,
        done: _Resolution,
        mid: str | None,
        entries: list[_Stored],
        submitted: int,
    ) -> None:
        try:
            seqs = await JournalWriter.wait_seqs(entries)
        except JournalIOError as exc:
            self.stats["io_errors"] += 1
            if mid is not None or _numbered(msg):
                # The file, not memory, says what got stored: re-read it on the retry (the
                # failed records, and those queued behind them, were cut back).
                if mid is not None:
                    state.applied.pop(mid, None)
                state.loaded = False
                state.top = 0
            log.error("%s/%s: append failed: %s", msg.session_id, msg.run_id, exc)
            await self._answer(done.incoming, ErrorReply(code="io_error", message=str(exc)))
            await done.one_done(f"JournalIOError: {exc}")
            return
        finally:
            state.pending -= 1
            self._pending_events -= submitted
            if self._pending_events < self.options.max_pending_events:
                self._drained.set()
        if mid is not None and mid in state.applied:
            # Its seqs are all a redelivery needs: the records themselves (each line and
            # payload) go, rather than stay for the last ``remember_ids`` messages of the run.
            state.applied[mid] = _compact(seqs)
        await done.one_done(None)
        duplicates = len(entries) - submitted
        await self._answer(
            done.incoming,
            JournalAppended(
                session_id=msg.session_id, run_id=msg.run_id, seqs=seqs, duplicates=duplicates
            ),
        )

    async def _load(self, state: _RunState) -> None:
        """Merge the idempotency keys and the top session_seq stored in the run's file into
        ``state.applied`` and ``state.top`` (a run new to the file costs one failed open)."""
        if state.loaded:
            return
        stored = await trio.to_thread.run_sync(
            self.journal.stored, *state.key, limiter=self._read_limiter
        )
        state.top = max(state.top, stored.session_seq)
        for key, seq in stored.keys.items():
            mid, _, index = key.rpartition("/")
            known = state.applied.setdefault(mid, {}) if mid and index.isdigit() else None
            if isinstance(known, dict):  # else complete here: memory and file agree
                known.setdefault(int(index), seq)
        while len(state.applied) > self.options.remember_ids:
            state.applied.popitem(last=False)
        state.loaded = True

    # --- holding stream appends for the durable one they follow ------------------------------

    @staticmethod
    def _ready(state: _RunState, after: str | None) -> bool:
        return after is None or after in state.applied

    def _hold(self, state: _RunState, msg: JournalAppend, done: _Resolution) -> None:
        assert self.nursery is not None
        deadline = trio.current_time() + self.options.hold_timeout_s
        state.held.append(_Held(msg, done, deadline))
        self._held += 1
        self.stats["held_total"] += 1
        if not state.timer:
            state.timer = True
            self.nursery.start_soon(self._hold_timer, state)
        if self._held > self.options.max_held:
            self._give_up(state, "too many held appends")

    def _release(self, state: _RunState) -> None:
        while state.held and self._ready(state, state.held[0].msg.after):
            held = state.held.popleft()
            self._held -= 1
            self._apply(state, held.msg, held.done, None)

    def _give_up(self, state: _RunState, why: str) -> None:
        after = state.held[0].msg.after
        if after is None:
            self._release(state)
            return
        log.warning(
            "%s/%s: stopped waiting for durable append %s (%s); appending what followed it",
            *state.key,
            after,
            why,
        )
        self.stats["hold_timeouts"] += 1
        # Count it as applied from now on: if it does turn up, it is appended then.
        state.applied[after] = {}
        self._release(state)

    async def _hold_timer(self, state: _RunState) -> None:
        try:
            while state.held:
                await trio.sleep_until(state.held[0].deadline)
                if state.held and state.held[0].deadline <= trio.current_time():
                    self._give_up(state, f"not applied within {self.options.hold_timeout_s}s")
        finally:
            state.timer = False

    # --- queries -----------------------------------------------------------------------------

    @handles(JournalRead)
    async def read(self, msg: JournalRead, incoming: Incoming) -> None:
        # Over the bus the reply must fit in one message: cap the bytes, the client pages.
        cap = self.peer.bus.max_message_bytes // 2
        max_bytes = cap if msg.max_bytes is None else min(msg.max_bytes, cap)

        def run() -> Message:
            result = self.journal.read(
                msg.session_id,
                msg.run_id,
                after_seq=msg.after,
                limit=msg.limit,
                max_bytes=max_bytes,
                strict=msg.strict,
            )
            return JournalReadReply(result=result)

        self._query(incoming, run, self._waits_for(msg.session_id, msg.run_id))

    @handles(JournalSummary)
    async def summary(self, msg: JournalSummary, incoming: Incoming) -> None:
        def run() -> Message:
            return JournalSummaryReply(summary=self.journal.summary(msg.session_id, msg.run_id))

        self._query(incoming, run, self._waits_for(msg.session_id, msg.run_id))

    @handles(JournalSnapshot)
    async def snapshot_query(self, msg: JournalSnapshot, incoming: Incoming) -> None:
        def run() -> Message:
            snapshot = self.journal.snapshot(msg.run_id)
            payload = None if snapshot is None else self.journal.session_payload(snapshot)
            return JournalSnapshotReply(snapshot=snapshot, session_payload=payload)

        waits = [state.last for key, state in self._runs.items() if key[1] == msg.run_id]
        self._query(incoming, run, [pending for pending in waits if pending is not None])

    @handles(JournalList)
    async def list_query(self, msg: JournalList, incoming: Incoming) -> None:
        self._query(
            incoming, lambda: JournalListReply(listing=self.journal.listing(msg.session_id))
        )

    def _waits_for(self, session_id: str, run_id: str) -> list[PendingAppend]:
        state = self._runs.get((session_id, run_id))
        return [state.last] if state is not None and state.last is not None else []

    def _query(
        self,
        incoming: Incoming,
        run: Callable[[], Message],
        waits: list[PendingAppend] | None = None,
    ) -> None:
        """Answer a query from a task: after the run's appends so far are written, read
        the files in a thread. Queries never hold up the appends queued behind them."""
        assert self.nursery is not None
        if not incoming.env.wants_reply:
            return
        self.stats["queries"] += 1
        self.nursery.start_soon(self._run_query, incoming, run, waits or [])

    async def _run_query(
        self, incoming: Incoming, run: Callable[[], Message], waits: list[PendingAppend]
    ) -> None:
        for pending in waits:
            # Read your writes: what was submitted before the query is in the file.
            with contextlib.suppress(JournalIOError):
                await pending.wait_seq()
        try:
            reply = await trio.to_thread.run_sync(run, limiter=self._read_limiter)
        except (ValueError, OSError) as exc:
            reply = _error_reply(exc)
        except Exception:
            log.exception("query %s failed", incoming)
            reply = ErrorReply(code="handler_error", message="the journal failed to answer")
        await self._answer(incoming, reply)

    # --- helpers -----------------------------------------------------------------------------

    async def _answer(self, incoming: Incoming, reply: Message) -> None:
        try:
            await self.peer.reply(incoming, reply)
        except Exception as exc:  # a reply too large, or the bus closing under us
            log.warning("could not answer %s: %s", incoming, exc)
            if not isinstance(reply, ErrorReply):
                code = getattr(exc, "code", "handler_error")
                with contextlib.suppress(Exception):
                    await self.peer.reply(incoming, ErrorReply(code=code, message=str(exc)))

    def _state(self, key: _Key) -> _RunState:
        state = self._runs.get(key)
        if state is not None:
            self._runs.move_to_end(key)
            return state
        state = self._runs[key] = _RunState(key)
        if len(self._runs) > self.options.max_tracked_runs:
            excess = len(self._runs) - self.options.max_tracked_runs
            idle = [k for k, s in self._runs.items() if s.idle() and k != key][:excess]
            for old in idle:
                del self._runs[old]
        return state


def _numbered(msg: JournalAppend) -> bool:
    """Whether an append carries session_seqs (so the run's top must be known first)."""
    return any(item.session_seq is not None for item in msg.events)


def _error_reply(exc: BaseException) -> ErrorReply:
    """The typed error answering a query or append that the journal refused."""
    codes: list[tuple[type[BaseException], str]] = [
        (InvalidIdError, "invalid_id"),
        (InvalidEventError, "invalid_event"),
        (PayloadError, "invalid_payload"),
        (InvalidCursorError, "invalid_cursor"),
        (JournalIOError, "io_error"),
        (OSError, "io_error"),
        (ValueError, "invalid_argument"),
    ]
    code = next(code for cls, code in codes if isinstance(exc, cls))
    return ErrorReply(code=code, message=str(exc))
