"""Retention: folding the stream events of finished runs so a session's journals stay small.

Most of a run's bytes are streamed output (``token``, ``reasoning``, ``*.delta``) and
heartbeats; what later readers need is its *state*: every other event, which is kept verbatim
(``runtime_model``, ``warning``, status edges, tool calls and results, terminal records,
...). Compaction replaces each unbroken span of stream events with one
``journal.compacted`` record that takes the span's last seq and keeps its text::

    {"first_seq": 4, "last_seq": 9, "count": 6, "events": {"token": 6},
     "assistant_text": "...", "reasoning_text": "..."}

so seqs keep their meaning (cursors still work, ``last_seq`` is unchanged), strict reads can
see which seqs a compaction record stands for, and a snapshot still shows the text.
Only finished runs (with a terminal record) that no writer holds are ever compacted.
"""

from __future__ import annotations

import msgspec

from .._jsonlines import JsonObject
from ._records import COMPACTED_EVENT, decode_line, encode_record, is_stream_event
from ._snapshot import stream_text

_encoder = msgspec.json.Encoder()


class RetentionReport(msgspec.Struct, frozen=True, kw_only=True):
    """What one :meth:`RunJournal.retain` call did to a session's journals."""

    session_id: str
    compacted: tuple[str, ...]
    skipped_active: tuple[str, ...]
    folded_records: int
    bytes_before: int
    bytes_after: int


class RunInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What retention needs to know about one run to decide whether to compact it."""

    run_id: str
    size: int
    finished: bool
    active: bool
    updated_at: float


def candidates(runs: list[RunInfo]) -> list[RunInfo]:
    """The runs retention may compact, oldest first: finished and not held by a writer."""
    eligible = (run for run in runs if run.finished and not run.active)
    return sorted(eligible, key=lambda run: (run.updated_at, run.run_id))


def is_due(
    run: RunInfo, *, total: int, max_age_s: float | None, max_bytes: int | None, now: float
) -> bool:
    """Whether ``run`` should be compacted now.

    It is, if it finished more than ``max_age_s`` ago, or if the session's journals
    (``total`` bytes so far) are still over ``max_bytes``.
    """
    if max_age_s is not None and run.updated_at <= now - max_age_s:
        return True
    return max_bytes is not None and total > max_bytes


def _fold(span: list[JsonObject]) -> bytes:
    counts: dict[str, int] = {}
    assistant: list[str] = []
    reasoning: list[str] = []
    for record in span:
        event = record["event"]
        counts[event] = counts.get(event, 0) + 1
        text, thought = stream_text(event, record.get("payload"))
        assistant.append(text)
        reasoning.append(thought)
    first, last = span[0], span[-1]
    payload = {
        "first_seq": first["seq"],
        "last_seq": last["seq"],
        "count": len(span),
        "events": counts,
        "assistant_text": "".join(assistant),
        "reasoning_text": "".join(reasoning),
    }
    created_at = last.get("created_at")
    # The span's highest session_seq stays on record: what an appender numbered is still
    # known to be stored after the fold.
    numbered = [r["session_seq"] for r in span if type(r.get("session_seq")) is int]
    return encode_record(
        session_id=str(last.get("session_id")),
        run_id=str(last.get("run_id")),
        seq=last["seq"],
        event=COMPACTED_EVENT,
        payload=msgspec.Raw(_encoder.encode(payload)),
        terminal_state=None,
        created_at=float(created_at) if isinstance(created_at, int | float) else 0.0,
        session_seq=max(numbered) if numbered else None,
    )


def compact(data: bytes) -> tuple[bytes, int] | None:
    """Fold the stream events of one run file; ``None`` if there is nothing to fold.

    Returns the new file content and how many records were folded away. Lines that do not
    decode are kept verbatim (compaction never destroys what it does not understand); a
    torn tail is dropped, as the next open would cut it anyway.
    """
    out: list[bytes] = []
    span: list[JsonObject] = []
    folded = 0
    for raw in data.split(b"\n")[:-1]:
        if not raw.strip():
            continue
        record = decode_line(raw)
        if (
            isinstance(record, dict)
            and not record.get("terminal")
            and isinstance(record.get("event"), str)
            and is_stream_event(record["event"])
        ):
            span.append(record)
            continue
        if span:
            out.append(_fold(span))
            folded += len(span)
            span = []
        out.append(raw + b"\n")
    if span:
        out.append(_fold(span))
        folded += len(span)
    return (b"".join(out), folded) if folded else None
