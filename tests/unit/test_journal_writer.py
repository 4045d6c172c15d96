"""JournalWriter: group commit, per-run order (J-32), durability policies, closing, errors."""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path
from typing import Any

import pytest
import trio

from corral.journal import (
    ActiveRunError,
    InvalidEventError,
    InvalidIdError,
    JournalError,
    JournalIOError,
    JournalWriter,
    PayloadError,
    RunJournal,
    WriterAttachedError,
)
from corral.journal import _writer as writer_module
from tests.unit._journal import observation


class FsyncLog:
    """Records every data-file fsync as (path, size synced); the real fsync still runs."""

    def __init__(self) -> None:
        self.calls: list[tuple[Path, int]] = []
        self.happened = trio.Event()

    def synced_size(self, path: Path) -> int:
        return max((size for synced, size in self.calls if synced == path), default=0)


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> FsyncLog:
    log = FsyncLog()
    real = os.fdatasync

    def recording(fd: int) -> None:
        log.calls.append((Path(os.readlink(f"/proc/self/fd/{fd}")), os.fstat(fd).st_size))
        real(fd)
        # Runs in a writer thread: tell the trio side that an fsync happened.
        trio.from_thread.run_sync(log.happened.set)

    monkeypatch.setattr(os, "fdatasync", recording)
    return log


def end_of(path: Path, seq: int) -> int:
    """Byte offset just past the record with ``seq`` (records are one per line)."""
    offset = 0
    for line in path.read_bytes().splitlines(keepends=True):
        offset += len(line)
        if f'"seq":{seq},'.encode() in line:
            return offset
    raise AssertionError(f"seq {seq} not in {path}")


async def test_many_concurrent_runs_share_fsync_rounds_and_keep_per_run_order(
    journal: RunJournal,
) -> None:
    runs, per_run = 50, 200

    async def producer(writer: JournalWriter, run_id: str) -> None:
        for index in range(per_run):
            record = await writer.append("session-a", run_id, "token", {"i": index})
            assert record["seq"] == index + 1

    async with JournalWriter(journal) as writer:
        async with trio.open_nursery() as nursery:
            for run in range(runs):
                nursery.start_soon(producer, writer, f"run-{run}")
        stats = writer.statistics()

    for run in range(runs):
        result = journal.read("session-a", f"run-{run}", strict=True)
        assert result["malformed"] == []
        assert [event["seq"] for event in result["events"]] == list(range(1, per_run + 1))
        assert [event["payload"]["i"] for event in result["events"]] == list(range(per_run))
    assert stats.appends == runs * per_run
    assert stats.pending == 0
    # Group commit: each fsync round carried many appends (one per run waiting at the time).
    assert stats.fsync_rounds * 10 <= stats.appends
    assert stats.largest_round > 1


@pytest.mark.parametrize(
    ("runs", "shares"), [(1, [1]), (4, [4]), (6, [3, 3]), (16, [4] * 4), (50, [7] * 2 + [6] * 6)]
)
async def test_a_round_gives_each_worker_thread_four_files_before_it_takes_another(
    journal: RunJournal, monkeypatch: pytest.MonkeyPatch, runs: int, shares: list[int]
) -> None:
    """A round of a few files is written and fsynced by one worker thread: each handoff to a
    thread costs the event loop more than parallel fsyncs of a few files save. Past four
    files a thread, the round spreads, up to ``fsync_threads``."""
    seen: list[int] = []
    real = writer_module._write_jobs

    def recording(jobs: list[Any]) -> list[Any]:
        seen.append(len(jobs))
        return real(jobs)

    monkeypatch.setattr(writer_module, "_write_jobs", recording)
    async with JournalWriter(journal, fsync_threads=8) as writer:
        # Opened first (each run's file opens in a round of its own), then one round.
        for run in range(runs):
            await writer.append("session-a", f"run-{run}", "token", {})
        seen.clear()
        pending = [writer.submit("session-a", f"run-{run}", "token", {}) for run in range(runs)]
        for entry in pending:
            await entry.wait()
        stats = writer.statistics()
    assert sorted(seen, reverse=True) == shares
    assert stats.fsyncs == 2 * runs


