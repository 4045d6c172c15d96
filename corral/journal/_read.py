"""Reading a run back: replay from a cursor, bounded, with malformed lines reported.

A reader never modifies the file. A last line without its newline is either a write in
progress or a crash's torn tail; it is left out of ``events`` and flagged with
``incomplete_tail`` (the next append through the journal repairs it).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import msgspec

from .._jsonlines import JsonObject
from ._errors import InvalidCursorError
from ._records import COMPACTED_EVENT, decode_line, parse_event_id, probe_ids, probe_seq
from ._shapes import Malformed, Replay

# How much of an unreadable line a malformed report quotes.
_RAW_QUOTE = 200

_decoder = msgspec.json.Decoder()


class _Line:
    __slots__ = ("number", "raw", "record", "seq", "size")

    def __init__(
        self, number: int, size: int, seq: int, raw: bytes | None, record: JsonObject | None
    ) -> None:
        self.number = number
        self.size = size
        self.seq = seq
        self.raw = raw
        self.record = record

    def decoded(self) -> JsonObject | str:
        # The record, or why it is not one: the seq probe skips the rest of the line
        # unchecked, so a line it accepted can still fail here (invalid UTF-8, say).
        if self.record is None:
            assert self.raw is not None
            value = decode_line(self.raw)
            if not isinstance(value, dict):
                return value
            self.record = value
        return self.record

    def malformed(self, reason: str) -> Malformed:
        raw = (self.raw or b"")[:_RAW_QUOTE].decode("utf-8", "replace")
        return {"line": self.number, "reason": reason, "raw": raw}


def read_bytes(path: Path) -> bytes:
    """The run file's bytes, or ``b""`` if the run has no file."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    # Decoding a long run allocates a dict per record, and the cyclic GC keeps rescanning
    # the growing heap meanwhile (that doubled the replay time of a 100k-record run).
    # Decoded JSON cannot form reference cycles, so pausing the GC here loses nothing.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _decode_all(data: bytes) -> tuple[list[JsonObject], bool] | None:
    # The fast path: msgspec decodes every line in one call. It applies only when each
    # complete line is exactly one record (no blank, multi-line or malformed lines);
    # otherwise the caller goes line by line to report what is wrong and where.
    end = data.rfind(b"\n") + 1
    body = data[:end]
    try:
        with _gc_paused():
            values = _decoder.decode_lines(body)
    except msgspec.DecodeError:
        return None
    if len(values) != body.count(b"\n"):
        return None
    for value in values:
        seq = value.get("seq") if isinstance(value, dict) else None
        if type(seq) is not int or seq < 1:
            return None
    return values, bool(data[end:].strip())


def split_lines(data: bytes, *, full: bool) -> tuple[list[_Line], list[Malformed], bool]:
    """Split a run file into record lines, malformed reports and the incomplete-tail flag.

    With ``full`` every record is decoded now; otherwise only its seq is, and the body is
    decoded on demand (replay from a cursor skips most bodies). A line's ``size`` includes
    its newline.
    """
    end = data.rfind(b"\n") + 1
    incomplete_tail = bool(data[end:].strip())
    lines: list[_Line] = []
    malformed: list[Malformed] = []
    with _gc_paused():
        for number, raw in enumerate(data[:end].split(b"\n")[:-1], start=1):
            if not raw.strip():
                continue
            seq = None if full else probe_seq(raw)
            if seq is not None:
                lines.append(_Line(number, len(raw) + 1, seq, raw, None))
                continue
            line = _Line(number, len(raw) + 1, 0, raw, None)
            value = line.decoded()
            if isinstance(value, str):
                malformed.append(line.malformed(value))
            else:
                line.seq = value["seq"]
                lines.append(line)
    return lines, malformed, incomplete_tail


def load_events(path: Path) -> list[JsonObject]:
    """Every decodable record of the run, in file order (for summaries and snapshots)."""
    data = read_bytes(path)
    fast = _decode_all(data)
    if fast is not None:
        return fast[0]
    lines, _malformed, _tail = split_lines(data, full=True)
    return [line.record for line in lines if line.record is not None]


class StoredIds(NamedTuple):
    """What a run's file says an appender already stored: every idempotency key with its
    record's seq, and the highest ``session_seq`` (0 when no record has one)."""

    keys: dict[str, int]
    session_seq: int


def load_ids(path: Path) -> StoredIds:
    """The idempotency keys and the highest ``session_seq`` stored in the run (file order).

    Only records carrying either are decoded, and only their ``seq``, ``key`` and
    ``session_seq``; a file with neither field anywhere costs one read and two searches.
    """
    data = read_bytes(path)
    if b'"key":' not in data and b'"session_seq":' not in data:
        return StoredIds({}, 0)
    end = data.rfind(b"\n") + 1
    keys: dict[str, int] = {}
    top = 0
    for raw in data[:end].split(b"\n"):
        if (b'"key":' in raw or b'"session_seq":' in raw) and (found := probe_ids(raw)):
            seq, key, session_seq = found
            if key is not None:
                keys[key] = seq
            if session_seq is not None and session_seq > top:
                top = session_seq
    return StoredIds(keys, top)


