"""Event fan-out: every published session event to the subscribers, the journal and a
streaming caller, in publish order, without a handler ever waiting on a peer.

* **Subscribers** (the gateway): durably, in :class:`~corral.actors.gateway.messages.SessionEvents`
  batches, so events published while the gateway restarts wait in its mailbox. While one round
  waits for its group commit, what is published meanwhile gathers and goes next (one commit,
  ack and buffer write per message); a round's messages are all in flight at once (the broker
  keeps their order), since one round trip per message would cap the rate.
* **The journal**: one run per turn. Events gather for :data:`_JOURNAL_WINDOW_S` and go as one
  stream append per run; a run's last append (its terminal edge) skips the window and goes
  durably, after every earlier one. Each event carries its ``seq``
  (``JournalEvent.session_seq``): the journal drops one at or below what the run holds.
* **A ``?stream=true`` caller**: SSE :class:`~corral.routes.HttpChunk` frames through the
  outbox, closed by an empty ``end`` chunk; a worker event's frame carries its ``seq``, and
  the gateway drops one it has relayed (a replay after a restart).

Saved before sent: while a session is held (:meth:`Fanout.held`, around the save that starts
or ends a turn) its events wait, so its ``running``, terminal event and edge leave only once
the record holding them is on disk; a tracked event is reported to ``on_delivered`` once every
receiver has it, and :meth:`Fanout.republish` sends what a previous incarnation saved again,
with its own ``seq``. :meth:`Fanout.publish` only queues (a handler awaiting a peer that is
not reading would stall what drains it); ``run_events`` and ``run_journal`` send.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import msgspec
import trio

from ..._jsonlines import JsonObject
from ...bus import Outbox, Peer, tag_of
from ...harnesses.protocol import Output
from ...routes import HttpChunk, sse_frame
from ..gateway.messages import SessionEvent, SessionEvents
from ..journal import JournalAppend, JournalEvent
from ._session import PendingEvent, SessionRecord

log = logging.getLogger("corral.actors.dispatch")

#: Session events per durable :class:`~corral.actors.gateway.messages.SessionEvents`
#: message, and about how many bytes of them (well under the bus's default 4 MiB message limit).
_EVENT_BATCH = 512
_EVENT_BATCH_BYTES = 1024 * 1024
#: How long journal events gather before they go out as one append per run: a flood of
#: deltas otherwise costs one append (a bus message, a journal write) per delta.
_JOURNAL_WINDOW_S = 0.02


@dataclass(slots=True, kw_only=True)
class _Queued:
    """A numbered event on its way to the queues (waiting while its session is held)."""

    session_id: str
    seq: int
    event: JsonObject | Output
    runner_id: str | None
    run: str | None
    terminal: bool = False
    origin_at: float = 0.0
    upstream: bool = True
    track: bool = False
    #: A worker event's sequence number in its turn (reported to ``on_sent``).
    k: int | None = None


class Fanout:
    """The publishing side of dispatch: queues per subscriber and per journal run."""

    def __init__(self, peer: Peer, *, subscribers: list[str], journal: str | None) -> None:
        self.peer = peer
        self.outbox = Outbox(peer)
        self.subscribers = subscribers
        self.journal = journal
        self._journal: dict[tuple[str, str], list[JournalEvent]] = {}
        #: Runs' last appends, oldest first, for the journal loop to send durably, each with
        #: the (session, seq) of its last event.
        self._journal_final: list[tuple[JournalAppend, tuple[str, int]]] = []
        self._events: dict[str, list[SessionEvent]] = {}
        self._events_ready = trio.Event()
        self._journal_ready = trio.Event()
        #: Holds per session (:meth:`held`), and the events published while held.
        self._holds: dict[str, int] = {}
        self._waiting: dict[str, list[_Queued]] = {}
        #: Tracked events: how many receivers do not have each yet.
        self._receivers: dict[tuple[str, int], int] = {}
        #: Told ``(session_id, seq)`` of a tracked event once every receiver has it.
        self.on_delivered: Callable[[str, int], None] | None = None
        #: Told ``(session_id, k)`` once every subscriber has the session's worker events up
        #: to sequence number ``k`` (one call per session and round): the worker forgets them.
        self.on_sent: Callable[[str, int], None] | None = None
        #: The worker sequence number of each queued worker event, by (session, seq).
        self._worker_k: dict[tuple[str, int], int] = {}
        #: Batches of subscriber events queued and sent so far (:meth:`sent`).
        self._queued_n = self._sent_n = 0
        self._sent_more = trio.Event()

    def start(self, nursery: trio.Nursery) -> None:
        """Run the outbox and both sending loops in ``nursery``."""
        nursery.start_soon(self.outbox.run)
        nursery.start_soon(self.run_journal)
        nursery.start_soon(self.run_events)

    def publish(
        self,
        record: SessionRecord,
        event: JsonObject | Output,
        *,
        run_id: str | None = None,
        terminal: bool = False,
        origin_at: float = 0.0,
        upstream: bool = True,
        track: bool = False,
        seq: int | None = None,
        k: int | None = None,
    ) -> int:
        """Number ``event`` in the session's stream (the next ``seq``, or ``seq``: a turn's
        worker event, numbered by its turn) and queue it for the subscribers (unless not
        ``upstream``) and the journal run ``run_id`` (the active turn's by default);
        ``terminal`` marks the run's last event; with ``track``, ``on_delivered`` hears when
        every receiver has it; ``k``, a worker event's own number, goes to ``on_sent`` once
        every subscriber has it. Its ``seq``.

        While the session is held (:meth:`held`) the event waits, in order, until the hold
        ends: what is saved before it is sent is never sent before it is saved."""
        if seq is None:
            record.seq += 1
            seq = record.seq
        else:
            # A worker event: one sent again after a restart may be below what the runner
            # numbered since (the gateway has it, or it is new to the gateway and in order).
            record.seq = max(record.seq, seq)
        self._queue(
            _Queued(
                session_id=record.id,
                seq=seq,
                event=event,
                runner_id=record.runner_id,
                run=run_id or record.turn_id,
                terminal=terminal,
                origin_at=origin_at,
                upstream=upstream,
                track=track,
                k=k,
            )
        )
        return seq

    def republish(self, record: SessionRecord, pending: list[PendingEvent]) -> None:
        """Queue events a previous incarnation saved and may not have sent, with their own
        ``seq`` (the gateway drops one it has seen), tracked like any."""
        for p in pending:
            self._queue(
                _Queued(
                    session_id=record.id,
                    seq=p.seq,
                    event=p.event,
                    runner_id=record.runner_id,
                    run=p.run_id,
                    terminal=p.terminal,
                    upstream=p.upstream,
                    track=True,
                )
            )

    @contextlib.contextmanager
    def held(self, session_id: str) -> Iterator[None]:
        """Hold the session's events (those published meanwhile wait, in order) until the
        block ends; holds nest."""
        self._holds[session_id] = self._holds.get(session_id, 0) + 1
        try:
            yield
        finally:
            self._holds[session_id] -= 1
            if not self._holds[session_id]:
                del self._holds[session_id]
                for queued in self._waiting.pop(session_id, []):
                    self._queue(queued)

    def _queue(self, q: _Queued) -> None:
        if q.session_id in self._holds:
            self._waiting.setdefault(q.session_id, []).append(q)
            return
        # Output events encode to exactly their protocol JSON; no dict in between.
        event = q.event
        kind = str(event["type"]) if isinstance(event, dict) else tag_of(type(event))
        data = msgspec.json.encode(event)
        receivers = 0
        for name in self.subscribers if q.upstream else ():
            receivers += 1
            self._events.setdefault(name, []).append(
                SessionEvent(
                    session_id=q.session_id,
                    seq=q.seq,
                    event=data,
                    runner_id=q.runner_id,
                    origin_at=q.origin_at,
                )
            )
        if receivers:
            self._queued_n += 1
            if q.k is not None:
                self._worker_k[(q.session_id, q.seq)] = q.k
        self._events_ready.set()
        key = (q.session_id, q.seq)
        final = bool(self.journal and q.run and q.terminal)
        if q.track:
            self._receivers[key] = receivers + final
            if not self._receivers[key]:
                self._received(key)
        if not (self.journal and q.run):
            return
        pending = self._journal.setdefault((q.session_id, q.run), [])
        # With its seq, which a replay after a restart keeps: the journal drops one it has.
        pending.append(JournalEvent(event=kind, payload=event, session_seq=q.seq))
        if not q.terminal:
            self._journal_ready.set()
            return
        # The run's last append carries what is still pending, durably; the journal loop
        # sends it.
        del self._journal[(q.session_id, q.run)]
        append = JournalAppend(session_id=q.session_id, run_id=q.run, events=pending)
        self._journal_final.append((append, key))
        self._journal_ready.set()

    def _received(self, key: tuple[str, int]) -> None:
        """One more receiver has the tracked event ``key``: the last one tells
        ``on_delivered``."""
        left = self._receivers.get(key)
        if left is None:
            return
        if left > 1:
            self._receivers[key] = left - 1
            return
        del self._receivers[key]
        if self.on_delivered is not None:
            self.on_delivered(*key)

    def to_stream(
        self, stream_to: tuple[str, str] | None, msg: Output, seq: int | None = None
    ) -> None:
        """Queue ``msg`` as an SSE frame for the ``?stream=true`` caller, if there is one.

        ``seq``, a worker event's (its turn numbers it, so a replay after a restart keeps
        it), goes with the frame: the gateway drops a frame at or below the last one it
        relayed to the caller, as it drops a session event's ``seq`` it has seen. A frame
        without one (the runner's own events) is always relayed."""
        if stream_to is None:
            return
        frame = sse_frame(tag_of(type(msg)), msgspec.json.encode(msg))
        chunk = HttpChunk(request_id=stream_to[1], data=frame, seq=seq)
        self.outbox.put_nowait(stream_to[0], chunk)

    async def end_stream(self, stream_to: tuple[str, str]) -> None:
        """Close a ``?stream=true`` response, after every frame queued for it."""
        await self.outbox.flush()
        await self.peer.cast(stream_to[0], HttpChunk(request_id=stream_to[1], end=True))

    async def run_events(self) -> None:
        """Send published events to each subscriber, durably, in batches (see the module)."""
        while True:
            await self._events_ready.wait()
            self._events_ready = trio.Event()
            pending, self._events = self._events, {}
            upto = self._queued_n
            sent: dict[str, int] = {}
            failed: set[str] = set()
            worker_k = self._worker_k
            for name, events in pending.items():
                try:
                    await self.peer.cast_many(name, event_batches(events), durable=True, timeout=60)
                except Exception as exc:
                    # A tracked event stays undelivered: its record keeps it, and the next
                    # incarnation sends it again; this one stops counting it.
                    log.warning(
                        "%d session events for %s may not have been delivered: %s",
                        len(events),
                        name,
                        exc,
                    )
                    for event in events:
                        self._receivers.pop((event.session_id, event.seq), None)
                        failed.add(event.session_id)
                    continue
                if worker_k:
                    for event in events:
                        k = worker_k.get((event.session_id, event.seq))
                        if k is not None:
                            sent[event.session_id] = k  # in publish order: the last is the top
                if self._receivers:
                    for event in events:
                        self._received((event.session_id, event.seq))
            for events in pending.values():
                for event in events if worker_k else ():
                    worker_k.pop((event.session_id, event.seq), None)
            if self.on_sent is not None:
                for session_id, k in sent.items():
                    if session_id not in failed:
                        self.on_sent(session_id, k)
            self._sent_n = upto
            self._sent_more.set()
            self._sent_more = trio.Event()

    async def sent(self) -> None:
        """Return once every event queued for the subscribers so far has been sent (the
        broker took it, or its send failed and was logged), and the journal's events queued
        so far are on the bus too, without their window: an answer that must not overtake
        an edge — DELETE's after the deleted turn's ``idle`` — waits on it, and so does the
        save of a turn's end, after which nothing sends the events before it again (their
        journal append used to wait in the window, and a dispatch killed then lost them)."""
        upto = self._queued_n
        while self._sent_n < upto:
            await self._sent_more.wait()
        if self._journal:
            self._flush_journal()
            await self.outbox.flush()

    async def run_journal(self) -> None:
        """Flush journal events after a short window, so that an append carries many; send
        runs' last appends durably, each after every earlier append of its run.

        The window costs nothing a client sees: the stream does not wait for the journal. A
        run's last append skips it.
        """
        while True:
            await self._journal_ready.wait()
            if not self._journal_final:
                await trio.sleep(_JOURNAL_WINDOW_S)
            self._journal_ready = trio.Event()
            self._flush_journal()
            if not self._journal_final:
                continue
            # The run's stream appends go first: a durable one sent meanwhile could overtake
            # them (the journal orders appends only within a durability class).
            await self.outbox.flush()
            while self._journal_final:
                # Shielded, and taken off the list only once answered: a stop in the middle
                # neither loses the append nor leaves aclose() to send it twice.
                with trio.CancelScope(shield=True):
                    append, key = self._journal_final[0]
                    if await self._append_final(append):
                        self._received(key)
                    else:
                        self._receivers.pop(key, None)  # as a subscriber's failure
                self._journal_final.pop(0)

    async def aclose(self) -> None:
        """On an orderly stop: send whatever is still queued, giving each peer 2 s."""
        self._flush_journal()
        await self.outbox.flush()
        while self._journal_final:
            await self._append_final(self._journal_final.pop(0)[0], timeout=2)
        for name, events in self._events.items():
            with contextlib.suppress(Exception):
                await self.peer.cast_many(name, event_batches(events), durable=True, timeout=2)

    def _flush_journal(self) -> None:
        """Queue one append per run for everything pending."""
        pending, self._journal = self._journal, {}
        for (session_id, run), events in pending.items():
            self.outbox.put_nowait(
                self.journal or "journal",
                JournalAppend(session_id=session_id, run_id=run, events=events),
                session_id=session_id,
            )

    async def _append_final(self, append: JournalAppend, timeout: float | None = None) -> bool:
        """Send a run's last append durably; whether the journal has it (a failure is
        logged: the stream goes on)."""
        journal = self.journal or "journal"
        try:
            await self.peer.cast(
                journal, append, durable=True, session_id=append.session_id, timeout=timeout
            )
        except Exception as exc:
            log.warning("journal append failed: %s", exc)
            return False
        return True


def event_batches(events: list[SessionEvent]) -> list[SessionEvents]:
    """Publish-ordered events cut into messages of at most ``_EVENT_BATCH`` events and about
    ``_EVENT_BATCH_BYTES`` (an event larger than that travels alone)."""
    batches: list[SessionEvents] = []
    start = size = 0
    for i, event in enumerate(events):
        if i > start and (
            i - start >= _EVENT_BATCH or size + len(event.event) > _EVENT_BATCH_BYTES
        ):
            batches.append(SessionEvents(events=events[start:i]))
            start, size = i, 0
        size += len(event.event)
    if start < len(events):
        batches.append(SessionEvents(events=events[start:]))
    return batches
