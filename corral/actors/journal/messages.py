"""The journal actor's protocol: what it is sent, and what it answers.

Message → reply:
    JournalAppend    → JournalAppended      append a batch of events to one run (stream or
                                            durable); the reply comes once they are durable
    JournalAppends   → none                 several runs' appends in one durable message,
                                            acked once all of them are durable
    JournalRead      → JournalReadReply     replay after a cursor, bounded by rows and bytes
    JournalSummary   → JournalSummaryReply  a run's summary (terminal state, runtime model)
    JournalSnapshot  → JournalSnapshotReply the live snapshot of a run found by id alone
    JournalList      → JournalListReply     the sessions, or one session's runs

Bad input is answered with an :class:`~corral.bus.ErrorReply` whose code is
``invalid_id``, ``invalid_event``, ``invalid_payload``, ``invalid_cursor`` or
``invalid_argument`` (nothing is written); a disk failure is ``io_error``.
Besides these, every actor answers :class:`~corral.bus.InspectRequest` with an
:class:`~corral.bus.InspectReply`; a body outside :data:`Inbound` is rejected (dead-lettered)
and a caller gets ``protocol_error``; a handler that raises answers ``handler_error`` and its
durable message is nacked.

The actor itself (ordering, idempotency, options) is :mod:`corral.actors.journal._actor`.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from ...bus import Message, Request
from ...journal import Listing, Replay, SessionPayload, Snapshot, Summary


class JournalEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One event of an append: its name and its JSON payload (``None`` is stored as ``{}``).

    ``session_seq``, if given, is the event's ``seq`` in its session's stream (dispatch's
    numbering, which a replay after a restart keeps): the journal stores it with the record
    and drops an event at or below the highest one the run already holds, as the gateway
    drops a ``seq`` it has seen.
    """

    event: str
    payload: Any = None
    session_seq: Annotated[int, msgspec.Meta(ge=1)] | None = None
    #: The payload already encoded as JSON, stored as it is once the journal has checked it
    #: (``payload`` is then ignored): dispatch has each event encoded for its stream, and a
    #: relayed delta should not be decoded and encoded again here (#20).
    payload_json: bytes | None = None


class JournalAppend(Request["JournalAppended"], tag="journal.append"):
    """Append ``events``, in order, to one run.

    Send it as a stream message for deltas (may be lost, never duplicated) or durable for
    state and terminal events (stored exactly once, even across crashes). ``after``, on a
    stream append, is the id of the last durable append the sender sent to this run: the
    append waits until that one is applied (see the module docs). Durable appends ignore it.
    """

    session_id: str
    run_id: str
    events: list[JournalEvent]
    after: str | None = None

    @classmethod
    def one(
        cls, session_id: str, run_id: str, event: str, payload: Any = None, **kw: Any
    ) -> JournalAppend:
        """An append of a single event."""
        return cls(
            session_id=session_id,
            run_id=run_id,
            events=[JournalEvent(event=event, payload=payload)],
            **kw,
        )


class JournalAppends(Message, tag="journal.appends"):
    """Appends to several runs in one message, each applied as a durable
    :class:`JournalAppend` of its own (its ``after`` ignored); nothing is answered, and the
    message is acked once every append is durable (nacked, so redelivered, if one failed).

    Dispatch sends each round of its journal feed this way: with many sessions streaming at
    once a round holds an event or two for each of dozens of runs, and a message per run
    cost the broker a commit entry, an acceptance and an ack each (#20). An append that
    does not pass the journal's checks is refused alone (logged, counted in ``rejected``);
    the others are applied. Idempotency keys are per append (``"<message id>#<index>"``), so
    a redelivery stores nothing twice.
    """

    appends: list[JournalAppend]


class JournalAppended(Message, tag="journal.appended"):
    """The events of an append are durable (per the fsync policy): their seqs, in order.

    ``duplicates`` counts events not stored by this append: those an earlier delivery of the
    same durable message had stored (their seqs are the stored ones), and those whose
    ``session_seq`` is at or below what the run holds (their seq is ``0``).
    """

    session_id: str
    run_id: str
    seqs: list[int]
    duplicates: int = 0


class JournalRead(Request["JournalReadReply"], tag="journal.read"):
    """Replay a run after ``after`` (a seq or an event id ``"<run_id>:<seq>"``).

    ``limit`` bounds rows and ``max_bytes`` the encoded records; the actor also caps the
    bytes so the reply fits in one bus message (page with ``next_after_seq``).
    """

    session_id: str
    run_id: str
    after: int | str = 0
    limit: int | None = None
    max_bytes: int | None = None
    strict: bool = False


class JournalReadReply(Message, tag="journal.read_reply"):
    """``RunJournal.read``'s dict: ``events``, ``malformed``, ``complete``, ``limit_reason``,
    ``next_after_seq``, ``last_seq``, ``cursor_reset``, ``incomplete_tail``, ..."""

    result: Replay


class JournalSummary(Request["JournalSummaryReply"], tag="journal.summary"):
    """Ask for a run's summary; a run without records has ``terminal_state`` ``unknown``."""

    session_id: str
    run_id: str


class JournalSummaryReply(Message, tag="journal.summary_reply"):
    """``RunJournal.summary``'s dict (always with ``runtime_model``)."""

    summary: Summary


class JournalSnapshot(Request["JournalSnapshotReply"], tag="journal.snapshot"):
    """Ask for the live snapshot of a run found by its id alone (J-16)."""

    run_id: str


class JournalSnapshotReply(Message, tag="journal.snapshot_reply"):
    """The snapshot (``None`` for a run without records) and its session-payload projection."""

    snapshot: Snapshot | None
    session_payload: SessionPayload | None


class JournalList(Request["JournalListReply"], tag="journal.list"):
    """List the sessions, or (with ``session_id``) one session's runs."""

    session_id: str | None = None


class JournalListReply(Message, tag="journal.list_reply"):
    """``RunJournal.listing``'s dict (``sessions``, or ``session_id`` and ``runs``)."""

    listing: Listing


#: Everything the journal actor handles.
Inbound = (
    JournalAppend | JournalAppends | JournalRead | JournalSummary | JournalSnapshot | JournalList
)
