"""A CLI child of a harness worker: JSON lines both ways, bounded, and never left behind.

The CLI is a small Python program (``_FAKE``) that answers each line it reads; the tests
that kill things use real processes and check them in ``/proc``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import trio

from corral.harnesses import _cli_process
from corral.harnesses._cli_process import CliError, CliExited, open_cli
from tests.conftest import wait_until

_FAKE = textwrap.dedent(
    """
    import json, os, subprocess, sys
    print("starting up (not JSON)", flush=True)
    for line in sys.stdin:
        msg = json.loads(line)
        if msg["op"] == "echo":
            print(json.dumps({"echo": msg["value"]}), flush=True)
        elif msg["op"] == "list":
            print(json.dumps([1, 2]), flush=True)
        elif msg["op"] == "child":
            child = subprocess.Popen(["sleep", "60"])
            print(json.dumps({"child": child.pid, "me": os.getpid()}), flush=True)
        elif msg["op"] == "command":
            # As the Codex app-server runs a command: a shell in a session of its own, whose
            # child starts one more (as bwrap does); and a helper in the CLI's session, which
            # must be spared.
            inner = "exec setsid sh -c 'sleep 60 & wait'"
            shell = subprocess.Popen(["sh", "-c", inner + " & wait"], start_new_session=True)
            helper = subprocess.Popen(["sleep", "60"])
            print(json.dumps({"shell": shell.pid, "helper": helper.pid}), flush=True)
        elif msg["op"] == "die":
            sys.stderr.write("something broke\\n" * 3 + "last words\\n")
            sys.exit(4)
        elif msg["op"] == "huge":
            sys.stdout.write("x" * (msg["size"]) + "\\n")
            sys.stdout.flush()
    """
)


def _argv(tmp_path: Path) -> list[str]:
    path = tmp_path / "fake_cli.py"
    path.write_text(_FAKE)
    return [sys.executable, str(path)]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


async def test_json_lines_both_ways_and_stray_lines_are_skipped(tmp_path: Path) -> None:
    async with open_cli(_argv(tmp_path), env=dict(os.environ), cwd=tmp_path) as cli:
        await cli.send({"op": "echo", "value": "ü and \n"})
        assert await cli.receive() == {"echo": "ü and \n"}
        await cli.send({"op": "list"})  # a JSON line that is not an object: skipped
        await cli.send({"op": "echo", "value": 2})
        assert await cli.receive() == {"echo": 2}


async def test_an_exit_is_reported_with_its_code_and_stderr(tmp_path: Path) -> None:
    async with open_cli(_argv(tmp_path), env=dict(os.environ), cwd=tmp_path) as cli:
        await cli.send({"op": "die"})
        with pytest.raises(CliExited) as caught:
            await cli.receive()
    assert caught.value.returncode == 4
    assert "exit code 4" in str(caught.value)
    assert str(caught.value).endswith("last words")
    assert "something broke" in caught.value.stderr


async def test_a_cli_that_dies_at_start_is_reported_with_its_last_words(tmp_path: Path) -> None:
    """Its stdout and stderr end together, before the stderr reader has run: the error waits
    for the reader (ten times: the race is the scheduler's)."""
    argv = ["sh", "-c", "echo 'no provider configured' >&2; exit 3"]
    for _ in range(10):
        async with open_cli(argv, env=dict(os.environ), cwd=tmp_path) as cli:
            with pytest.raises(CliExited) as caught:
                await cli.receive()
        assert str(caught.value) == "sh ended its output (exit code 3): no provider configured"


async def test_a_line_over_the_limit_is_an_error_not_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_cli_process, "MAX_LINE_BYTES", 100_000)
    async with open_cli(_argv(tmp_path), env=dict(os.environ), cwd=tmp_path) as cli:
        await cli.send({"op": "huge", "size": 300_000})
        with pytest.raises(CliError, match="over 100000 bytes"):
            await cli.receive()


async def test_a_cli_that_cannot_start_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(CliError, match="cannot start"):
        async with open_cli([str(tmp_path / "absent")], env={}, cwd=tmp_path):
            pass


async def test_leaving_the_block_ends_the_cli_and_its_children(tmp_path: Path) -> None:
    async with open_cli(_argv(tmp_path), env=dict(os.environ), cwd=tmp_path) as cli:
        await cli.send({"op": "child"})
        pids = await cli.receive()
    assert not _alive(pids["me"])
    assert not _alive(pids["child"])


def _children_of(pid: int) -> list[int]:
    return [p for p, (ppid, _) in _cli_process._process_table().items() if ppid == pid]


async def test_end_commands_ends_the_commands_the_cli_started_and_spares_the_cli(
    tmp_path: Path,
) -> None:
    async with open_cli(_argv(tmp_path), env=dict(os.environ), cwd=tmp_path) as cli:
        await cli.send({"op": "command"})
        pids = await cli.receive()
        shell = pids["shell"]
        # The shell's child, in a session of its own, and its child.
        inner = wait_until(lambda: _children_of(shell), what="the shell's child")[0]
        sleep = wait_until(lambda: _children_of(inner), what="the inner shell's child")[0]
        table = _cli_process._process_table()
        assert table[inner][1] == inner != table[shell][1]
        assert cli.end_commands() == 3
        wait_until(lambda: not any(map(_alive, (shell, inner, sleep))), what="the command ended")
        assert _alive(pids["helper"])
        await cli.send({"op": "echo", "value": "still here"})
        assert await cli.receive() == {"echo": "still here"}


_WORKER = textwrap.dedent(
    """
    import json, os, sys, trio
    from corral.harnesses._cli_process import open_cli

    async def main():
        async with open_cli([sys.executable, sys.argv[1]], env=dict(os.environ), cwd=".") as cli:
            await cli.send({"op": "echo", "value": "up"})
            await cli.receive()
            print(json.dumps({"cli": cli.pid}), flush=True)
            await trio.sleep_forever()

    trio.run(main)
    """
)


def test_a_cli_dies_with_its_worker_on_kill_9(tmp_path: Path) -> None:
    """PDEATHSIG from the trio thread: a kill -9 of the worker leaves no CLI acting."""
    fake = tmp_path / "fake_cli.py"
    fake.write_text(_FAKE)
    worker = subprocess.Popen(
        [sys.executable, "-c", _WORKER, str(fake)], stdout=subprocess.PIPE, cwd=tmp_path
    )
    try:
        assert worker.stdout is not None
        cli_pid = json.loads(worker.stdout.readline())["cli"]
        assert _alive(cli_pid)
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        wait_until(lambda: not _alive(cli_pid), timeout=10, what="the CLI to die with its worker")
    finally:
        worker.kill()
        worker.wait()


async def test_send_after_the_cli_exited_is_cli_exited(tmp_path: Path) -> None:
    async with open_cli(_argv(tmp_path), env=dict(os.environ), cwd=tmp_path) as cli:
        await cli.send({"op": "die"})
        await cli.wait()
        with pytest.raises(CliExited):
            for _ in range(100):  # a pipe's buffer may take the first writes
                await cli.send({"op": "echo", "value": "x" * 10_000})
                await trio.lowlevel.checkpoint()
