"""What the journal answers with: reads, summaries, snapshots and listings, as TypedDicts.

They stay dicts: the journal actor sends them over the bus and ``corral journal`` prints
them as JSON, so their keys are the ones written here and in this order. A value copied out
of a record is typed ``Any``: a reader accepts any record with a usable ``seq``, so a
damaged or hand-edited file may hold anything there. The records themselves are
:data:`~corral._jsonlines.JsonObject`: their grammar is the one of :mod:`._records`, but
what a file holds is only checked for its ``seq``.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

from .._jsonlines import JsonObject


class StoredRecord(TypedDict):
    """A record as :meth:`RunJournal.append` stored it (the grammar of :mod:`._records`)."""

    version: int
    event_id: str
    seq: int
    run_id: str
    session_id: str
    event: str
    created_at: float
    terminal: bool
    terminal_state: str | None
    payload: Any
    key: NotRequired[str]
    session_seq: NotRequired[int]


class Summary(TypedDict):
    """A run's cursor, terminal state and observed runtime model (:func:`.summarize`)."""

    session_id: str
    run_id: str
    #: The run id again, under the name stream clients use.
    stream_id: str
    event_count: int
    #: 0 for a run without records.
    last_seq: Any
    last_event_id: Any
    last_event: Any
    terminal: bool
    #: ``running`` or ``unknown`` when no record decided it.
    terminal_state: Any
    #: The observation (a record's payload, verbatim) or None.
    runtime_model: Any
    created_at: Any
    updated_at: Any


class Snapshot(Summary):
    """A summary plus the text streamed so far (J-16, J-17)."""

    last_assistant_text: str
    reasoning_text: str


class SessionPayload(TypedDict):
    """The part of a snapshot a session payload embeds (J-19)."""

    session_id: Any
    run_id: Any
    stream_id: Any
    last_seq: Any
    last_event_id: Any
    terminal: Any
    terminal_state: Any
    last_assistant_text: Any
    runtime_model: Any


class Malformed(TypedDict):
    """A line a read skipped: why, and a quote of it (or, strict, the seq it broke at)."""

    line: int
    reason: str
    raw: NotRequired[str]
    seq: NotRequired[int]
    expected_seq: NotRequired[int]


class Replay(TypedDict):
    """The records after a cursor and where to go on (``RunJournal.read``)."""

    session_id: str
    run_id: str
    events: list[JsonObject]
    malformed: list[Malformed]
    complete: bool
    #: ``rows``, ``bytes``, or the reason of a strict read's first gap; None: complete.
    limit_reason: str | None
    next_after_seq: int
    last_seq: int
    cursor_reset: bool
    incomplete_tail: bool


class SessionRow(TypedDict):
    """A session in ``corral journal ls``, from directory listings and ``stat`` alone."""

    session_id: str
    runs: int
    bytes: int
    modified_at: float | None


class RunRow(Summary):
    """A run in ``corral journal ls SESSION``: its summary and its file's size."""

    bytes: int


class Listing(TypedDict, total=False):
    """What the journal holds: ``sessions``, or one session's ``session_id`` and ``runs``."""

    sessions: list[SessionRow]
    session_id: str
    runs: list[RunRow]
