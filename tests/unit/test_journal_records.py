"""Record format, id rules and bad input (J-01 to J-03)."""

from __future__ import annotations

import json

import pytest

from corral.journal import (
    InvalidEventError,
    InvalidIdError,
    JournalError,
    PayloadError,
    RunJournal,
    is_stream_event,
    terminal_state_for,
)
from tests.unit._journal import RECORD_KEYS


def test_j01_append_returns_the_record_read_back(journal: RunJournal) -> None:
    journal.append("session-a", "run-a", "token", {"text": "answer"})
    record = journal.append("session-a", "run-a", "runtime_model", {"model": "backup"})
    assert journal.read("session-a", "run-a")["events"][-1] == record


def test_j02_one_json_record_per_line_with_the_documented_keys(journal: RunJournal) -> None:
    journal.append("session-a", "run-a", "token", {"text": "a"})
    journal.append("session-a", "run-a", "done", {"usage": {}})
    path = journal.path("session-a", "run-a")
    assert path == journal.root / "session-a" / "run-a.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [list(row) for row in rows] == [RECORD_KEYS, RECORD_KEYS]
    first, last = rows
    assert first["version"] == 1
    assert (first["seq"], first["event_id"]) == (1, "run-a:1")
    assert (last["seq"], last["event_id"]) == (2, "run-a:2")
    assert (first["session_id"], first["run_id"], first["event"]) == ("session-a", "run-a", "token")
    assert first["payload"] == {"text": "a"}
    assert (first["terminal"], first["terminal_state"]) == (False, None)
    assert (last["terminal"], last["terminal_state"]) == (True, "completed")
    assert isinstance(first["created_at"], float)


def test_j02_seq_is_per_run(journal: RunJournal) -> None:
    journal.append("session-a", "run-a", "token", {})
    assert journal.append("session-a", "run-b", "token", {})["seq"] == 1
    assert journal.append("session-b", "run-a", "token", {})["seq"] == 1
    assert journal.append("session-a", "run-a", "token", {})["seq"] == 2


def test_j03_none_payload_is_stored_as_empty_object(journal: RunJournal) -> None:
    record = journal.append("session-a", "run-a", "token", None)
    assert record["payload"] == {}
    row = json.loads(journal.path("session-a", "run-a").read_text())
    assert row["payload"] == {}


def test_returned_record_is_the_stored_form_not_the_callers_object(journal: RunJournal) -> None:
    payload = {"items": (1, 2), "nested": {"k": "v"}}
    record = journal.append("session-a", "run-a", "tool", payload)
    payload["nested"]["k"] = "changed"
    assert record["payload"] == {"items": [1, 2], "nested": {"k": "v"}}
    assert journal.read("session-a", "run-a")["events"] == [record]


@pytest.mark.parametrize("bad", ["../x", "a/b", "", ".", "..", "a b", "x" * 201, "é", None, 3])
@pytest.mark.parametrize("field", ["session_id", "run_id"])
def test_bad_ids_raise_a_typed_error_and_write_nothing(
    journal: RunJournal, bad: object, field: str
) -> None:
    ids = {"session_id": "session-a", "run_id": "run-a", field: bad}
    with pytest.raises(InvalidIdError, match=f"^{field} ") as caught:
        journal.append(ids["session_id"], ids["run_id"], "token", {})
    assert caught.value.field == field
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value, JournalError)
    assert not journal.root.exists()


@pytest.mark.parametrize(
    "method", ["path", "read", "summary", "runs", "delete_run", "delete_session"]
)
def test_every_entry_point_validates_ids(journal: RunJournal, method: str) -> None:
    args = {
        "path": ("../x", "run-a"),
        "read": ("session-a", "../x"),
        "summary": ("a/b", "run-a"),
        "runs": ("..",),
        "delete_run": ("session-a", ".."),
        "delete_session": ("../x",),
    }[method]
    with pytest.raises(InvalidIdError):
        getattr(journal, method)(*args)


def test_snapshot_validates_the_run_id(journal: RunJournal) -> None:
    with pytest.raises(InvalidIdError, match=r"^run_id "):
        journal.snapshot("../run-a")


def test_ids_may_use_dots_dashes_and_underscores(journal: RunJournal) -> None:
    record = journal.append("Session_1.a-b", "run.2_x-Y", "token", {})
    assert record["event_id"] == "run.2_x-Y:1"
    assert journal.path("Session_1.a-b", "run.2_x-Y").exists()


@pytest.mark.parametrize("event", ["", "   ", None, 7])
def test_bad_event_names_raise_and_write_nothing(journal: RunJournal, event: object) -> None:
    with pytest.raises(InvalidEventError, match=r"^event must be a non-empty string"):
        journal.append("session-a", "run-a", event, {})  # type: ignore[arg-type]
    assert not journal.root.exists()


@pytest.mark.parametrize("payload", [object(), {"when": {1, object()}}, {"f": lambda: 1}])
def test_unserialisable_payload_raises_and_leaves_the_journal_intact(
    journal: RunJournal, payload: object
) -> None:
    journal.append("session-a", "run-a", "token", {"text": "kept"})
    before = journal.path("session-a", "run-a").read_bytes()
    with pytest.raises(PayloadError, match=r"^payload is not JSON-serialisable: "):
        journal.append("session-a", "run-a", "token", payload)
    assert journal.path("session-a", "run-a").read_bytes() == before
    # No seq was used up by the failed append.
    assert journal.append("session-a", "run-a", "token", {})["seq"] == 2


def test_self_referencing_payload_is_a_payload_error(journal: RunJournal) -> None:
    loop: dict = {}
    loop["self"] = loop
    with pytest.raises(PayloadError):
        journal.append("session-a", "run-a", "token", loop)


@pytest.mark.parametrize(
    ("event", "payload", "state"),
    [
        ("token", {}, None),
        ("done", {}, "completed"),
        ("done", {"terminal_state": "tool_limit_reached"}, "tool_limit_reached"),
        ("stream_end", None, "completed"),
        ("cancel", {}, "interrupted-by-user"),
        ("error", {"type": "boom"}, "errored"),
        ("apperror", "not an object", "errored"),
        ("error", {"type": "tool_limit_reached"}, "tool_limit_reached"),
        ("error", {"type": "Cancelled"}, "interrupted-by-user"),
        ("apperror", {"type": "canceled"}, "interrupted-by-user"),
        ("error", {"type": "interrupted"}, "interrupted-by-crash"),
        ("response.completed", {}, "completed"),
        ("response.failed", {}, "errored"),
        ("response.incomplete", {}, "incomplete"),
        ("response.cancelled", {}, "interrupted-by-user"),
        ("warning", {}, None),
    ],
)
def test_terminal_state_classification(event: str, payload: object, state: str | None) -> None:
    assert terminal_state_for(event, payload) == state


@pytest.mark.parametrize(
    ("event", "stream"),
    [
        ("token", True),
        ("reasoning", True),
        ("response.output_text.delta", True),
        ("response.heartbeat", True),
        ("session.heartbeat", True),
        ("runtime_model", False),
        ("warning", False),
        ("session.status", False),
        ("response.output_item.done", False),
        ("done", False),
    ],
)
def test_stream_events_are_tokens_deltas_and_heartbeats(event: str, stream: bool) -> None:
    assert is_stream_event(event) is stream
