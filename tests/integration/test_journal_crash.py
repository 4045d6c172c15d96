"""kill -9 of a journal writer mid-burst: nothing reported durable is lost, nothing is corrupt."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from corral.journal import RunJournal

SCRIPT = Path(__file__).with_name("_journal_burst.py")
REPORT = re.compile(rb"^(run-\d+) (\d+)\n$")


def burst_then_kill(root: Path, runs: int, kill_after: int, size: int) -> dict[str, int]:
    """Run the burst script, SIGKILL it after ``kill_after`` durable reports.

    Returns, per run, the highest seq the script reported durable (it reports in seq order).
    """
    durable: dict[str, int] = {}
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(root), str(runs), str(size)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    try:
        for _ in range(kill_after):
            line = proc.stdout.readline()
            match = REPORT.match(line)
            assert match, f"burst script stopped early: {line!r} {proc.stderr.read()!r}"
            durable[match[1].decode()] = int(match[2])
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        # Reports already in the pipe were printed after their records were durable too.
        for line in proc.stdout.read().splitlines(keepends=True):
            if match := REPORT.match(line):
                durable[match[1].decode()] = int(match[2])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    return durable


@pytest.mark.parametrize(
    ("runs", "kill_after", "size"),
    [
        (6, 400, 3000),
        (12, 2500, 3000),
        # Megabyte records make the kill land inside a write now and then: a real torn tail.
        (4, 40, 1_000_000),
    ],
)
@pytest.mark.chaos
def test_kill_9_mid_burst_keeps_every_record_reported_durable(
    tmp_path: Path, runs: int, kill_after: int, size: int
) -> None:
    root = tmp_path / "journal"
    durable = burst_then_kill(root, runs, kill_after, size)
    assert len(durable) == runs

    journal = RunJournal(root)
    for run_id, last_durable in durable.items():
        before = journal.read("crash", run_id, strict=True)
        # No corrupt record: every complete line decodes and seqs run 1, 2, 3...
        assert before["malformed"] == []
        seqs = [event["seq"] for event in before["events"]]
        assert seqs == list(range(1, len(seqs) + 1))
        # Every record reported durable is there (more may be: written, not yet reported).
        assert len(seqs) >= last_durable
        assert all(event["payload"]["i"] == event["seq"] - 1 for event in before["events"])

        # Reopening repairs a torn tail, so the next append lands on its own line.
        record = journal.append("crash", run_id, "done", {})
        assert record["seq"] == len(seqs) + 1
        after = journal.read("crash", run_id, strict=True)
        assert (after["malformed"], after["incomplete_tail"]) == ([], False)
        assert after["events"][-1] == record
        assert journal.summary("crash", run_id)["terminal_state"] == "completed"
    assert journal.statistics().torn_repairs <= runs
