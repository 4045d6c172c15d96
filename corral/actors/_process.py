"""OS processes: spawn by exec, wait through a pidfd, kill, describe exits, sweep orphans,
adopt and reap the processes a dead harness actor left to the host.

Children start by exec (``subprocess.Popen`` from the trio thread), never by a bare fork: a
forked child that inherits a zmq context silently loses sends. (Harness workers are forked
from a zygote, :mod:`corral._zygote`, a process that never has a zmq context, a thread or a
trio run.) Each child is the leader of its own session/process group, so that killing it
kills what it started. An actor
arranges in :mod:`corral.actors._entry` to die with its parent (``PR_SET_PDEATHSIG``); a
harness worker dies with the host instead (:mod:`corral._lifeline`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import subprocess
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, Protocol

import trio

from .._child_env import HIDDEN_ENV_FD, hand_over, split_hidden
from .._lifeline import start_time as start_time

log = logging.getLogger("corral.process")

#: What :meth:`Adopted.poll` returns once the process is gone: not an exit status any
#: process has, because an adopted process's status goes to its parent, not to us.
UNKNOWN_EXIT = 1 << 16


class Adopted:
    """A live process this one did not start, watched through a pidfd: a dead harness
    actor's worker that its next incarnation took over. It has :class:`subprocess.Popen`'s
    ``pid``, ``poll()`` and ``returncode`` (:data:`UNKNOWN_EXIT` once it is gone)."""

    def __init__(self, pid: int, pidfd: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._pidfd = pidfd

    @classmethod
    def open(cls, pid: int, started: int | None) -> Adopted | None:
        """Take ``pid`` if it is still the process that started at ``started``."""
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            return None
        # Checked after the pidfd is open: it cannot be of a process that reused the pid.
        if not alive(pid, started):
            os.close(pidfd)
            return None
        return cls(pid, pidfd)

    def poll(self) -> int | None:
        """``UNKNOWN_EXIT`` once the process has exited, else None."""
        if self.returncode is None and select.select([self._pidfd], [], [], 0)[0]:
            self.returncode = UNKNOWN_EXIT
            os.close(self._pidfd)
        return self.returncode

    async def wait(self) -> int:
        """Wait (without a thread) until the process exits. Each waiter (the supervisor's
        watch, a stop) waits on a pidfd of its own: trio lets one task wait on an fd."""
        if self.poll() is None:
            await _wait_on_pidfd(os.dup(self._pidfd), lambda: self.poll() is not None)
        return UNKNOWN_EXIT


class Watched(Protocol):
    """A process that is not this one's child, held like :class:`subprocess.Popen`:
    :class:`Adopted`, or one a zygote forked (:class:`corral._zygote.Forked`)."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...

    async def wait(self) -> int: ...


#: A supervised child's process: spawned here by exec, adopted, or forked by a zygote.
Process = subprocess.Popen[bytes] | Watched
#: What starts a child: :func:`spawn`'s signature.
Spawn = Callable[..., Process]


