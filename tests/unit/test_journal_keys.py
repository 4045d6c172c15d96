"""Idempotency keys on records, ``RunJournal.keys``/``listing`` and ``PendingAppend.wait_seq``."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from corral.journal import JournalWriter, RunJournal
from tests.unit._journal import RECORD_KEYS


def test_a_key_is_stored_last_and_only_when_given(tmp_path: Path) -> None:
    journal = RunJournal(tmp_path)
    plain = journal.append("s", "r", "token", {"key": "in the payload"})
    keyed = journal.append("s", "r", "done", None, key="msg-1/0")
    assert "key" not in plain
    assert keyed["key"] == "msg-1/0"
    lines = journal.path("s", "r").read_bytes().splitlines()
    assert list(json.loads(lines[0])) == RECORD_KEYS
    assert list(json.loads(lines[1]))[-1] == "key"
    assert journal.read("s", "r")["events"] == [plain, keyed]


def test_keys_lists_stored_keys_with_their_seqs(tmp_path: Path) -> None:
    journal = RunJournal(tmp_path)
    assert journal.keys("s", "r") == {}
    journal.append("s", "r", "token", {"key": "not a record key"})
    assert journal.keys("s", "r") == {}
    journal.append("s", "r", "state", {}, key="m/0")
    journal.append("s", "r", "state", {}, key="m/1")
    journal.append("s", "r", "token", {})
    assert journal.keys("s", "r") == {"m/0": 2, "m/1": 3}
    # A torn last line is not a stored record.
    with journal.path("s", "r").open("ab") as f:
        f.write(b'{"version":1,"seq":5,"key":"m/2"')
    assert journal.keys("s", "r") == {"m/0": 2, "m/1": 3}


@pytest.mark.parametrize("key", ["", 5, "x" * 513])
def test_a_bad_key_is_refused_before_anything_is_written(tmp_path: Path, key: object) -> None:
    journal = RunJournal(tmp_path)
    with pytest.raises(ValueError, match=r"^key must be None or a non-empty string"):
        journal.append("s", "r", "token", {}, key=key)  # type: ignore[arg-type]
    assert not journal.path("s", "r").exists()


async def test_writer_submits_keys_and_wait_seq_returns_the_seq(tmp_path: Path) -> None:
    journal = RunJournal(tmp_path)
    async with JournalWriter(journal) as writer:
        first = writer.submit("s", "r", "token", {"n": 1})
        second = writer.submit("s", "r", "state", {"n": 2}, key="m/0")
        assert await second.wait_seq() == 2
        assert await first.wait_seq() == 1
        record = await writer.append("s", "r", "state", {"n": 3}, key="m/1")
        assert record["key"] == "m/1" and record["seq"] == 3
    assert journal.keys("s", "r") == {"m/0": 2, "m/1": 3}


def test_listing_sessions_and_runs(tmp_path: Path) -> None:
    journal = RunJournal(tmp_path / "journal", clock=itertools.count(1000.0).__next__)
    assert journal.listing() == {"sessions": []}
    journal.append("b", "r2", "token", {})
    journal.append("a", "r1", "token", {})
    journal.append("a", "r1", "done", {})
    journal.append("a", "r0", "token", {})
    listing = journal.listing()
    assert [(row["session_id"], row["runs"]) for row in listing["sessions"]] == [
        ("a", 2),
        ("b", 1),
    ]
    size = sum(journal.path("a", run).stat().st_size for run in ("r0", "r1"))
    assert listing["sessions"][0]["bytes"] == size
    runs = journal.listing("a")
    assert runs["session_id"] == "a"
    # Oldest run first (r1 was started before r0).
    assert [row["run_id"] for row in runs["runs"]] == ["r1", "r0"]
    assert [row["terminal_state"] for row in runs["runs"]] == ["completed", "running"]
    assert runs["runs"][0]["bytes"] == journal.path("a", "r1").stat().st_size
    assert journal.listing("unknown") == {"session_id": "unknown", "runs": []}
