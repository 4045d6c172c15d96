"""The live snapshot a reconnecting client needs, and its session-payload projection.

A client that lost its stream mid-run asks by run id alone (J-16); the snapshot gives it the
text streamed so far (J-17), the runtime model under the summary's rules over exactly this
run's records (J-18), and the cursor to resume the stream from (``last_event_id``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from .._jsonlines import JsonObject
from ._records import COMPACTED_EVENT
from ._shapes import SessionPayload, Snapshot
from ._summary import summarize

# event -> payload key holding a chunk of assistant text.
_TEXT_EVENTS = {"token": "text", "response.output_text.delta": "delta"}
# event -> payload key holding a chunk of reasoning text.
_REASONING_EVENTS = {"reasoning": "text", "response.reasoning_text.delta": "delta"}


def _text(payload: Any, key: str) -> str:
    value = payload.get(key) if isinstance(payload, dict) else None
    return value if isinstance(value, str) else ""


def stream_text(event: object, payload: Any) -> tuple[str, str]:
    """The (assistant, reasoning) text one record contributes to a run's streamed output."""
    if event in _TEXT_EVENTS:
        return _text(payload, _TEXT_EVENTS[event]), ""
    if event in _REASONING_EVENTS:
        return "", _text(payload, _REASONING_EVENTS[event])
    if event == COMPACTED_EVENT:
        return _text(payload, "assistant_text"), _text(payload, "reasoning_text")
    return "", ""


def build_snapshot(session_id: str, run_id: str, events: list[JsonObject]) -> Snapshot | None:
    """Project a run's records into its live snapshot; ``None`` for a run with no records.

    Malformed text chunks (a string, list or empty payload on a ``token``) add nothing and
    raise nothing. Text folded away by retention comes back from the compaction record.
    """
    if not events:
        return None
    assistant: list[str] = []
    reasoning: list[str] = []
    for record in events:
        text, thought = stream_text(record.get("event"), record.get("payload"))
        assistant.append(text)
        reasoning.append(thought)
    return {
        **summarize(session_id, run_id, events),
        "last_assistant_text": "".join(assistant),
        "reasoning_text": "".join(reasoning),
    }


def session_payload(snapshot: Mapping[str, object]) -> SessionPayload:
    """The part of a live snapshot embedded in a session payload, as an independent copy.

    ``runtime_model`` is carried verbatim (J-19): an observation stays equal, ``None`` stays
    ``None``; it is never re-derived or filled in from the session's selected model.
    """

    def kept(key: str) -> Any:
        return copy.deepcopy(snapshot.get(key))

    return {
        "session_id": kept("session_id"),
        "run_id": kept("run_id"),
        "stream_id": kept("stream_id"),
        "last_seq": kept("last_seq"),
        "last_event_id": kept("last_event_id"),
        "terminal": kept("terminal"),
        "terminal_state": kept("terminal_state"),
        "last_assistant_text": kept("last_assistant_text"),
        "runtime_model": kept("runtime_model"),
    }
