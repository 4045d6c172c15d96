"""Run summaries: the runtime-model rules J-04 to J-15 and the terminal state."""

from __future__ import annotations

from typing import Any

import pytest

from corral.journal import RunJournal
from tests.unit._journal import observation, set_last_payload_to_null


def runtime(journal: RunJournal, run_id: str = "run-a") -> Any:
    return journal.summary("session-a", run_id)["runtime_model"]


def test_j01_j05_to_j15_runtime_is_owned_and_invalidated(journal: RunJournal) -> None:
    # Seed: test_journal_runtime_is_owned_and_invalidated, every assertion kept.
    journal.append("session-a", "run-a", "token", {"text": "answer"})
    first = journal.append("session-a", "run-a", "runtime_model", observation())
    assert journal.read("session-a", "run-a")["events"][-1] == first

    summary = journal.summary("session-a", "run-a")
    assert summary["runtime_model"] == observation()
    summary["runtime_model"]["model"] = "corrupted"
    assert runtime(journal) == observation()

    journal.append("session-a", "run-a", "warning", {"type": "fallback", "message": "Trying"})
    assert runtime(journal) is None

    journal.append("session-a", "run-a", "runtime_model", {**observation(), "stream_id": "foreign"})
    assert runtime(journal) is None

    journal.append("session-a", "run-a", "runtime_model", observation("recovered"))
    assert runtime(journal)["model"] == "recovered"

    journal.append("session-a", "run-a", "runtime_model", "malformed observation")
    assert runtime(journal) is None

    journal.append("session-a", "run-a", "runtime_model", observation("recovered-again"))
    assert runtime(journal)["model"] == "recovered-again"

    assert runtime(journal, "another-run") is None


@pytest.mark.parametrize("malformed", ["bad observation", ["bad observation"], None])
def test_j04_j11_j14_non_object_observation_invalidates_the_summary(
    journal: RunJournal, malformed: Any
) -> None:
    # Seed: test_non_object_observation_invalidates_summary_and_http_snapshot (summary part;
    # the snapshot part is in test_journal_snapshot.py).
    journal.append("session-a", "run-a", "runtime_model", observation("first"))
    journal.append("session-a", "run-a", "token", malformed)
    assert runtime(journal)["model"] == "first"
    journal.append(
        "session-a",
        "run-a",
        "runtime_model",
        malformed if malformed is not None else {"placeholder": True},
    )
    if malformed is None:
        set_last_payload_to_null(journal)
    assert runtime(journal) is None


def test_j05_summary_always_has_runtime_model(journal: RunJournal) -> None:
    assert journal.summary("session-a", "run-a")["runtime_model"] is None
    journal.append("session-a", "run-a", "token", {"text": "x"})
    summary = journal.summary("session-a", "run-a")
    assert "runtime_model" in summary
    assert summary["runtime_model"] is None


def test_j06_summary_value_is_the_exact_observation(journal: RunJournal) -> None:
    journal.append("session-a", "run-a", "runtime_model", observation())
    value = runtime(journal)
    assert value == observation()
    assert sorted(value) == sorted(observation())


def test_j07_summaries_are_isolated_copies(journal: RunJournal) -> None:
    journal.append("session-a", "run-a", "runtime_model", observation())
    summary = journal.summary("session-a", "run-a")
    summary["runtime_model"]["model"] = "corrupted"
    summary["runtime_model"]["extra"] = 1
    summary["terminal_state"] = "corrupted"
    again = journal.summary("session-a", "run-a")
    assert again["runtime_model"] == observation()
    assert again["terminal_state"] == "running"


def test_j08_observation_for_this_session_and_stream_is_adopted(journal: RunJournal) -> None:
    journal.append("session-a", "run-a", "runtime_model", observation("mine"))
    assert runtime(journal)["model"] == "mine"


def test_j09_a_foreign_stream_is_never_adopted(journal: RunJournal) -> None:
    journal.append("session-a", "run-a", "runtime_model", observation(stream_id="foreign"))
    assert runtime(journal) is None