async def test_append_returns_only_once_its_record_is_fsynced(
    journal: RunJournal, fsyncs: FsyncLog
) -> None:
    async def producer(writer: JournalWriter, run_id: str) -> None:
        path = journal.path("session-a", run_id)
        for index in range(20):
            record = await writer.append("session-a", run_id, "token", {"i": index})
            assert fsyncs.synced_size(path) >= end_of(path, record["seq"])

    async with JournalWriter(journal, policy="every") as writer, trio.open_nursery() as nursery:
        for run in range(5):
            nursery.start_soon(producer, writer, f"run-{run}")


async def test_j32_the_journal_mirrors_the_live_stream_in_order(journal: RunJournal) -> None:
    # The worker's J-24 scenario, as the live stream emits it, mirrored through the writer
    # without waiting between events (the way a relay pipelines a stream).
    stream = [
        ("runtime_model", observation("primary")),
        ("reasoning", {"text": "thinking"}),
        ("runtime_model", observation("backup")),
        ("token", {"text": "answer"}),
        ("warning", {"type": "fallback", "message": "Switched to fallback: backup (custom)"}),
        ("runtime_model", observation("backup")),
        ("done", {"usage": {}}),
    ]
    async with JournalWriter(journal) as writer:
        pending = [writer.submit("session-a", "run-a", event, payload) for event, payload in stream]
        records = [await entry.wait() for entry in pending]
    events = journal.read("session-a", "run-a")["events"]
    assert events == records
    assert [(event["event"], event["payload"]) for event in events] == stream
    summary = journal.summary("session-a", "run-a")
    assert summary["runtime_model"] == observation("backup")
    assert summary["terminal_state"] == "completed"


async def test_seqs_follow_call_order_across_tasks_even_while_the_run_opens(
    journal: RunJournal,
) -> None:
    order: list[Any] = []
    rng = random.Random(7)

    async def appender(writer: JournalWriter, delay: int) -> None:
        for _ in range(delay):
            await trio.lowlevel.checkpoint()
        entry = writer.submit("session-a", "run-a", "token", {"n": len(order)})
        order.append(entry)
        await entry.wait()

    async with JournalWriter(journal) as writer, trio.open_nursery() as nursery:
        for _ in range(100):
            nursery.start_soon(appender, writer, rng.randrange(20))
    assert [entry.seq for entry in order] == list(range(1, 101))
    events = journal.read("session-a", "run-a", strict=True)["events"]
    assert [event["payload"]["n"] for event in events] == list(range(100))


async def test_policy_terminal_fsyncs_at_the_terminal_record_and_closes_the_run(
    journal: RunJournal, fsyncs: FsyncLog
) -> None:
    async with JournalWriter(journal, policy="terminal") as writer:
        for index in range(10):
            await writer.append("session-a", "run-a", "token", {"i": index})
        assert fsyncs.calls == []
        assert writer.statistics().open_runs == 1
        await writer.append("session-a", "run-a", "done", {})
        path = journal.path("session-a", "run-a")
        assert fsyncs.calls == [(path, path.stat().st_size)]
        assert writer.statistics().open_runs == 0


async def test_policy_interval_fsyncs_within_the_interval(
    journal: RunJournal, fsyncs: FsyncLog, autojump_clock: trio.testing.MockClock
) -> None:
    async with JournalWriter(journal, policy="interval", interval=5.0) as writer:
        await writer.append("session-a", "run-a", "token", {})
        written_at = trio.current_time()
        assert fsyncs.calls == []
        await fsyncs.happened.wait()
        assert trio.current_time() - written_at >= 5.0
        path = journal.path("session-a", "run-a")
        assert fsyncs.calls == [(path, path.stat().st_size)]


async def test_flush_makes_everything_durable_whatever_the_policy(
    journal: RunJournal, fsyncs: FsyncLog
) -> None:
    async with JournalWriter(journal, policy="terminal") as writer:
        for run in ("run-a", "run-b"):
            writer.submit("session-a", run, "token", {})
        await writer.flush()
        assert sorted(path.name for path, _size in fsyncs.calls) == ["run-a.jsonl", "run-b.jsonl"]


async def test_closing_commits_everything_submitted(journal: RunJournal) -> None:
    async with JournalWriter(journal, window=0.5) as writer:
        for index in range(100):
            writer.submit("session-a", f"run-{index % 3}", "token", {"i": index})
    assert sum(len(journal.read("session-a", f"run-{run}")["events"]) for run in range(3)) == 100


