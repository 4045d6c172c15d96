"""`corral journal ls|show|summary|tail`, with and without a running host.

The commands read the files under the state dir directly; they must never modify them.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from corral.actors.journal import JournalAppend, JournalAppended
from corral.bus import open_peer
from corral.config import LivenessSettings
from corral.journal import RunJournal
from tests.conftest import HostProcess, corral

FAST = LivenessSettings(interval_s=0.2, liveness=3)

OBSERVED = {
    "session_id": "session-a",
    "stream_id": "run-a",
    "model": "backup",
    "provider": "custom",
    "fallback_active": True,
    "phase": "observed_output",
}


def _seed(state_dir: Path) -> RunJournal:
    """Two sessions written by the library alone (no host): one finished run, one running."""
    journal = RunJournal(state_dir / "journal")
    journal.append("session-a", "run-a", "runtime_model", OBSERVED)
    journal.append("session-a", "run-a", "token", {"text": "Hel"})
    journal.append("session-a", "run-a", "token", {"text": "lo"})
    journal.append("session-a", "run-a", "done", None)
    journal.append("session-a", "run-b", "token", {"text": "still going"})
    journal.append("session-b", "run-c", "token", {"text": "other"})
    journal.close()
    return journal


def _digests(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def _json(*args: str, state_dir: Path) -> Any:
    out = corral("journal", *args, "--json", "--state-dir", str(state_dir))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.fixture
def seeded(tmp_path: Path) -> Iterator[tuple[Path, RunJournal]]:
    state_dir = tmp_path / "state"
    journal = _seed(state_dir)
    before = _digests(state_dir)
    yield state_dir, journal
    # Reading never changes a byte, whatever the command did.
    assert _digests(state_dir) == before


# --- without a host ----------------------------------------------------------------------------


def test_ls_lists_sessions_then_runs(seeded: tuple[Path, RunJournal]) -> None:
    state_dir, journal = seeded
    data = _json("ls", state_dir=state_dir)
    assert [row["session_id"] for row in data["sessions"]] == ["session-a", "session-b"]
    assert [row["runs"] for row in data["sessions"]] == [2, 1]
    size = journal.path("session-b", "run-c").stat().st_size
    assert data["sessions"][1]["bytes"] == size and data["sessions"][1]["modified_at"] > 0

    runs = _json("ls", "session-a", state_dir=state_dir)
    assert runs["session_id"] == "session-a"
    assert [row["run_id"] for row in runs["runs"]] == ["run-a", "run-b"]
    run_a, run_b = runs["runs"]
    assert run_a == {**journal.summary("session-a", "run-a"), "bytes": run_a["bytes"]}
    assert run_a["terminal_state"] == "completed" and run_a["runtime_model"] == OBSERVED
    assert run_b["terminal_state"] == "running" and run_b["last_seq"] == 1

    human = corral("journal", "ls", "session-a", "--state-dir", str(state_dir))
    assert human.returncode == 0, human.stderr
    assert "run-a" in human.stdout and "completed" in human.stdout and "backup" in human.stdout


def test_ls_of_an_empty_state_dir_lists_nothing(tmp_path: Path) -> None:
    assert _json("ls", state_dir=tmp_path / "nothing") == {"sessions": []}
    assert not (tmp_path / "nothing").exists()


def test_show_replays_a_run_from_a_cursor(seeded: tuple[Path, RunJournal]) -> None:
    state_dir, journal = seeded
    data = _json("show", "session-a", "run-a", state_dir=state_dir)
    assert data == journal.read("session-a", "run-a")
    assert [e["event"] for e in data["events"]] == ["runtime_model", "token", "token", "done"]
    assert data["events"][3]["payload"] == {}

    after = _json("show", "session-a", "run-a", "--after", "2", state_dir=state_dir)
    assert [e["seq"] for e in after["events"]] == [3, 4]
    by_id = _json("show", "session-a", "run-a", "--after", "run-a:3", state_dir=state_dir)
    assert [e["seq"] for e in by_id["events"]] == [4]
    page = _json("show", "session-a", "run-a", "--limit", "1", state_dir=state_dir)
    assert [e["seq"] for e in page["events"]] == [1]
    assert page["complete"] is False and page["next_after_seq"] == 1

    human = corral("journal", "show", "session-a", "run-a", "--state-dir", str(state_dir))
    assert human.returncode == 0, human.stderr
    assert "runtime_model" in human.stdout and '{"text":"Hel"}' in human.stdout
    limited = corral(
        "journal", "show", "session-a", "run-a", "--limit", "2", "--state-dir", str(state_dir)
    )
    assert "continue with --after 2" in limited.stderr


def test_summary_is_the_library_summary(seeded: tuple[Path, RunJournal]) -> None:
    state_dir, journal = seeded
    data = _json("summary", "session-a", "run-a", state_dir=state_dir)
    assert data == journal.summary("session-a", "run-a")
    assert data["runtime_model"] == OBSERVED and data["terminal_state"] == "completed"
    env = {"CORRAL_STATE_DIR": str(state_dir)}
    human = corral("journal", "summary", "session-a", "run-b", env=env)
    assert human.returncode == 0, human.stderr
    assert "running" in human.stdout and "run-b:1" in human.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["ls", "no-session"],
        ["show", "no-session", "run-a"],
        ["show", "session-a", "no-run"],
        ["summary", "session-a", "no-run"],
        ["summary", "session-b", "run-a"],
        ["tail", "session-a", "no-run"],
        ["tail", "no-session"],
    ],
)
def test_unknown_session_or_run_exits_1(seeded: tuple[Path, RunJournal], args: list[str]) -> None:
    state_dir, _ = seeded
    out = corral("journal", *args, "--json", "--state-dir", str(state_dir))
    assert out.returncode == 1, out
    assert "no journal for" in out.stderr
    assert json.loads(out.stdout)["error"]["code"] == "not_found"  # the one document (#19)


@pytest.mark.parametrize(
    "args",
    [
        ["ls", "../x"],
        ["show", "a/b", "run-a"],
        ["show", "session-a", "../run-a"],
        ["show", "session-a", ""],
        ["summary", "..", "run-a"],
        ["tail", "session-a", "a/b"],
        ["show", "session-a", "run-a", "--after", "not-a-cursor"],
    ],
)
def test_invalid_ids_and_cursors_exit_2(seeded: tuple[Path, RunJournal], args: list[str]) -> None:
    state_dir, _ = seeded
    out = corral("journal", *args, "--json", "--state-dir", str(state_dir))
    assert out.returncode == 2, out
    assert "Invalid value" in out.stderr
    assert json.loads(out.stdout)["error"]["code"] == "usage"  # the one document (#19)


def test_reading_leaves_a_torn_tail_alone(seeded: tuple[Path, RunJournal]) -> None:
    state_dir, journal = seeded
    path = journal.path("session-a", "run-b")
    with path.open("ab") as f:
        f.write(b'{"version":1,"event_id":"run-b:2","seq":2,"run_')
    torn = path.read_bytes()
    data = _json("show", "session-a", "run-b", state_dir=state_dir)
    assert data["incomplete_tail"] is True and [e["seq"] for e in data["events"]] == [1]
    assert _json("summary", "session-a", "run-b", state_dir=state_dir)["last_seq"] == 1
    assert _json("ls", "session-a", state_dir=state_dir)["runs"][1]["last_seq"] == 1
    assert path.read_bytes() == torn
    # Put the file back the way the fixture found it.
    path.write_bytes(torn[: torn.rfind(b"\n") + 1])


# --- tail ----------------------------------------------------------------------------------------


class _Tail:
    """`corral journal tail` as a subprocess, its stdout read line by line by a thread."""

    def __init__(self, state_dir: Path, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "corral", "journal", "tail", *args, "--interval", "0.05"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "CORRAL_STATE_DIR": str(state_dir)},
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def take(self, count: int, timeout: float = 10.0) -> list[str]:
        """The next ``count`` lines, or fail once ``timeout`` seconds have passed."""
        deadline = time.monotonic() + timeout
        taken = []
        while len(taken) < count:
            remaining = deadline - time.monotonic()
            try:
                taken.append(self.lines.get(timeout=max(remaining, 0.001)))
            except queue.Empty:
                stderr = self.proc.stderr.read() if self.proc.poll() is not None else ""
                raise AssertionError(f"tail printed {taken} then nothing; {stderr}") from None
        return taken

    def stop(self) -> int:
        self.proc.terminate()
        code = self.proc.wait(10)
        self._reader.join(5)
        return code


def test_tail_follows_a_run_as_ndjson(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    _seed(state_dir)
    tail = _Tail(state_dir, "session-a", "run-b", "--json")
    try:
        (first,) = [json.loads(line) for line in tail.take(1)]
        assert first["seq"] == 1 and first["payload"] == {"text": "still going"}
        # Only now does the run grow: what follows must come from following the file.
        writer = RunJournal(state_dir / "journal")
        writer.append("session-a", "run-b", "token", {"text": " and going"})
        writer.append("session-a", "run-b", "done", {})
        writer.close()
        records = [json.loads(line) for line in tail.take(2)]
        assert [r["seq"] for r in records] == [2, 3]
        assert records[1]["terminal_state"] == "completed"
        assert tail.lines.empty()
    finally:
        assert tail.stop() == 0


def test_tail_without_run_follows_new_runs_of_the_session(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    journal = RunJournal(state_dir / "journal")
    journal.append("s", "old", "token", {"n": 1})
    journal.append("s", "old", "token", {"n": 2})
    tail = _Tail(state_dir, "s", "-n", "1")
    try:
        (line,) = tail.take(1)
        assert "old:2" in line and '{"n":2}' in line and "old:1" not in line
        journal.append("s", "new", "token", {"n": 3})
        journal.append("s", "old", "done", {})
        found = "".join(tail.take(2))
        assert "new:1" in found and '{"n":3}' in found
        assert "old:3" in found and "[completed]" in found
    finally:
        assert tail.stop() == 0
        journal.close()


def test_tail_wait_picks_up_a_run_that_starts_later(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    tail = _Tail(state_dir, "late", "run", "--wait", "--json")
    try:
        journal = RunJournal(state_dir / "journal")
        journal.append("late", "run", "token", {"n": 1})
        journal.close()
        (line,) = tail.take(1)
        assert json.loads(line)["event_id"] == "run:1"
    finally:
        assert tail.stop() == 0


# --- with a running host -----------------------------------------------------------------------


async def test_commands_read_what_the_running_journal_actor_writes(host: HostProcess) -> None:
    state_dir = host.state_dir
    tail = await trio.to_thread.run_sync(lambda: _Tail(state_dir, "live", "--wait", "--json"))
    try:
        async with open_peer("test-client", host.endpoint, liveness=FAST) as peer:
            first = await peer.call(
                "journal", JournalAppend.one("live", "run-1", "token", {"n": 1})
            )
            assert isinstance(first, JournalAppended)
            # The session did not exist when tail started (--wait): it appears, and then
            # every later record must come from following the files.
            (line,) = await trio.to_thread.run_sync(tail.take, 1)
            assert json.loads(line)["event_id"] == "run-1:1"
            for n in range(2, 5):
                await peer.call("journal", JournalAppend.one("live", "run-1", "token", {"n": n}))
            await peer.call("journal", JournalAppend.one("live", "run-2", "done", {}), durable=True)
            lines = await trio.to_thread.run_sync(tail.take, 4)
        records = [json.loads(line) for line in lines]
        assert [(r["run_id"], r["seq"]) for r in records] == [
            ("run-1", 2),
            ("run-1", 3),
            ("run-1", 4),
            ("run-2", 1),
        ]

        def cli(*args: str) -> Any:
            return _json(*args, state_dir=state_dir)

        listing = await trio.to_thread.run_sync(cli, "ls")
        assert [row["session_id"] for row in listing["sessions"]] == ["live"]
        runs = await trio.to_thread.run_sync(cli, "ls", "live")
        assert [(row["run_id"], row["last_seq"]) for row in runs["runs"]] == [
            ("run-1", 4),
            ("run-2", 1),
        ]
        shown = await trio.to_thread.run_sync(cli, "show", "live", "run-1", "--after", "run-1:2")
        assert [e["payload"]["n"] for e in shown["events"]] == [3, 4]
        summary = await trio.to_thread.run_sync(cli, "summary", "live", "run-2")
        assert summary["terminal_state"] == "completed" and summary["last_seq"] == 1
    finally:
        code = await trio.to_thread.run_sync(tail.stop)
    assert code == 0
