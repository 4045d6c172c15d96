"""What the journal's unit tests share: a runtime-model observation, a legacy ``null``
payload, and the keys of a version-1 record in their order."""

from __future__ import annotations

import json
from typing import Any

from corral.journal import RunJournal

__all__ = ["RECORD_KEYS", "observation", "set_last_payload_to_null"]

#: A version-1 record's keys, in the order they are written (J-02).
RECORD_KEYS = [
    "version",
    "event_id",
    "seq",
    "run_id",
    "session_id",
    "event",
    "created_at",
    "terminal",
    "terminal_state",
    "payload",
]


def observation(
    model: str = "backup", *, session_id: str = "session-a", stream_id: str = "run-a"
) -> dict[str, Any]:
    """A ``runtime_model`` observation, with the six keys of J-06, owned (J-08) by run
    ``run-a`` of ``session-a`` unless told otherwise."""
    return {
        "session_id": session_id,
        "stream_id": stream_id,
        "model": model,
        "provider": "custom",
        "fallback_active": True,
        "phase": "observed_output",
    }


def set_last_payload_to_null(journal: RunJournal) -> None:
    """Rewrite the last record of run ``run-a`` of ``session-a`` with a raw ``null`` payload,
    as a legacy writer left it (J-04)."""
    path = journal.path("session-a", "run-a")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[-1]["payload"] = None
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