async def test_an_error_in_the_block_still_commits_and_propagates_unwrapped(
    journal: RunJournal,
) -> None:
    with pytest.raises(KeyError, match="boom"):
        async with JournalWriter(journal) as writer:
            writer.submit("session-a", "run-a", "token", {})
            raise KeyError("boom")
    assert len(journal.read("session-a", "run-a")["events"]) == 1


async def test_a_cancelled_append_is_still_written(journal: RunJournal) -> None:
    async with JournalWriter(journal) as writer:
        with trio.CancelScope() as scope:
            scope.cancel()
            await writer.append("session-a", "run-a", "token", {"text": "kept"})
        assert scope.cancelled_caught
        record = await writer.append("session-a", "run-a", "token", {})
    assert record["seq"] == 2
    assert journal.read("session-a", "run-a")["events"][0]["payload"] == {"text": "kept"}


async def test_cancelling_the_whole_writer_still_commits_what_was_submitted(
    journal: RunJournal,
) -> None:
    with trio.CancelScope() as scope:
        async with JournalWriter(journal) as writer:
            for index in range(10):
                writer.submit("session-a", "run-a", "token", {"i": index})
            scope.cancel()
            await trio.sleep_forever()
    assert scope.cancelled_caught
    result = journal.read("session-a", "run-a", strict=True)
    assert [event["payload"]["i"] for event in result["events"]] == list(range(10))


async def test_the_writer_owns_appends_while_open(journal: RunJournal) -> None:
    journal.append("session-a", "run-a", "token", {})
    async with JournalWriter(journal) as writer:
        with pytest.raises(WriterAttachedError):
            journal.append("session-a", "run-a", "token", {})
        with pytest.raises(JournalError, match="already open"):
            async with JournalWriter(journal):
                pass
        assert (await writer.append("session-a", "run-a", "token", {}))["seq"] == 2
    assert journal.append("session-a", "run-a", "token", {})["seq"] == 3


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("../x", "run-a", "token", {}), InvalidIdError),
        (("session-a", "a/b", "token", {}), InvalidIdError),
        (("", "run-a", "token", {}), InvalidIdError),
        (("session-a", "run-a", "", {}), InvalidEventError),
        (("session-a", "run-a", "token", {"x": object()}), PayloadError),
    ],
)
async def test_bad_input_raises_at_submit_and_writes_nothing(
    journal: RunJournal, args: tuple, error: type[Exception]
) -> None:
    async with JournalWriter(journal) as writer:
        with pytest.raises(error):
            writer.submit(*args)
        with pytest.raises(error):
            await writer.append(*args)
        assert writer.statistics().pending == 0
    assert not journal.root.exists()


async def test_a_closed_writer_refuses_appends(journal: RunJournal) -> None:
    writer = JournalWriter(journal)
    with pytest.raises(trio.ClosedResourceError):
        writer.submit("session-a", "run-a", "token", {})
    async with writer:
        pass
    with pytest.raises(trio.ClosedResourceError):
        await writer.append("session-a", "run-a", "token", {})


async def test_runs_the_writer_holds_are_safe_from_retention_and_deletes(
    journal: RunJournal,
) -> None:
    async with JournalWriter(journal) as writer:
        await writer.append("session-a", "run-a", "token", {"text": "a"})
        await writer.append("session-a", "run-a", "done", {})
        # A continuation reopens the finished run: the writer holds it again.
        await writer.append("session-a", "run-a", "token", {"text": "more"})
        content = journal.path("session-a", "run-a").read_bytes()
        report = journal.retain("session-a", max_age_s=0)
        assert (report.compacted, report.skipped_active) == ((), ("run-a",))
        assert journal.path("session-a", "run-a").read_bytes() == content
        with pytest.raises(ActiveRunError):
            journal.delete_run("session-a", "run-a")
        with pytest.raises(ActiveRunError):
            journal.delete_session("session-a")
        assert journal.runs("session-a") == ["run-a"]
        await writer.append("session-a", "run-a", "done", {})
        assert journal.retain("session-a", max_age_s=0).compacted == ("run-a",)


