"""RunJournal on disk: torn-tail repair, cursors, fsync policies, deletes and retention."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from corral.journal import COMPACTED_EVENT, JournalIOError, RunJournal, _files


class Clock:
    """A settable wall clock for ``created_at``."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every data-file fsync, as the path synced (the real fsync still happens)."""
    synced: list[Path] = []
    real = os.fdatasync

    def recording(fd: int) -> None:
        synced.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
        real(fd)

    monkeypatch.setattr(os, "fdatasync", recording)
    return synced


def lines_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


# -- torn tails ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "torn",
    [b'{"version":1,"event_id":"run-a:4","seq":4,"ru', b"\x00" * 300, b"{", b"  \t"],
)
def test_a_torn_tail_is_cut_on_open_and_never_swallows_the_next_append(
    tmp_path: Path, torn: bytes
) -> None:
    first = RunJournal(tmp_path)
    for index in range(3):
        first.append("session-a", "run-a", "token", {"i": index})
    first.close()
    path = first.path("session-a", "run-a")
    with path.open("ab") as file:
        file.write(torn)

    reopened = RunJournal(tmp_path)
    record = reopened.append("session-a", "run-a", "token", {"i": 3})
    assert record["seq"] == 4
    rows = lines_of(path)
    assert [row["seq"] for row in rows] == [1, 2, 3, 4]
    assert rows[-1] == record
    assert path.read_bytes().endswith(b"\n")
    result = reopened.read("session-a", "run-a", strict=True)
    assert (result["malformed"], result["incomplete_tail"]) == ([], False)
    assert reopened.statistics().torn_repairs == 1


def test_a_file_that_is_only_a_torn_line_restarts_at_seq_1(tmp_path: Path) -> None:
    journal = RunJournal(tmp_path)
    path = journal.path("session-a", "run-a")
    path.parent.mkdir(parents=True)
    path.write_bytes(b'{"version":1,"seq":1,"payl')
    assert journal.append("session-a", "run-a", "token", {})["seq"] == 1
    assert [row["seq"] for row in lines_of(path)] == [1]


def test_the_tail_scan_finds_the_last_seq_behind_a_long_line(tmp_path: Path) -> None:
    journal = RunJournal(tmp_path)
    journal.append("session-a", "run-a", "token", {"text": "a"})
    journal.append("session-a", "run-a", "tool", {"blob": "x" * 300_000})
    journal.close()
    path = journal.path("session-a", "run-a")
    with path.open("ab") as file:
        file.write(b'{"seq":3,"torn')
    assert RunJournal(tmp_path).append("session-a", "run-a", "token", {})["seq"] == 3


def test_trailing_malformed_lines_do_not_reset_the_seq(tmp_path: Path) -> None:
    journal = RunJournal(tmp_path)
    journal.append("session-a", "run-a", "token", {})
    journal.append("session-a", "run-a", "token", {})
    journal.close()
    with journal.path("session-a", "run-a").open("ab") as file:
        file.write(b"garbage\n[]\n")
    assert RunJournal(tmp_path).append("session-a", "run-a", "token", {})["seq"] == 3


# -- cursors and directories --------------------------------------------------------------


