"""Event fan-out: every published session event to the subscribers, the journal and a
streaming caller, in publish order, without a handler ever waiting on a peer.

* **Subscribers** (the gateway): durably, in :class:`~corral.actors.gateway.messages.SessionEvents`
  batches, so events published while the gateway restarts wait in its mailbox. While one round
  waits for its group commit, what is published meanwhile gathers and goes next (one commit,
  ack and buffer write per message); a round's messages are all in flight at once (the broker
  keeps their order), since one round trip per message would cap the rate. A round starts at
  least ``gap_s`` after the one before (dispatch's ``publish_gap_ms``): many sessions at a
  model's pace otherwise cost a round, a commit and a gateway write per delta.
* **The journal**: one run per turn, in rounds of durable appends
  (:class:`~._journal_feed.JournalFeed`).
* **A ``?stream=true`` caller**: SSE :class:`~corral.routes.HttpChunk` frames through the
  outbox, closed by an empty ``end`` chunk; a worker event's frame carries its ``seq``, and
  the gateway drops one it has relayed (a replay after a restart).

Saved before sent: while a session is held (:meth:`Fanout.held`, around the save that starts
or ends a turn) its events wait, so its ``running``, terminal event and edge leave only once
the record holding them is on disk; a tracked event is reported to ``on_delivered`` once every
receiver has it, and a worker event to ``on_sent`` once every receiver, the journal included,
has it and every one before it (:class:`~._receipts.Receipts`); :meth:`Fanout.republish`
sends what a previous incarnation saved again, with its own ``seq``. :meth:`Fanout.publish`
only queues (a handler awaiting a peer that is not reading would stall what drains it);
``run_events`` and the journal feed send.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterator

import msgspec
import trio

from ..._jsonlines import JsonObject
from ...bus import Outbox, Peer, tag_of
from ...harnesses.protocol import Output
from ...routes import HttpChunk, sse_frame
from ..gateway.messages import SessionEvent, SessionEvents
from ..journal import JournalEvent
from ._journal_feed import JournalFeed, batch_budget
from ._receipts import Receipts
from ._session import PendingEvent, SessionRecord

log = logging.getLogger("corral.actors.dispatch")

#: Session events per durable :class:`~corral.actors.gateway.messages.SessionEvents`
#: message (and about :func:`~._journal_feed.batch_budget` bytes of them at most).
_EVENT_BATCH = 512


class _Queued(msgspec.Struct, kw_only=True):
    """A numbered event on its way to the queues (waiting while its session is held); a
    Struct, made in a sixth of a slotted dataclass's time (one per event)."""

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

    def __init__(
        self, peer: Peer, *, subscribers: list[str], journal: str | None, gap_s: float = 0.0
    ) -> None:
        self.peer = peer
        #: The shortest time between the starts of two rounds to the subscribers.
        self.gap_s = gap_s
        self.outbox = Outbox(peer)
        self.subscribers = subscribers
        self.journal = journal
        self.receipts = Receipts()
        self._budget = batch_budget(peer.bus.max_message_bytes)
        self._journal = (
            JournalFeed(peer, journal, self.receipts, budget=self._budget) if journal else None
        )
        self._events: dict[str, list[SessionEvent]] = {}
        self._events_ready = trio.Event()
        #: Holds per session (:meth:`held`), and the events published while held.
        self._holds: dict[str, int] = {}
        self._waiting: dict[str, list[_Queued]] = {}
        #: Batches of subscriber events queued and sent so far (:meth:`sent`).
        self._queued_n = self._sent_n = 0
        self._sent_more = trio.Event()

    @property
    def on_delivered(self) -> Callable[[str, int], None] | None:
        """Told ``(session_id, seq)`` of a tracked event once every receiver has it."""
        return self.receipts.on_delivered

    @on_delivered.setter
    def on_delivered(self, tell: Callable[[str, int], None] | None) -> None:
        self.receipts.on_delivered = tell

    @property
    def on_sent(self) -> Callable[[str, int], None] | None:
        """Told ``(session_id, k)`` once every receiver has the session's worker events up
        to sequence number ``k``: the worker forgets them."""
        return self.receipts.on_sent

    @on_sent.setter
    def on_sent(self, tell: Callable[[str, int], None] | None) -> None:
        self.receipts.on_sent = tell

    def start(self, nursery: trio.Nursery) -> None:
        """Run the outbox and both sending loops in ``nursery``."""
        nursery.start_soon(self.outbox.run)
        if self._journal is not None:
            nursery.start_soon(self._journal.run)
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
            self._events_ready.set()
        journal = self._journal if q.run else None
        key = (q.session_id, q.seq)
        self.receipts.expect(key, receivers + bool(journal), track=q.track, k=q.k)
        if journal is not None and q.run is not None:
            # With its seq, which a replay after a restart keeps: the journal drops one it has.
            entry = JournalEvent(event=kind, payload_json=data, session_seq=q.seq)
            journal.add(q.session_id, q.run, entry, terminal=q.terminal)

    def to_stream(
        self, stream_to: tuple[str, str] | None, msg: Output, seq: int | None = None
    ) -> None:
        """Queue ``msg`` as an SSE frame for the ``?stream=true`` caller, if there is one.

        ``seq``, a worker event's (its turn numbers it, so a replay after a restart keeps
        it), goes with the frame: the gateway drops a frame at or below the last one it
        relayed to the caller, as it drops a session event's ``seq`` it has seen. A frame
        without one (the runner's own events) is always relayed: docs/dispatch.md
        (*Publishing*) says why they get none."""
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
        last = -math.inf
        while True:
            await self._events_ready.wait()
            # A round soon after the last one waits out the gap, gathering what comes.
            wait = last + self.gap_s - trio.current_time()
            if wait > 0:
                await trio.sleep(wait)
            last = trio.current_time()
            self._events_ready = trio.Event()
            pending, self._events = self._events, {}
            upto = self._queued_n
            failed: set[str] = set()
            for name, events in pending.items():
                try:
                    await self.peer.cast_many(
                        name, event_batches(events, self._budget), durable=True, timeout=60
                    )
                except Exception as exc:
                    # A tracked event stays undelivered: its record keeps it, and the next
                    # incarnation sends it again; this one stops counting it.
                    log.warning(
                        "%d session events for %s may not have been delivered: %s",
                        len(events),
                        name,
                        exc,
                    )
                    self.receipts.lost((event.session_id, event.seq) for event in events)
                    failed.update(event.session_id for event in events)
                    continue
                self.receipts.received((event.session_id, event.seq) for event in events)
            self.receipts.tell_sent(failed)
            self._sent_n = upto
            self._sent_more.set()
            self._sent_more = trio.Event()

    async def sent(self) -> None:
        """Return once every event queued so far has been sent to the subscribers and the
        journal (the broker has it, or its send failed and was logged), the journal's without
        its window: an answer that must not overtake an edge — DELETE's after the deleted
        turn's ``idle`` — waits on it, and so does the save of a turn's end, after which
        nothing sends the events before it again."""
        upto = self._queued_n
        while self._sent_n < upto:
            await self._sent_more.wait()
        if self._journal is not None:
            await self._journal.sent()

    async def aclose(self) -> None:
        """On an orderly stop: send whatever is still queued, giving each peer 2 s."""
        if self._journal is not None:
            await self._journal.aclose()
        for name, events in self._events.items():
            with contextlib.suppress(Exception):
                await self.peer.cast_many(
                    name, event_batches(events, self._budget), durable=True, timeout=2
                )


def event_batches(events: list[SessionEvent], budget: int) -> list[SessionEvents]:
    """Publish-ordered events cut into messages of at most ``_EVENT_BATCH`` events and about
    ``budget`` bytes (an event larger than that travels alone)."""
    batches: list[SessionEvents] = []
    start = size = 0
    for i, event in enumerate(events):
        if i > start and (i - start >= _EVENT_BATCH or size + len(event.event) > budget):
            batches.append(SessionEvents(events=events[start:i]))
            start, size = i, 0
        size += len(event.event)
    if start < len(events):
        batches.append(SessionEvents(events=events[start:]))
    return batches