async def test_a_failed_write_fails_its_appends_and_leaves_no_gap(
    journal: RunJournal, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with JournalWriter(journal) as writer:
        await writer.append("session-a", "run-a", "token", {"i": 0})
        path = journal.path("session-a", "run-a")
        before = path.read_bytes()
        target = path.stat().st_ino
        real_write = os.write

        def failing(fd: int, data: bytes) -> int:
            if os.fstat(fd).st_ino == target:
                raise OSError(errno.EIO, "Input/output error")
            return real_write(fd, data)

        monkeypatch.setattr(os, "write", failing)
        pending = [writer.submit("session-a", "run-a", "token", {"i": i}) for i in (1, 2)]
        for entry in pending:
            with pytest.raises(JournalIOError, match="Input/output error"):
                await entry.wait()
        monkeypatch.setattr(os, "write", real_write)
        assert path.read_bytes() == before
        assert (await writer.append("session-a", "run-a", "token", {"i": 1}))["seq"] == 2
        assert writer.statistics().errors == 1
    assert journal.read("session-a", "run-a", strict=True)["malformed"] == []


async def test_idle_runs_past_max_open_runs_are_closed_and_reopen_correctly(
    journal: RunJournal,
) -> None:
    async with JournalWriter(journal, max_open_runs=2) as writer:
        for run in range(5):
            await writer.append("session-a", f"run-{run}", "token", {})
            assert writer.statistics().open_runs <= 2
        for run in range(5):
            assert (await writer.append("session-a", f"run-{run}", "token", {}))["seq"] == 2


async def test_statistics_are_a_frozen_record(journal: RunJournal) -> None:
    async with JournalWriter(journal) as writer:
        await writer.append("session-a", "run-a", "token", {})
        stats = writer.statistics()
    assert (stats.appends, stats.rounds, stats.fsync_rounds, stats.fsyncs) == (1, 1, 1, 1)
    with pytest.raises(AttributeError):
        stats.appends = 5  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"policy": "never"}, "fsync policy must be one of"),
        ({"interval": -1}, "interval must be > 0 seconds"),
        ({"window": -0.1}, "window must be >= 0 seconds"),
        ({"fsync_threads": 0}, "fsync_threads must be >= 1"),
    ],
)
def test_bad_writer_settings_are_refused(journal: RunJournal, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{message}"):
        JournalWriter(journal, **kwargs)


async def test_a_run_that_cannot_be_opened_fails_its_appends(tmp_path: Path) -> None:
    (tmp_path / "not-a-dir").write_text("")
    journal = RunJournal(tmp_path / "not-a-dir" / "journal")
    async with JournalWriter(journal) as writer:
        pending = [writer.submit("session-a", "run-a", "token", {}) for _ in range(3)]
        for entry in pending:
            with pytest.raises(JournalIOError, match=r"^could not open run"):
                await entry.wait()
        assert writer.statistics().pending == 0


class _Steps(trio.abc.Instrument):
    """Counts the scheduler's task steps."""

    def __init__(self) -> None:
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps += 1


async def test_wait_seqs_takes_a_batch_in_one_trip_through_the_scheduler(
    journal: RunJournal,
) -> None:
    """The journal actor waits on every record of an append (5,000 deltas in a flood): one
    checkpoint per record cost most of its time, so finished records cost none."""
    async with JournalWriter(journal) as writer:
        pending = [writer.submit("session-a", "run-a", "token", {"i": i}) for i in range(2000)]
        await pending[-1].wait()
        steps = _Steps()
        trio.lowlevel.add_instrument(steps)
        try:
            seqs = await JournalWriter.wait_seqs([7, *pending])
        finally:
            trio.lowlevel.remove_instrument(steps)
        assert seqs == [7, *range(1, 2001)]
        assert steps.steps <= 3, "a scheduler trip per record"


async def test_wait_seqs_waits_for_records_not_yet_written_and_raises_a_failed_ones_error(
    journal: RunJournal, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with JournalWriter(journal) as writer:
        first = [writer.submit("session-a", "run-a", "token", {"i": i}) for i in range(3)]
        assert not first[-1].done()
        assert await JournalWriter.wait_seqs(first) == [1, 2, 3]
        assert all(entry.done() for entry in first)

        def failing(fd: int, data: bytes) -> int:
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(os, "write", failing)
        broken = [writer.submit("session-a", "run-a", "token", {"i": i}) for i in range(2)]
        with pytest.raises(JournalIOError, match="Input/output error"):
            await JournalWriter.wait_seqs(broken)