def test_j10_a_foreign_session_observation_invalidates(journal: RunJournal) -> None:
    journal.append("session-a", "run-a", "runtime_model", observation())
    journal.append("session-a", "run-a", "runtime_model", observation(session_id="foreign"))
    assert runtime(journal) is None


@pytest.mark.parametrize(
    "malformed", ["malformed observation", "bad observation", ["bad observation"], 3]
)
def test_j11_a_non_object_observation_invalidates_without_raising(
    journal: RunJournal, malformed: Any
) -> None:
    journal.append("session-a", "run-a", "runtime_model", observation())
    journal.append("session-a", "run-a", "runtime_model", malformed)
    assert runtime(journal) is None


def test_j04_a_raw_null_payload_row_is_tolerated(journal: RunJournal) -> None:
    journal.append("session-a", "run-a", "runtime_model", observation())
    journal.append("session-a", "run-a", "runtime_model", {"placeholder": True})
    set_last_payload_to_null(journal)
    assert journal.read("session-a", "run-a")["events"][-1]["payload"] is None
    assert runtime(journal) is None


@pytest.mark.parametrize(
    "warning", [{"type": "fallback", "message": "Trying another route"}, {"type": "fallback"}]
)
def test_j12_a_warning_invalidates(journal: RunJournal, warning: dict) -> None:
    journal.append("session-a", "run-a", "runtime_model", observation())
    journal.append("session-a", "run-a", "warning", warning)
    assert runtime(journal) is None


def test_j13_re_observation_recovers(journal: RunJournal) -> None:
    journal.append("session-a", "run-a", "runtime_model", observation())
    journal.append("session-a", "run-a", "warning", {"type": "fallback"})
    journal.append("session-a", "run-a", "runtime_model", observation("recovered"))
    assert runtime(journal) == observation("recovered")


@pytest.mark.parametrize("payload", [{"text": "answer"}, "bad", ["bad"], None])
def test_j14_token_events_do_not_invalidate(journal: RunJournal, payload: Any) -> None:
    journal.append("session-a", "run-a", "runtime_model", observation())
    journal.append("session-a", "run-a", "token", payload)
    assert runtime(journal) == observation()


def test_j15_another_run_has_its_own_summary(journal: RunJournal) -> None:
    journal.append("session-a", "run-a", "runtime_model", observation())
    other = journal.summary("session-a", "another-run")
    assert other["runtime_model"] is None
    assert other["terminal_state"] == "unknown"
    assert (other["last_seq"], other["event_count"], other["terminal"]) == (0, 0, False)


def test_summary_reports_the_cursor(journal: RunJournal) -> None:
    journal.append("session-a", "run-a", "token", {})
    last = journal.append("session-a", "run-a", "token", {})
    summary = journal.summary("session-a", "run-a")
    assert summary["last_seq"] == 2
    assert summary["last_event_id"] == "run-a:2"
    assert summary["last_event"] == "token"
    assert summary["event_count"] == 2
    assert summary["updated_at"] == last["created_at"]
    assert (summary["session_id"], summary["run_id"], summary["stream_id"]) == (
        "session-a",
        "run-a",
        "run-a",
    )


@pytest.mark.parametrize(
    ("events", "state"),
    [
        ([], "unknown"),
        ([("token", {})], "running"),
        ([("token", {}), ("done", {})], "completed"),
        ([("error", {"type": "boom"}), ("stream_end", {})], "errored"),
        ([("cancel", {}), ("stream_end", {})], "interrupted-by-user"),
        ([("token", {}), ("stream_end", {})], "completed"),
        ([("done", {"terminal_state": "tool_limit_reached"})], "tool_limit_reached"),
        ([("response.completed", {}), ("session.status", {"status": "idle"})], "completed"),
    ],
)
def test_terminal_state_lets_a_logical_terminal_win_over_stream_end(
    journal: RunJournal, events: list, state: str
) -> None:
    for event, payload in events:
        journal.append("session-a", "run-a", event, payload)
    summary = journal.summary("session-a", "run-a")
    assert summary["terminal_state"] == state
    assert summary["terminal"] is (state not in ("unknown", "running"))