def _effective_cursor(after_seq: int | str, run_id: str, last_seq: int) -> tuple[int, bool]:
    # Last-Event-ID semantics: an event id from another run, or past the end of this one
    # (the run was deleted and started again), means "I have nothing": replay from the start.
    if isinstance(after_seq, str):
        cursor_run, cursor_seq = parse_event_id(after_seq)
        if cursor_run != run_id or cursor_seq > last_seq:
            return 0, cursor_seq != 0
        return cursor_seq, False
    if type(after_seq) is not int or after_seq < 0:
        raise InvalidCursorError(f"after_seq must be an int >= 0 or an event id, got {after_seq!r}")
    return after_seq, False


def _first_gap(lines: list[_Line], session_id: str, run_id: str) -> Malformed | None:
    # Strict mode: every record must be the next seq of *this* run, or a compaction record
    # that says which seqs it stands for. Anything else is reported, not guessed around.
    expected = 1
    for line in lines:
        record = line.record
        assert record is not None  # strict reads decode every line up front
        if (
            record.get("run_id") != run_id
            or record.get("session_id") != session_id
            or record.get("event_id") != f"{run_id}:{line.seq}"
        ):
            return {"line": line.number, "reason": "foreign_record", "seq": line.seq}
        covered_from: object = line.seq
        payload = record.get("payload")
        if record.get("event") == COMPACTED_EVENT and isinstance(payload, dict):
            covered_from = payload.get("first_seq")
        if covered_from != expected or line.seq < expected:
            return {
                "line": line.number,
                "reason": "non_contiguous",
                "expected_seq": expected,
                "seq": line.seq,
            }
        expected = line.seq + 1
    return None


def replay(
    data: bytes,
    *,
    session_id: str,
    run_id: str,
    after_seq: int | str,
    limit: int | None,
    max_bytes: int | None,
    strict: bool,
) -> Replay:
    """Select the records after a cursor, bounded by ``limit`` rows and ``max_bytes``.

    The byte bound counts encoded lines and always lets the first record through, so a
    paging client makes progress even past one oversized record.
    """
    if limit is not None and (type(limit) is not int or limit < 0):
        raise ValueError(f"limit must be None or an int >= 0, got {limit!r}")
    if max_bytes is not None and (type(max_bytes) is not int or max_bytes < 0):
        raise ValueError(f"max_bytes must be None or an int >= 0, got {max_bytes!r}")
    if not strict and max_bytes is None and type(after_seq) is int and after_seq == 0:
        fast = _decode_all(data)
        if fast is not None:
            records, incomplete_tail = fast
            head = records if limit is None else records[:limit]
            return _result(
                session_id,
                run_id,
                head,
                [],
                limit_reason="rows" if len(head) < len(records) else None,
                next_after_seq=head[-1]["seq"] if head else 0,
                last_seq=max((record["seq"] for record in records), default=0),
                cursor_reset=False,
                incomplete_tail=incomplete_tail,
            )
    # From a cursor, find each line's seq cheaply and decode only what is returned.
    lines, malformed, incomplete_tail = split_lines(data, full=strict)
    last_seq = max((line.seq for line in lines), default=0)
    after, cursor_reset = _effective_cursor(after_seq, run_id, last_seq)

    limit_reason: str | None = None
    if strict and (gap := _first_gap(lines, session_id, run_id)) is not None:
        malformed.append(gap)
        lines = [line for line in lines if line.number < gap["line"]]
        limit_reason = gap["reason"]

    events: list[JsonObject] = []
    used_bytes = 0
    next_after = after
    for line in lines:
        if line.seq <= after:
            continue
        if limit is not None and len(events) >= limit:
            limit_reason = "rows"
            break
        if max_bytes is not None and events and used_bytes + line.size > max_bytes:
            limit_reason = "bytes"
            break
        record = line.decoded()
        if isinstance(record, str):
            malformed.append(line.malformed(record))
            continue
        events.append(record)
        used_bytes += line.size
        next_after = line.seq
    malformed.sort(key=lambda entry: entry["line"])
    return _result(
        session_id,
        run_id,
        events,
        malformed,
        limit_reason=limit_reason,
        next_after_seq=next_after,
        last_seq=last_seq,
        cursor_reset=cursor_reset,
        incomplete_tail=incomplete_tail,
    )


def _result(
    session_id: str,
    run_id: str,
    events: list[JsonObject],
    malformed: list[Malformed],
    *,
    limit_reason: str | None,
    next_after_seq: int,
    last_seq: int,
    cursor_reset: bool,
    incomplete_tail: bool,
) -> Replay:
    return {
        "session_id": session_id,
        "run_id": run_id,
        "events": events,
        "malformed": malformed,
        "complete": limit_reason is None,
        "limit_reason": limit_reason,
        "next_after_seq": next_after_seq,
        "last_seq": last_seq,
        "cursor_reset": cursor_reset,
        "incomplete_tail": incomplete_tail,
    }
