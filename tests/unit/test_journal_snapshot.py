"""The live reconnect snapshot and its session-payload projection (J-16 to J-19)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from corral.journal import RunJournal
from tests.unit._journal import observation, set_last_payload_to_null


@pytest.mark.parametrize("malformed", ["bad observation", ["bad observation"], None])
def test_j04_j18_j19_non_object_observation_invalidates_the_snapshot(
    journal: RunJournal, malformed: Any
) -> None:
    # Seed: test_non_object_observation_invalidates_summary_and_http_snapshot, every
    # assertion kept (the summary ones are repeated here so the window is the same).
    journal.append("session-a", "run-a", "runtime_model", observation("first"))
    journal.append("session-a", "run-a", "token", malformed)
    assert journal.summary("session-a", "run-a")["runtime_model"]["model"] == "first"
    journal.append(
        "session-a",
        "run-a",
        "runtime_model",
        malformed if malformed is not None else {"placeholder": True},
    )
    if malformed is None:
        set_last_payload_to_null(journal)
    assert journal.summary("session-a", "run-a")["runtime_model"] is None

    snapshot = journal.snapshot("run-a")
    assert snapshot is not None
    assert snapshot["runtime_model"] is None
    assert journal.session_payload(snapshot)["runtime_model"] is None


@pytest.mark.parametrize(
    ("suffix", "expected"), [("", "backup"), ("warning", None), ("foreign", None)]
)
def test_j16_to_j19_snapshot_projects_exact_journal_window(
    journal: RunJournal, suffix: str, expected: str | None
) -> None:
    # Seed: test_http_snapshot_projects_exact_journal_window, every assertion kept.
    journal.append("session-a", "run-a", "runtime_model", observation())
    journal.append("session-a", "run-a", "token", {"text": "answer"})
    if suffix == "warning":
        journal.append("session-a", "run-a", "warning", {"type": "fallback"})
    elif suffix == "foreign":
        journal.append(
            "session-a", "run-a", "runtime_model", {**observation(), "session_id": "foreign"}
        )

    snapshot = journal.snapshot("run-a")
    assert snapshot is not None
    assert snapshot["last_assistant_text"] == "answer"
    value = snapshot["runtime_model"]
    assert (value["model"] if value else None) == expected
    assert journal.session_payload(snapshot)["runtime_model"] == value


def test_j16_snapshot_is_found_by_run_id_alone(journal: RunJournal) -> None:
    journal.append("session-other", "run-x", "token", {"text": "not this"})
    journal.append("session-b", "run-b", "token", {"text": "hello"})
    snapshot = journal.snapshot("run-b")
    assert snapshot is not None
    assert snapshot["session_id"] == "session-b"
    assert (snapshot["last_seq"], snapshot["last_event_id"]) == (1, "run-b:1")


def test_j16_unknown_run_has_no_snapshot(journal: RunJournal) -> None:
    assert journal.snapshot("run-a") is None
    journal.append("session-a", "run-b", "token", {})
    assert journal.snapshot("run-a") is None


def test_j16_snapshot_prefers_the_most_recently_written_session(journal: RunJournal) -> None:
    journal.append("session-a", "run-a", "token", {"text": "old"})
    journal.append("session-b", "run-a", "token", {"text": "new"})
    old, new = journal.path("session-a", "run-a"), journal.path("session-b", "run-a")
    stat = new.stat()
    # Make the ordering unambiguous whatever the filesystem's timestamp granularity.
    os.utime(old, ns=(stat.st_atime_ns, stat.st_mtime_ns - 10**9))
    snapshot = journal.snapshot("run-a")
    assert snapshot is not None
    assert snapshot["last_assistant_text"] == "new"


def test_j17_assistant_text_concatenates_tokens_and_output_text_deltas(
    journal: RunJournal,
) -> None:
    journal.append("session-a", "run-a", "token", {"text": "Hel"})
    journal.append("session-a", "run-a", "reasoning", {"text": "thinking"})
    journal.append("session-a", "run-a", "response.output_text.delta", {"delta": "lo "})
    journal.append("session-a", "run-a", "token", "malformed")
    journal.append("session-a", "run-a", "token", ["malformed"])
    journal.append("session-a", "run-a", "token", {"text": 5})
    journal.append("session-a", "run-a", "token", {"text": "world"})
    snapshot = journal.snapshot("run-a")
    assert snapshot is not None
    assert snapshot["last_assistant_text"] == "Hello world"
    assert snapshot["reasoning_text"] == "thinking"


def test_j18_snapshot_runtime_model_follows_the_summary_rules(journal: RunJournal) -> None:
    journal.append("session-a", "run-a", "runtime_model", observation())
    journal.append("session-a", "run-a", "warning", {})
    journal.append("session-a", "run-a", "runtime_model", observation("again"))
    journal.append(
        "session-a", "run-b", "runtime_model", observation("other run", stream_id="run-b")
    )
    snapshot = journal.snapshot("run-a")
    assert snapshot is not None
    assert snapshot["runtime_model"] == observation("again")
    assert snapshot["runtime_model"] == journal.summary("session-a", "run-a")["runtime_model"]


def test_j19_session_payload_is_a_verbatim_independent_copy(journal: RunJournal) -> None:
    journal.append("session-a", "run-a", "runtime_model", observation())
    journal.append("session-a", "run-a", "token", {"text": "answer"})
    snapshot = journal.snapshot("run-a")
    assert snapshot is not None
    payload = journal.session_payload(snapshot)
    assert payload == {
        "session_id": "session-a",
        "run_id": "run-a",
        "stream_id": "run-a",
        "last_seq": 2,
        "last_event_id": "run-a:2",
        "terminal": False,
        "terminal_state": "running",
        "last_assistant_text": "answer",
        "runtime_model": observation(),
    }
    payload["runtime_model"]["model"] = "corrupted"
    assert snapshot["runtime_model"] == observation()


def test_snapshot_carries_the_terminal_state(journal: RunJournal) -> None:
    journal.append("session-a", "run-a", "token", {"text": "a"})
    journal.append("session-a", "run-a", "error", {"type": "boom"})
    journal.append("session-a", "run-a", "stream_end", {})
    snapshot = journal.snapshot("run-a")
    assert snapshot is not None
    assert (snapshot["terminal"], snapshot["terminal_state"]) == (True, "errored")