def test_append_keeps_a_cursor_and_never_rescans(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seeded = RunJournal(tmp_path)
    for _ in range(10):
        seeded.append("session-a", "run-a", "token", {})
    seeded.close()
    scans: list[int] = []
    real_scan = _files.scan_tail

    def counting(fd: int, size: int) -> tuple[int, int]:
        scans.append(size)
        return real_scan(fd, size)

    monkeypatch.setattr(_files, "scan_tail", counting)
    journal = RunJournal(tmp_path)
    for index in range(50):
        assert journal.append("session-a", "run-a", "token", {})["seq"] == 11 + index
    assert len(scans) == 1


def test_creating_a_run_makes_its_directory_entries_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced_dirs: list[Path] = []
    real = _files.fsync_dir
    monkeypatch.setattr(_files, "fsync_dir", lambda path: (synced_dirs.append(path), real(path)))
    journal = RunJournal(tmp_path / "root")
    journal.append("session-a", "run-a", "token", {})
    # root created (entry in tmp_path), session dir created (entry in root), file created.
    assert synced_dirs == [tmp_path, tmp_path / "root", tmp_path / "root" / "session-a"]
    journal.append("session-a", "run-a", "token", {})
    journal.append("session-a", "run-b", "token", {})
    assert synced_dirs[3:] == [tmp_path / "root" / "session-a"]


def test_least_recently_used_runs_are_closed_past_max_open_runs(tmp_path: Path) -> None:
    journal = RunJournal(tmp_path, max_open_runs=2)
    for run in ("r1", "r2", "r3", "r1"):
        journal.append("session-a", run, "token", {})
    assert journal.statistics().open_runs == 2
    assert journal.append("session-a", "r1", "token", {})["seq"] == 3
    assert journal.append("session-a", "r2", "token", {})["seq"] == 2


def test_a_failed_write_leaves_no_fragment_and_no_gap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = RunJournal(tmp_path)
    journal.append("session-a", "run-a", "token", {"i": 0})
    path = journal.path("session-a", "run-a")
    before = path.read_bytes()
    real_write = os.write
    target = os.stat(path).st_ino

    def half_then_full(fd: int, data: bytes) -> int:
        if os.fstat(fd).st_ino != target:
            return real_write(fd, data)
        written = real_write(fd, bytes(data[: len(data) // 2]))
        if written == len(data):
            return written
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(JournalIOError, match="No space left on device"):
        journal.append("session-a", "run-a", "token", {"i": 1})
    monkeypatch.setattr(os, "write", real_write)
    assert path.read_bytes() == before
    assert journal.append("session-a", "run-a", "token", {"i": 1})["seq"] == 2
    assert journal.read("session-a", "run-a", strict=True)["malformed"] == []


def test_sessions_and_runs_are_listed(tmp_path: Path) -> None:
    journal = RunJournal(tmp_path)
    assert journal.sessions() == []
    assert journal.runs("session-a") == []
    journal.append("session-b", "run-2", "token", {})
    journal.append("session-a", "run-1", "token", {})
    journal.append("session-a", "run-0", "token", {})
    (tmp_path / "not a session").mkdir()
    (tmp_path / "session-a" / "run-0.jsonl.123.tmp").write_bytes(b"")
    assert journal.sessions() == ["session-a", "session-b"]
    assert journal.runs("session-a") == ["run-0", "run-1"]


# -- fsync policies -----------------------------------------------------------------------


def test_policy_every_fsyncs_each_append(tmp_path: Path, fsyncs: list[Path]) -> None:
    journal = RunJournal(tmp_path, fsync="every")
    for _ in range(3):
        journal.append("session-a", "run-a", "token", {})
    assert fsyncs == [journal.path("session-a", "run-a")] * 3
    assert journal.statistics().fsyncs == 3


def test_policy_terminal_fsyncs_at_the_terminal_record(tmp_path: Path, fsyncs: list[Path]) -> None:
    journal = RunJournal(tmp_path, fsync="terminal")
    for _ in range(5):
        journal.append("session-a", "run-a", "token", {})
    assert fsyncs == []
    journal.append("session-a", "run-a", "done", {})
    assert fsyncs == [journal.path("session-a", "run-a")]
    journal.append("session-a", "run-b", "token", {})
    journal.sync()
    assert fsyncs[1:] == [journal.path("session-a", "run-b")]


def test_policy_interval_defers_fsync_until_close(tmp_path: Path, fsyncs: list[Path]) -> None:
    with RunJournal(tmp_path, fsync="interval", interval=3600) as journal:
        for _ in range(5):
            journal.append("session-a", "run-a", "token", {})
        assert fsyncs == []
    assert fsyncs == [journal.path("session-a", "run-a")]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"fsync": "sometimes"}, "fsync policy must be one of every, terminal, interval"),
        ({"interval": 0}, "interval must be > 0 seconds"),
        ({"max_open_runs": 0}, "max_open_runs must be >= 1"),
    ],
)
def test_bad_settings_are_refused(tmp_path: Path, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{message}"):
        RunJournal(tmp_path, **kwargs)


# -- deletes ------------------------------------------------------------------------------


def test_delete_run_removes_one_run(tmp_path: Path) -> None:
    journal = RunJournal(tmp_path)
    journal.append("session-a", "run-a", "token", {})
    journal.append("session-a", "run-b", "token", {})
    assert journal.delete_run("session-a", "run-a") is True
    assert journal.delete_run("session-a", "run-a") is False
    assert journal.runs("session-a") == ["run-b"]
    # The cursor went with the file: a new run of that id starts again at seq 1.
    assert journal.append("session-a", "run-a", "token", {})["seq"] == 1


def test_delete_session_removes_every_run_of_that_session_only(tmp_path: Path) -> None:
    journal = RunJournal(tmp_path)
    for run in ("run-a", "run-b"):
        journal.append("session-a", run, "token", {})
    journal.append("session-b", "run-c", "token", {})
    assert journal.delete_session("session-a") == 2
    assert journal.delete_session("session-a") == 0
    assert journal.sessions() == ["session-b"]
    assert journal.append("session-a", "run-a", "token", {})["seq"] == 1


# -- retention ----------------------------------------------------------------------------


def observation(model: str) -> dict:
    return {
        "session_id": "session-a",
        "stream_id": "run-a",
        "model": model,
        "provider": "custom",
        "fallback_active": False,
        "phase": "observed_output",
    }


def finished_run(journal: RunJournal, run_id: str = "run-a") -> None:
    journal.append("session-a", run_id, "session.status", {"status": "running"})
    journal.append("session-a", run_id, "runtime_model", observation("m"))
    for word in ("Hel", "lo "):
        journal.append("session-a", run_id, "token", {"text": word})
    journal.append("session-a", run_id, "reasoning", {"text": "hmm"})
    journal.append("session-a", run_id, "tool", {"name": "sys_os_read"})
    journal.append("session-a", run_id, "response.output_text.delta", {"delta": "world"})
    journal.append("session-a", run_id, "session.heartbeat", {})
    journal.append("session-a", run_id, "done", {"usage": {}})


def test_retention_folds_stream_events_and_keeps_state(tmp_path: Path) -> None:
    journal = RunJournal(tmp_path)
    finished_run(journal)
    before_summary = journal.summary("session-a", "run-a")
    before_snapshot = journal.snapshot("run-a")
    size = journal.path("session-a", "run-a").stat().st_size

    report = journal.retain("session-a", max_age_s=0)

    assert report.compacted == ("run-a",)
    assert report.folded_records == 5
    assert (report.bytes_before, report.skipped_active) == (size, ())
    rows = lines_of(journal.path("session-a", "run-a"))
    assert report.bytes_after == journal.path("session-a", "run-a").stat().st_size
    assert [(row["seq"], row["event"]) for row in rows] == [
        (1, "session.status"),
        (2, "runtime_model"),
        (5, COMPACTED_EVENT),
        (6, "tool"),
        (8, COMPACTED_EVENT),
        (9, "done"),
    ]
    assert rows[2]["payload"] == {
        "first_seq": 3,
        "last_seq": 5,
        "count": 3,
        "events": {"token": 2, "reasoning": 1},
        "assistant_text": "Hello ",
        "reasoning_text": "hmm",
    }
    assert rows[4]["payload"]["events"] == {"response.output_text.delta": 1, "session.heartbeat": 1}
    after_summary = journal.summary("session-a", "run-a")
    for key in ("last_seq", "last_event_id", "terminal_state", "runtime_model", "terminal"):
        assert after_summary[key] == before_summary[key]
    after_snapshot = journal.snapshot("run-a")
    assert after_snapshot is not None and before_snapshot is not None
    assert after_snapshot["last_assistant_text"] == before_snapshot["last_assistant_text"]
    assert after_snapshot["last_assistant_text"] == "Hello world"
    strict = journal.read("session-a", "run-a", strict=True)
    assert strict["malformed"] == []
    assert [
        event["seq"] for event in journal.read("session-a", "run-a", after_seq=4)["events"]
    ] == [
        5,
        6,
        8,
        9,
    ]
    assert journal.retain("session-a", max_age_s=0).compacted == ()


def test_retention_never_touches_a_run_without_a_terminal_record(tmp_path: Path) -> None:
    journal = RunJournal(tmp_path)
    journal.append("session-a", "live", "token", {"text": "still going"})
    content = journal.path("session-a", "live").read_bytes()
    report = journal.retain("session-a", max_age_s=0, max_bytes=0)
    assert (report.compacted, report.skipped_active) == ((), ("live",))
    assert journal.path("session-a", "live").read_bytes() == content
    assert journal.append("session-a", "live", "token", {})["seq"] == 2


def test_retention_by_age_compacts_only_old_runs(tmp_path: Path) -> None:
    clock = Clock()
    journal = RunJournal(tmp_path, clock=clock)
    finished_run(journal, "old")
    clock.now += 3600
    finished_run(journal, "new")
    report = journal.retain("session-a", max_age_s=1800, now=clock.now + 1)
    assert report.compacted == ("old",)


def test_retention_by_size_compacts_oldest_first_until_under(tmp_path: Path) -> None:
    clock = Clock()
    journal = RunJournal(tmp_path, clock=clock)
    for run in ("first", "second", "third"):
        finished_run(journal, run)
        clock.now += 10
    total = sum(journal.path("session-a", run).stat().st_size for run in journal.runs("session-a"))
    report = journal.retain("session-a", max_bytes=total - 1)
    assert report.compacted == ("first",)
    assert report.bytes_after < total
    report = journal.retain("session-a", max_bytes=0)
    assert report.compacted == ("second", "third")


def test_retention_appends_continue_after_compaction(tmp_path: Path) -> None:
    journal = RunJournal(tmp_path)
    finished_run(journal)
    journal.retain("session-a", max_age_s=0)
    assert journal.append("session-a", "run-a", "token", {})["seq"] == 10
    assert journal.read("session-a", "run-a", strict=True)["malformed"] == []


def test_retention_removes_a_crashed_compactions_temp_file(tmp_path: Path) -> None:
    journal = RunJournal(tmp_path)
    finished_run(journal)
    stale = tmp_path / "session-a" / "run-a.jsonl.4242.tmp"
    stale.write_bytes(b"half a compaction")
    journal.retain("session-a")
    assert not stale.exists()
    assert journal.runs("session-a") == ["run-a"]


def test_a_run_that_cannot_be_opened_raises_a_journal_io_error(tmp_path: Path) -> None:
    (tmp_path / "not-a-dir").write_text("")
    journal = RunJournal(tmp_path / "not-a-dir" / "journal")
    with pytest.raises(JournalIOError, match=r"^could not open"):
        journal.append("session-a", "run-a", "token", {})
