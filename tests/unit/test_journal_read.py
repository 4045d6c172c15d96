"""Replay: cursors (seq and Last-Event-ID), bounds, malformed lines and strict mode."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.journal import InvalidCursorError, RunJournal


@pytest.fixture
def journal(journal: RunJournal) -> RunJournal:
    """The shared empty journal (tests/conftest.py) with five records in one run."""
    for index in range(1, 6):
        journal.append("session-a", "run-a", "token", {"text": str(index)})
    return journal


def seqs(result: dict) -> list[int]:
    return [event["seq"] for event in result["events"]]


def append_raw(journal: RunJournal, data: bytes) -> None:
    with journal.path("session-a", "run-a").open("ab") as file:
        file.write(data)


def test_read_all(journal: RunJournal) -> None:
    result = journal.read("session-a", "run-a")
    assert seqs(result) == [1, 2, 3, 4, 5]
    assert [event["payload"]["text"] for event in result["events"]] == list("12345")
    assert result["malformed"] == []
    assert (result["complete"], result["limit_reason"]) == (True, None)
    assert (result["next_after_seq"], result["last_seq"]) == (5, 5)
    assert (result["cursor_reset"], result["incomplete_tail"]) == (False, False)


def test_read_of_a_run_without_a_file_is_empty(journal: RunJournal) -> None:
    result = journal.read("session-a", "nothing-here")
    assert (result["events"], result["malformed"], result["last_seq"]) == ([], [], 0)
    assert result["complete"] is True


def test_after_seq_returns_the_records_after_it(journal: RunJournal) -> None:
    assert seqs(journal.read("session-a", "run-a", after_seq=3)) == [4, 5]
    assert seqs(journal.read("session-a", "run-a", after_seq=5)) == []
    # A plain seq is a filter: past the end there is simply nothing newer.
    beyond = journal.read("session-a", "run-a", after_seq=99)
    assert (seqs(beyond), beyond["cursor_reset"], beyond["next_after_seq"]) == ([], False, 99)


def test_event_id_cursor_resumes_after_that_event(journal: RunJournal) -> None:
    result = journal.read("session-a", "run-a", after_seq="run-a:2")
    assert seqs(result) == [3, 4, 5]
    assert result["cursor_reset"] is False
    assert seqs(journal.read("session-a", "run-a", after_seq="run-a:5")) == []


@pytest.mark.parametrize("cursor", ["run-b:2", "run-a:6", "other.run:999", "a:b:c:1"])
def test_event_id_from_another_run_or_beyond_the_end_replays_from_the_start(
    journal: RunJournal, cursor: str
) -> None:
    result = journal.read("session-a", "run-a", after_seq=cursor)
    assert seqs(result) == [1, 2, 3, 4, 5]
    assert result["cursor_reset"] is True


@pytest.mark.parametrize("cursor", ["", "run-a", "run-a:", ":3", "run-a:x", "run-a:-1", -1, 1.5])
def test_unparsable_cursors_raise(journal: RunJournal, cursor: object) -> None:
    with pytest.raises(InvalidCursorError):
        journal.read("session-a", "run-a", after_seq=cursor)  # type: ignore[arg-type]


def test_limit_bounds_rows_and_pages(journal: RunJournal) -> None:
    first = journal.read("session-a", "run-a", limit=2)
    assert seqs(first) == [1, 2]
    assert (first["complete"], first["limit_reason"], first["next_after_seq"]) == (
        False,
        "rows",
        2,
    )
    second = journal.read("session-a", "run-a", after_seq=first["next_after_seq"], limit=2)
    assert seqs(second) == [3, 4]
    last = journal.read("session-a", "run-a", after_seq=second["next_after_seq"], limit=2)
    assert seqs(last) == [5]
    assert last["complete"] is True


def test_max_bytes_bounds_the_encoded_size(journal: RunJournal) -> None:
    # Lines differ by a byte or two (their timestamps), so the bound is the first two's size.
    first, second = journal.path("session-a", "run-a").read_bytes().splitlines(keepends=True)[:2]
    result = journal.read("session-a", "run-a", max_bytes=len(first) + len(second) + 1)
    assert seqs(result) == [1, 2]
    assert (result["complete"], result["limit_reason"]) == (False, "bytes")


def test_max_bytes_always_lets_one_record_through(journal: RunJournal) -> None:
    result = journal.read("session-a", "run-a", after_seq=1, max_bytes=1)
    assert seqs(result) == [2]
    assert result["limit_reason"] == "bytes"


@pytest.mark.parametrize(("limit", "max_bytes"), [(-1, None), (None, -5), ("3", None)])
def test_bad_bounds_raise(journal: RunJournal, limit: object, max_bytes: object) -> None:
    with pytest.raises(ValueError, match="must be None or an int >= 0"):
        journal.read("session-a", "run-a", limit=limit, max_bytes=max_bytes)  # type: ignore[arg-type]


def test_malformed_lines_are_reported_and_skipped(journal: RunJournal) -> None:
    append_raw(journal, b'not json\n[1, 2]\n{"no": "seq"}\n\n')
    journal.append("session-a", "run-a", "token", {"text": "6"})
    for after in (0, 2, "run-a:2"):
        result = journal.read("session-a", "run-a", after_seq=after)
        assert seqs(result)[-1] == 6
        assert result["malformed"] == [
            {"line": 6, "reason": "invalid_json", "raw": "not json"},
            {"line": 7, "reason": "not_an_object", "raw": "[1, 2]"},
            {"line": 8, "reason": "missing_seq", "raw": '{"no": "seq"}'},
        ]


def test_invalid_utf8_is_reported_not_raised(journal: RunJournal) -> None:
    append_raw(journal, b'{"seq": 6, "payload": "\xff"}\n')
    result = journal.read("session-a", "run-a")
    assert seqs(result) == [1, 2, 3, 4, 5]
    assert [entry["reason"] for entry in result["malformed"]] == ["invalid_json"]


def test_an_incomplete_last_line_is_flagged_not_returned(journal: RunJournal) -> None:
    append_raw(journal, b'{"version":1,"seq":6,"ev')
    result = journal.read("session-a", "run-a")
    assert seqs(result) == [1, 2, 3, 4, 5]
    assert result["malformed"] == []
    assert result["incomplete_tail"] is True


def test_strict_read_of_a_clean_run_is_the_plain_read(journal: RunJournal) -> None:
    strict = journal.read("session-a", "run-a", strict=True)
    assert strict == journal.read("session-a", "run-a")


def test_strict_read_reports_a_gap_instead_of_guessing(journal: RunJournal) -> None:
    path = journal.path("session-a", "run-a")
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:2] + lines[3:]))  # seq 3 is gone
    loose = journal.read("session-a", "run-a")
    assert seqs(loose) == [1, 2, 4, 5]
    strict = journal.read("session-a", "run-a", strict=True)
    assert seqs(strict) == [1, 2]
    assert strict["malformed"] == [
        {"line": 3, "reason": "non_contiguous", "expected_seq": 3, "seq": 4}
    ]
    assert (strict["complete"], strict["limit_reason"], strict["next_after_seq"]) == (
        False,
        "non_contiguous",
        2,
    )


def test_strict_read_reports_duplicates_and_foreign_records(tmp_path: Path) -> None:
    journal = RunJournal(tmp_path)
    journal.append("session-a", "run-a", "token", {})
    journal.append("session-a", "run-b", "token", {})
    run_a, run_b = journal.path("session-a", "run-a"), journal.path("session-a", "run-b")
    run_a.write_bytes(run_a.read_bytes() * 2)
    assert journal.read("session-a", "run-a", strict=True)["malformed"] == [
        {"line": 2, "reason": "non_contiguous", "expected_seq": 2, "seq": 1}
    ]
    run_a.write_bytes(run_b.read_bytes())
    assert journal.read("session-a", "run-a", strict=True)["malformed"] == [
        {"line": 1, "reason": "foreign_record", "seq": 1}
    ]


def test_strict_read_treats_a_malformed_line_as_a_gap(journal: RunJournal) -> None:
    path = journal.path("session-a", "run-a")
    lines = path.read_bytes().splitlines(keepends=True)
    lines[2] = b"{garbage\n"
    path.write_bytes(b"".join(lines))
    strict = journal.read("session-a", "run-a", strict=True)
    assert seqs(strict) == [1, 2]
    assert [entry["reason"] for entry in strict["malformed"]] == ["invalid_json", "non_contiguous"]


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 300), min_size=0, max_size=25),
    limit=st.none() | st.integers(1, 6),
    max_bytes=st.none() | st.integers(0, 1500),
    by_event_id=st.booleans(),
)
def test_paging_returns_every_record_once_in_order(
    tmp_path_factory: pytest.TempPathFactory,
    sizes: list[int],
    limit: int | None,
    max_bytes: int | None,
    by_event_id: bool,
) -> None:
    journal = RunJournal(tmp_path_factory.mktemp("paging"))
    for size in sizes:
        journal.append("session-a", "run-a", "token", {"text": "x" * size})
    seen: list[int] = []
    cursor: int | str = 0
    for _ in range(len(sizes) + 1):
        page = journal.read(
            "session-a", "run-a", after_seq=cursor, limit=limit, max_bytes=max_bytes
        )
        seen += seqs(page)
        if page["complete"]:
            break
        assert page["events"], "a bounded page must make progress"
        after = page["next_after_seq"]
        cursor = f"run-a:{after}" if by_event_id else after
    assert seen == list(range(1, len(sizes) + 1))
