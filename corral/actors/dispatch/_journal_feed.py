"""The run journal's feed from dispatch: one run per turn, appended in rounds.

Events gather for :data:`WINDOW_S` and go as one append per run, a round's appends together in
one durable :class:`~corral.actors.journal.JournalAppends` message (or a few, past the byte
budget: a run's events past it go as consecutive appends of that run in the next message);
each round goes once the broker has the one before, so a run's appends stay in order. A run's
last append (its terminal edge) ends the window early, as does :meth:`JournalFeed.sent`.

Appends are durable. A worker forgets the events dispatch tells it are confirmed, and the
journal is one of the receivers it waits for (:class:`~._receipts.Receipts`): a stream append
that dispatch died holding, or that a restarting journal never read, would be gone from the run
for good. Each event carries its ``seq`` (``JournalEvent.session_seq``) and the journal drops
one at or below what the run holds, so a round sent again — a worker's events resent to the
next incarnation, a round an orderly stop cut — is harmless.
"""

from __future__ import annotations

import contextlib
import logging

import trio

from ...bus import Peer
from ..journal import JournalAppend, JournalAppends, JournalEvent
from ._receipts import Key, Receipts

log = logging.getLogger("corral.actors.dispatch")

#: How long journal events gather before they go out as one append per run: a flood of
#: deltas otherwise costs one append (a bus message, a journal write) per delta.
WINDOW_S = 0.02
#: Payload bytes per :class:`~corral.actors.journal.JournalAppends` message, about, at most
#: (:func:`batch_budget` lowers it for a bus whose message limit is small).
BATCH_BYTES = 1024 * 1024
#: What an event adds to a message besides its payload, about (its name, seq, framing).
_EVENT_OVERHEAD = 64


class JournalFeed:
    """Journal events per run, waiting for their round."""

    def __init__(
        self, peer: Peer, journal: str, receipts: Receipts, *, budget: int = BATCH_BYTES
    ) -> None:
        self.peer = peer
        self.journal = journal
        self.receipts = receipts
        self.budget = budget
        self._pending: dict[tuple[str, str], list[JournalEvent]] = {}
        #: Runs' last appends, oldest first.
        self._final: list[JournalAppend] = []
        #: The round in flight (sent again by :meth:`aclose` if a stop cuts it).
        self._sending: list[JournalAppend] = []
        #: Events queued and sent so far (:meth:`sent`).
        self._queued_n = self._sent_n = 0
        self._ready = trio.Event()
        self._now = trio.Event()
        self._more = trio.Event()

    def add(self, session_id: str, run: str, event: JournalEvent, *, terminal: bool) -> None:
        """Queue ``event`` for the run; the run's ``terminal`` event closes it."""
        self._queued_n += 1
        pending = self._pending.setdefault((session_id, run), [])
        pending.append(event)
        if terminal:
            del self._pending[(session_id, run)]
            self._final.append(JournalAppend(session_id=session_id, run_id=run, events=pending))
        self._ready.set()

    async def run(self) -> None:
        """Send queued events in rounds (see the module)."""
        while True:
            await self._ready.wait()
            if not self._final:
                with trio.move_on_after(WINDOW_S):
                    await self._now.wait()
            self._ready = trio.Event()
            self._now = trio.Event()
            upto = self._queued_n
            self._sending = self._take()
            await self._send(self._sending)
            self._sending = []
            self._sent_n = upto
            self._more.set()
            self._more = trio.Event()

    async def sent(self) -> None:
        """Return once every event queued so far has been sent (the broker has it, or its
        send failed and was logged), without its window."""
        upto = self._queued_n
        if self._sent_n >= upto:
            return
        self._now.set()
        self._ready.set()
        while self._sent_n < upto:
            await self._more.wait()

    async def aclose(self) -> None:
        """On an orderly stop: send whatever is still queued, within 2 s."""
        appends = self._sending + self._take()
        if appends:
            with contextlib.suppress(Exception):
                await self._cast(appends, timeout=2)

    def _take(self) -> list[JournalAppend]:
        pending, self._pending = self._pending, {}
        final, self._final = self._final, []
        appends = [
            JournalAppend(session_id=session_id, run_id=run, events=events)
            for (session_id, run), events in pending.items()
        ]
        return appends + final

    async def _send(self, appends: list[JournalAppend]) -> None:
        """Send one round and count the journal as a receiver of what the broker took; a
        failure is logged, and the stream goes on."""
        if not appends:
            return
        keys: list[Key] = [
            (append.session_id, event.session_seq or 0)
            for append in appends
            for event in append.events
        ]
        try:
            await self._cast(appends, timeout=60)
        except Exception as exc:
            log.warning("%d journal appends may not have been stored: %s", len(appends), exc)
            self.receipts.lost(keys)
            self.receipts.tell_sent(append.session_id for append in appends)
            return
        self.receipts.received(keys)
        self.receipts.tell_sent()

    async def _cast(self, appends: list[JournalAppend], *, timeout: float) -> None:
        batches = _batches(appends, self.budget)
        await self.peer.cast_many(
            self.journal,
            [JournalAppends(appends=batch) for batch in batches],
            durable=True,
            session_ids=[_session_of(batch) for batch in batches],
            timeout=timeout,
        )


def batch_budget(max_message_bytes: int) -> int:
    """Payload bytes per message, about, for a bus whose limit is ``max_message_bytes``: a
    quarter of it leaves room for the envelope, each event's framing and an estimate off."""
    return min(BATCH_BYTES, max_message_bytes // 4)


def _batches(appends: list[JournalAppend], budget: int) -> list[list[JournalAppend]]:
    """A round's appends in messages of about ``budget`` bytes of payload at most.

    A run whose events do not fit goes on in the next message, as another append of the
    same run: in a flood, a round gathers while the one before waits for the broker, and
    one run's append alone outgrew the bus's message limit, which lost it from the journal.
    Only an event larger than the budget travels alone."""
    batches: list[list[JournalAppend]] = []
    batch: list[JournalAppend] = []
    size = 0
    for append in appends:
        events: list[JournalEvent] = []
        for event in append.events:
            n = len(event.payload_json or b"") + _EVENT_OVERHEAD
            if size + n > budget and (batch or events):
                if events:
                    batch.append(_part(append, events))
                    events = []
                batches.append(batch)
                batch, size = [], 0
            events.append(event)
            size += n
        if events:
            batch.append(_part(append, events))
    if batch:
        batches.append(batch)
    return batches


def _part(append: JournalAppend, events: list[JournalEvent]) -> JournalAppend:
    """``append`` itself if ``events`` are all of it, else an append of these of its run."""
    if len(events) == len(append.events):
        return append
    return JournalAppend(session_id=append.session_id, run_id=append.run_id, events=events)


def _session_of(batch: list[JournalAppend]) -> str | None:
    """The session an envelope names (informational): the batch's, if it has just one."""
    first = batch[0].session_id
    return first if all(append.session_id == first for append in batch) else None
