"""Run summaries: cursor, terminal state and the observed runtime model of one run.

The runtime-model rules (BEHAVIOURS.md J-05 to J-15), applied to the run's records in order:

* a ``runtime_model`` record whose payload is an object with this run's ``session_id`` and
  ``stream_id`` (the run id) becomes the current observation, exactly as written;
* any other ``runtime_model`` record (another session, another stream, or a payload that is
  not an object, including a legacy ``null``) clears it: a stale observation must never
  survive a newer one that could not be adopted;
* a ``warning`` record clears it (a warning announces that the serving route changed);
* every other event leaves it alone.

Summaries are built from a fresh read of the file on every call, so callers get their own
objects and mutating one can never leak into the next (J-07).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .._jsonlines import JsonObject
from ._shapes import Summary


def observe(current: Any, record: JsonObject, session_id: str, run_id: str) -> Any:
    """Apply one record to the current runtime-model observation and return the new one."""
    event = record.get("event")
    if event == "warning":
        return None
    if event != "runtime_model":
        return current
    payload = record.get("payload")
    if (
        isinstance(payload, dict)
        and payload.get("session_id") == session_id
        and payload.get("stream_id") == run_id
    ):
        return payload
    return None


def terminal_record(events: list[JsonObject]) -> JsonObject | None:
    """The record that decides the run's terminal state, or ``None`` while it runs.

    ``stream_end`` is the transport closing; when a logical terminal (``done``, ``error``,
    ``cancel``, ...) came before it, that one says how the run ended.
    """
    fallback = None
    for record in reversed(events):
        if not record.get("terminal"):
            continue
        if record.get("event") != "stream_end":
            return record
        fallback = fallback or record
    return fallback


def summarize(session_id: str, run_id: str, events: Iterable[JsonObject]) -> Summary:
    """Summarise a run from its records (file order).

    ``terminal_state`` is the deciding record's state, ``running`` for a run with records but
    no terminal one, and ``unknown`` for a run with no records at all (J-15).
    """
    ordered = list(events)
    runtime_model: Any = None
    for record in ordered:
        runtime_model = observe(runtime_model, record, session_id, run_id)
    last = ordered[-1] if ordered else {}
    terminal = terminal_record(ordered)
    if terminal is not None:
        terminal_state = terminal.get("terminal_state")
    else:
        terminal_state = "running" if ordered else "unknown"
    return {
        "session_id": session_id,
        "run_id": run_id,
        "stream_id": run_id,
        "event_count": len(ordered),
        "last_seq": last.get("seq", 0),
        "last_event_id": last.get("event_id"),
        "last_event": last.get("event"),
        "terminal": terminal is not None,
        "terminal_state": terminal_state,
        "runtime_model": runtime_model,
        "created_at": ordered[0].get("created_at") if ordered else None,
        "updated_at": last.get("created_at"),
    }