def spawn(
    argv: list[str], *, env: dict[str, str], cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start a child by exec in its own process group.

    The variables ``env`` names in :data:`~corral._child_env.HIDDEN_ENV` are not in the
    child's environ block (which every process of the user can read in
    ``/proc/PID/environ``): they reach it through a memfd it inherits, which its
    :func:`~corral._child_env.take_hidden_env` reads.

    Runs in the calling (trio) thread on purpose: ``PR_SET_PDEATHSIG`` fires when the
    *thread* that forked the child exits, and trio's worker threads come and go.
    """
    shown, hidden = split_hidden(env)
    fd = hand_over(hidden) if hidden else None
    if fd is not None:
        shown[HIDDEN_ENV_FD] = str(fd)
    try:
        return subprocess.Popen(
            argv,
            env=shown,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            close_fds=True,
            pass_fds=() if fd is None else (fd,),
            start_new_session=True,
        )
    finally:
        if fd is not None:
            os.close(fd)


async def wait_exit(proc: Process) -> int:
    """Wait (without a thread) until the process exits; return its returncode."""
    if not isinstance(proc, subprocess.Popen):
        return await proc.wait()
    if proc.poll() is not None:
        return proc.returncode
    try:
        pidfd = os.pidfd_open(proc.pid)
    except ProcessLookupError:
        return proc.wait()
    await _wait_on_pidfd(pidfd, lambda: proc.poll() is not None)
    return proc.returncode


async def _wait_on_pidfd(pidfd: int, exited: Callable[[], bool]) -> None:
    """Wait until ``exited()`` holds, woken by ``pidfd`` (which this closes)."""
    try:
        while not exited():
            await trio.lowlevel.wait_readable(pidfd)
    finally:
        trio.lowlevel.notify_closing(pidfd)
        os.close(pidfd)


def describe_exit(returncode: int, *, reason: str | None = None) -> dict[str, Any]:
    """The ``last_exit`` shape of ``corral status``: code, reason, at (the code None when
    the process was adopted, its status unknown)."""
    code: int | None = returncode
    if returncode == UNKNOWN_EXIT:
        code = None
        reason = reason or "exited (status unknown: adopted, not our child)"
    if reason is None:
        if returncode < 0:
            try:
                name = signal.Signals(-returncode).name
            except ValueError:
                name = f"signal {-returncode}"
            reason = f"killed by signal {-returncode} ({name})"
        else:
            reason = f"exited with code {returncode}"
    return {"code": code, "reason": reason, "at": time.time()}


def kill_group(pid: int, sig: int) -> None:
    """Send ``sig`` to a child's process group (and the child), ignoring the already-dead."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


async def terminate(proc: Process, timeout: float) -> int:
    """SIGTERM, wait up to ``timeout`` seconds, then SIGKILL; return the returncode."""
    if proc.poll() is None:
        kill_group(proc.pid, signal.SIGTERM)
        with trio.move_on_after(timeout):
            return await wait_exit(proc)
        kill_group(proc.pid, signal.SIGKILL)
    return await wait_exit(proc)


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
    return sweep_except(children_dir, lambda info: False)[0]


def sweep_except(
    children_dir: Path, keep: Callable[[dict[str, Any]], bool]
) -> tuple[list[int], list[dict[str, Any]]]:
    """Kill the live processes of ``children_dir``'s pid files but those ``keep`` says to
    keep: the pids killed, and the records kept (their pid files stay)."""
    killed: list[int] = []
    kept: list[dict[str, Any]] = []
    if not children_dir.is_dir():
        return killed, kept
    for pidfile in children_dir.glob("*.pid"):
        try:
            info = json.loads(pidfile.read_text())
            pid, started = int(info["pid"]), info.get("start_time")
        except (ValueError, KeyError, OSError):
            pidfile.unlink(missing_ok=True)
            continue
        if alive(pid, started) and keep(info):
            kept.append(info)
            continue
        if alive(pid, started):
            kill_group(pid, signal.SIGCONT)
            kill_group(pid, signal.SIGKILL)
            killed.append(pid)
        pidfile.unlink(missing_ok=True)
    return killed, kept


def reap_orphans(own: Collection[int]) -> list[int]:
    """Reap the exited children of this process but ``own``: processes that were reparented
    to it (a child subreaper) when their parent died. ``own`` are the children whose exit
    status someone here waits for; they are never touched. Returns the pids reaped."""
    children: set[int] = set()
    for listing in Path("/proc/self/task").glob("*/children"):
        with contextlib.suppress(OSError):
            children.update(int(pid) for pid in listing.read_text().split())
    reaped = []
    for pid in children.difference(own):
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                reaped.append(pid)
    return reaped


async def reap_orphans_on_sigchld(
    own: Callable[[], Collection[int]], *, task_status: trio.TaskStatus[None]
) -> None:
    """:func:`reap_orphans` now and on each SIGCHLD, until cancelled (``own()``: the
    children whose status this process's supervisor waits for by pid)."""
    with trio.open_signal_receiver(signal.SIGCHLD) as signals:
        task_status.started()
        reap_orphans(own())
        async for _ in signals:
            reaped = reap_orphans(own())
            if reaped:
                log.debug("reaped the exited processes %s of a dead parent", reaped)
