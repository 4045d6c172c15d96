"""OS processes: spawn by exec, wait through a pidfd, kill, describe exits, sweep orphans.

Children always start by exec (``subprocess.Popen`` from the trio thread), never by a bare
fork: a forked child that inherits a zmq context silently loses sends. Each child is the
leader of its own session/process group, so that killing it kills what it started, and it
arranges in :mod:`corral.actors._entry` to die with its parent (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import trio


def spawn(
    argv: list[str], *, env: dict[str, str], cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start a child by exec in its own process group.

    Runs in the calling (trio) thread on purpose: ``PR_SET_PDEATHSIG`` fires when the
    *thread* that forked the child exits, and trio's worker threads come and go.
    """
    return subprocess.Popen(
        argv,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        close_fds=True,
        start_new_session=True,
    )


async def wait_exit(proc: subprocess.Popen[bytes]) -> int:
    """Wait (without a thread) until the process exits; return its returncode."""
    if proc.poll() is not None:
        return proc.returncode
    try:
        pidfd = os.pidfd_open(proc.pid)
    except ProcessLookupError:
        return proc.wait()
    try:
        while proc.poll() is None:
            await trio.lowlevel.wait_readable(pidfd)
    finally:
        trio.lowlevel.notify_closing(pidfd)
        os.close(pidfd)
    return proc.returncode


def describe_exit(returncode: int, *, reason: str | None = None) -> dict[str, Any]:
    """The ``last_exit`` shape of ``corral status``: code, reason, at."""
    if reason is None:
        if returncode < 0:
            try:
                name = signal.Signals(-returncode).name
            except ValueError:
                name = f"signal {-returncode}"
            reason = f"killed by signal {-returncode} ({name})"
        else:
            reason = f"exited with code {returncode}"
    return {"code": returncode, "reason": reason, "at": time.time()}


def kill_group(pid: int, sig: int) -> None:
    """Send ``sig`` to a child's process group (and the child), ignoring the already-dead."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


async def terminate(proc: subprocess.Popen[bytes], timeout: float) -> int:
    """SIGTERM, wait up to ``timeout`` seconds, then SIGKILL; return the returncode."""
    if proc.poll() is None:
        kill_group(proc.pid, signal.SIGTERM)
        with trio.move_on_after(timeout):
            return await wait_exit(proc)
        kill_group(proc.pid, signal.SIGKILL)
    return await wait_exit(proc)


def start_time(pid: int) -> int | None:
    """The kernel's start time of ``pid`` (guards against pid reuse), or None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may contain spaces; fields after it are plain.
    return int(stat.rsplit(")", 1)[1].split()[19])


def alive(pid: int, started: int | None) -> bool:
    """Whether ``pid`` is still the very process that started at ``started``."""
    now = start_time(pid)
    return now is not None and (started is None or now == started)


def write_pidfile(path: Path, pid: int, **extra: object) -> None:
    """Record a child for the start-up sweep of a later host."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"pid": pid, "start_time": start_time(pid), **extra}))


def sweep(children_dir: Path) -> list[int]:
    """Kill leftovers of an earlier host that died without stopping its children.

    Returns the pids that were still alive and got SIGKILL.
    """
    killed: list[int] = []
    if not children_dir.is_dir():
        return killed
    for pidfile in children_dir.glob("*.pid"):
        try:
            info = json.loads(pidfile.read_text())
            pid, started = int(info["pid"]), info.get("start_time")
        except (ValueError, KeyError, OSError):
            pidfile.unlink(missing_ok=True)
            continue
        if alive(pid, started):
            kill_group(pid, signal.SIGCONT)
            kill_group(pid, signal.SIGKILL)
            killed.append(pid)
        pidfile.unlink(missing_ok=True)
    return killed
