"""``session_seq`` on records (the event's seq in its session's stream) and
``RunJournal.stored``: what the journal actor reads to drop an event sent again after a
restart. Records without one keep the version-1 form, so older files read as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corral.journal import JournalWriter, RunJournal


def test_a_session_seq_is_stored_last_and_only_when_given(tmp_path: Path) -> None:
    journal = RunJournal(tmp_path)
    plain = journal.append("s", "r", "token", {})
    numbered = journal.append("s", "r", "done", None, key="m/0", session_seq=2048)
    assert "session_seq" not in plain
    assert numbered["session_seq"] == 2048
    lines = journal.path("s", "r").read_bytes().splitlines()
    assert list(json.loads(lines[1]))[-2:] == ["key", "session_seq"]
    assert journal.read("s", "r", strict=True)["events"] == [plain, numbered]


def test_stored_gives_the_keys_and_the_highest_session_seq(tmp_path: Path) -> None:
    journal = RunJournal(tmp_path)
    assert journal.stored("s", "r") == ({}, 0)  # no file yet
    journal.append("s", "r", "token", {"session_seq": 99})  # in a payload: not the field
    assert journal.stored("s", "r") == ({}, 0)
    journal.append("s", "r", "token", {}, session_seq=1024)
    journal.append("s", "r", "state", {}, key="m/0", session_seq=3072)
    journal.append("s", "r", "state", {}, key="m/1")
    stored = journal.stored("s", "r")
    assert stored.keys == {"m/0": 3, "m/1": 4} == journal.keys("s", "r")
    assert stored.session_seq == 3072
    # A torn last line is not a stored record.
    with journal.path("s", "r").open("ab") as f:
        f.write(b'{"version":1,"seq":5,"session_seq":9999')
    assert journal.stored("s", "r").session_seq == 3072


@pytest.mark.parametrize("session_seq", [0, -1, True, "5", 1.5])
def test_a_bad_session_seq_is_refused_before_anything_is_written(
    tmp_path: Path, session_seq: object
) -> None:
    journal = RunJournal(tmp_path)
    with pytest.raises(ValueError, match=r"^session_seq must be None or an int >= 1"):
        journal.append("s", "r", "token", {}, session_seq=session_seq)  # type: ignore[arg-type]
    assert not journal.path("s", "r").exists()


async def test_the_writer_stores_a_session_seq(tmp_path: Path) -> None:
    journal = RunJournal(tmp_path)
    async with JournalWriter(journal) as writer:
        record = await writer.append("s", "r", "token", {}, session_seq=5)
        with pytest.raises(ValueError, match=r"^session_seq must be"):
            writer.submit("s", "r", "token", {}, session_seq=0)
    assert record["session_seq"] == 5
    assert journal.stored("s", "r").session_seq == 5


def test_compaction_keeps_the_highest_session_seq_of_what_it_folds(tmp_path: Path) -> None:
    journal = RunJournal(tmp_path)
    for n in range(1, 4):
        journal.append("s", "r", "token", {"text": "x"}, session_seq=n * 1024)
    journal.append("s", "r", "done", {})  # the terminal carries none
    report = journal.retain("s", max_age_s=0)
    assert report.compacted == ("r",)
    events = journal.read("s", "r", strict=True)["events"]
    assert [e["event"] for e in events] == ["journal.compacted", "done"]
    assert journal.stored("s", "r").session_seq == 3072
