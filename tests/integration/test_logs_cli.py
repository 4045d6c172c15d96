"""Logs through real hosts, as a user reads them: every process of a host logs one format
to stderr and the ``[logging] file``; a traceback is one record; third-party INFO lines are
gone; a bad level or file is a config error naming its key (exit 2); ``corral logs`` reads
the file back with its filters, and follows it.

One host for the module (logfmt, with the embedded control plane, a harness whose worker
fails to load so that a worker logs a traceback); a second, short-lived one logs JSON."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.logs import parse_line
from tests.conftest import FAST_LIVENESS, HostProcess, corral, wait_until
from tests.integration.test_e2e import _start

BROKEN_AGENT = """
    name: broken
    executor:
      harness: broken
    prompt: never runs
"""


def _config(root: Path, extra: str = "") -> str:
    agents = root / "agents"
    agents.mkdir(parents=True, exist_ok=True)
    (agents / "broken.yaml").write_text(textwrap.dedent(BROKEN_AGENT))
    return (
        FAST_LIVENESS
        + f"[server]\nagents_dirs = [{json.dumps(str(agents))}]\n"
        + '[actors.harness.options.harnesses]\nbroken = "tests.integration._broken_harness:X"\n'
        + extra
    )


def _records(text: str) -> list[dict[str, Any]]:
    return [parse_line(line) or {"unparsed": line} for line in text.splitlines()]


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HostProcess, str]]:
    """The module's host, after one session of the broken agent: (host, its session id)."""
    root = tmp_path_factory.mktemp("logs")
    host = HostProcess(
        root / "state", _config(root, '[logging]\nfile = "logs/corral.log"\nlevel = "info"\n')
    )
    _start(host)
    try:
        out = _cli(host, "send", "--agent", "broken", "hi", "--json")
        assert out.returncode == 1, out
        yield host, json.loads(out.stdout)["session_id"]
    finally:
        if host.proc is not None and host.proc.poll() is None:
            host.stop()


def _cli(host: HostProcess, *args: str) -> subprocess.CompletedProcess:
    return corral(*args, "--state-dir", str(host.state_dir))


def test_every_process_logs_one_record_per_line_to_stderr_and_the_file(
    logged: tuple[HostProcess, str],
) -> None:
    host, session = logged
    path = host.config_path.parent / "logs" / "corral.log"
    assert path.stat().st_mode & 0o777 == 0o600
    in_file = _records(path.read_text())
    on_stderr = _records(host.log())
    assert in_file and all("unparsed" not in r for r in in_file), in_file
    assert all("unparsed" not in r for r in on_stderr), [r for r in on_stderr if "unparsed" in r]
    procs = {r["proc"] for r in in_file}
    assert {"host", "server", "journal", "gateway", "worker"} <= procs, procs
    assert {r["proc"] for r in on_stderr} == procs
    # The worker says which session it serves; no library's INFO line made it.
    assert {r.get("session") for r in in_file if r["proc"] == "worker"} == {session}
    assert not [r for r in in_file if r["logger"].split(".")[0] in ("httpx", "hypercorn")]


def test_a_traceback_is_one_record(logged: tuple[HostProcess, str]) -> None:
    host, _ = logged
    out = _cli(host, "logs", "--actor", "worker", "--level", "error", "--json")
    assert out.returncode == 0, out
    [record] = [json.loads(line) for line in out.stdout.splitlines()]
    assert record["msg"] == "cannot load harness tests.integration._broken_harness:X"
    assert record["exc"].startswith("Traceback (most recent call last):\n")
    assert record["exc"].endswith("RuntimeError: this harness is broken on purpose")
    raw = [line for line in host.log().splitlines() if "cannot load harness" in line]
    assert len(raw) == 1 and '\\nRuntimeError: this harness is broken on purpose"' in raw[0]
    assert "Traceback" not in host.log().replace('exc="Traceback', "")


def test_corral_logs_filters_by_actor_session_and_level(logged: tuple[HostProcess, str]) -> None:
    host, session = logged
    every = _cli(host, "logs")
    assert every.returncode == 0, every
    lines = every.stdout.splitlines()
    assert len(lines) >= 8 and all(line.startswith("ts=") for line in lines)
    mine = _records(_cli(host, "logs", "--session", session[:8]).stdout)
    assert {"server", "harness", "worker"} <= {r["proc"] for r in mine}, mine
    assert all(session in r.get("session", "") + r["msg"] for r in mine)
    hosts = _records(_cli(host, "logs", "--actor", "host", "--actor", "journal").stdout)
    assert hosts and {r["proc"] for r in hosts} == {"host", "journal"}
    assert _records(_cli(host, "logs", "--level", "error").stdout) == [
        r for r in _records(every.stdout) if r["level"] in ("error", "critical")
    ]
    last = _cli(host, "logs", "-n", "2").stdout.splitlines()
    assert last == lines[-2:]
    nothing = _cli(host, "logs", "--actor", "nosuch")
    assert (nothing.returncode, nothing.stdout) == (0, "")


def _read_lines(proc: subprocess.Popen, until: str, timeout: float) -> list[str]:
    """Lines of ``proc``'s stdout until one contains ``until``."""
    assert proc.stdout is not None
    lines: list[str] = []
    buffer = b""
    deadline = time.monotonic() + timeout
    while not any(until in line for line in lines):
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"no {until!r} in {lines}"
        ready, _, _ = select.select([proc.stdout], [], [], remaining)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 65536)
            assert chunk, f"corral logs -f ended: {lines}"
            buffer += chunk
            *done, rest = buffer.split(b"\n")
            buffer = rest
            lines += [line.decode() for line in done]
    return lines


def test_corral_logs_follows_the_file(logged: tuple[HostProcess, str]) -> None:
    host, _ = logged
    proc = subprocess.Popen(
        [sys.executable, "-m", "corral", "logs", "-f", "-n", "1", "--actor", "server"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "CORRAL_STATE_DIR": str(host.state_dir)},
    )
    try:
        first = _read_lines(proc, "ts=", 20)
        assert len(first) == 1 and "proc=server" in first[0]
        out = _cli(host, "send", "--agent", "broken", "again", "--json")
        new = json.loads(out.stdout)["session_id"]
        later = _read_lines(proc, f"session {new} created", 30)
        assert all("proc=server" in line for line in later)
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_host_logs_json_lines_with_log_format_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = HostProcess(
        tmp_path / "state",
        FAST_LIVENESS + '[server]\nenabled = false\n[logging]\nfile = "json.log"\n',
    )
    monkeypatch.setenv("CORRAL_LOG_FORMAT", "json")
    host.start()
    try:
        wait_until(lambda: "corral host up" in host.log(), 30, "the host's up line")
    finally:
        host.stop()
    records = [json.loads(line) for line in host.log().splitlines()]
    assert {"host", "journal"} <= {r["proc"] for r in records}
    assert all(list(r)[:4] == ["ts", "level", "proc", "pid"] for r in records)
    # corral logs reads a JSON file back: as logfmt, or the same records with --json.
    path = str(host.config_path.parent / "json.log")
    text = corral("logs", "--file", path, "--actor", "host").stdout.splitlines()
    assert text and all(line.startswith("ts=") and " proc=host " in line for line in text)
    again = corral("logs", "--file", path, "--json").stdout.splitlines()
    # The file's own records, in its order: the processes write stderr and the file apart,
    # so two records can land in the two in different orders (it failed CI once so).
    in_file = [json.loads(line) for line in Path(path).read_text().splitlines()]
    assert {"host", "journal"} <= {r["proc"] for r in in_file}
    assert [json.loads(line) for line in again] == in_file


@pytest.mark.parametrize(
    ("env", "config", "named"),
    [
        ({"CORRAL_LOG_LEVEL": "verbose"}, "", "invalid CORRAL_LOG_LEVEL 'verbose'"),
        ({}, '[logging]\nlevel = "verbose"\n', "$.logging.level"),
        ({}, '[logging]\nformat = "yaml"\n', "$.logging.format"),
        ({}, "[logging]\nmax_bytes = 0\n", "$.logging.max_bytes"),
        ({}, '[logging]\nfile = "taken/corral.log"\n', "logging.file: "),
    ],
)
def test_a_bad_logging_setting_exits_2_naming_it(
    tmp_path: Path, env: dict[str, str], config: str, named: str
) -> None:
    (tmp_path / "taken").write_text("a file, not a directory")
    (tmp_path / "corral.toml").write_text(config)
    out = corral(
        "up",
        "--config",
        str(tmp_path / "corral.toml"),
        "--state-dir",
        str(tmp_path / "s"),
        env=env,
    )
    assert out.returncode == 2, out
    assert named in out.stderr.replace("\n", " ")
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "s" / "host.json").exists()


def test_corral_logs_without_a_log_file_says_how_to_get_one(tmp_path: Path) -> None:
    out = corral("logs", "--state-dir", str(tmp_path / "none"))
    assert out.returncode == 1
    assert "sets no [logging] file" in out.stderr
    out = corral("logs", "--file", str(tmp_path / "missing.log"))
    assert out.returncode == 1
    assert "does not exist" in out.stderr
    (tmp_path / "bad.toml").write_text("[logging]\nfle = 1\n")
    out = corral("logs", "--config", str(tmp_path / "bad.toml"), "--state-dir", str(tmp_path))
    assert out.returncode == 2
    assert "logging" in out.stderr and "fle" in out.stderr


def test_the_control_plane_on_its_own_checks_its_logging_settings_too(tmp_path: Path) -> None:
    """``python -m corral.server`` started by hand reads [logging] of its config (a host
    hands its own settings to the one it starts)."""
    (tmp_path / "corral.toml").write_text('[logging]\nlevel = "verbose"\n')
    argv = [sys.executable, "-m", "corral.server", "--state-dir", str(tmp_path / "s")]
    out = subprocess.run(
        [*argv, "--config", str(tmp_path / "corral.toml")], capture_output=True, text=True
    )
    assert out.returncode == 2 and "$.logging.level" in out.stderr, out
    env = {**os.environ, "CORRAL_LOG_LEVEL": "loud"}
    out = subprocess.run(argv, capture_output=True, text=True, env=env)
    assert out.returncode == 2 and "invalid CORRAL_LOG_LEVEL 'loud'" in out.stderr, out
