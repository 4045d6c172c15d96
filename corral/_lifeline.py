"""A child process's tie to the host: it dies when the host (or its parent) does.

The actors and the embedded control plane call :func:`die_with_parent` first, so a ``kill
-9`` of the host leaves no orphan behind. Harness workers are tied to the *host* instead
(:func:`host_lifeline`, :func:`die_with_host`): a harness actor that crashes leaves its
workers running, reparented to the host (a child subreaper, :func:`become_subreaper`),
and its next incarnation adopts them. It lives on the floor because the actors, the host
and the harness workers all use it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from pathlib import Path
from typing import NoReturn

import trio

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36

#: Exit code of a child whose parent or host was gone when it started.
EXIT_ORPHANED = 70


def _prctl(option: int, arg: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, arg, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to SIGKILL us when the parent dies; exit now if it already has."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(EXIT_ORPHANED)


def become_subreaper() -> None:
    """Make orphaned descendants (a dead harness actor's workers) this process's children,
    not init's: they stay in the host's tree and their zombies are the host's to reap."""
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def start_time(pid: int) -> int | None:
    """The kernel's start time of ``pid`` (guards against pid reuse), or None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may contain spaces; fields after it are plain.
    return int(stat.rsplit(")", 1)[1].split()[19])


def host_lifeline(host_pid: int, host_start: int | None) -> int:
    """A pidfd on the host that started at ``host_start``; exit now if it is gone.

    The start time is checked after the pidfd is open, so the pidfd cannot be of a process
    that reused the host's pid.
    """
    try:
        pidfd = os.pidfd_open(host_pid)
    except ProcessLookupError:
        os._exit(EXIT_ORPHANED)
    if start_time(host_pid) != host_start:
        os._exit(EXIT_ORPHANED)
    return pidfd


async def die_with_host(pidfd: int) -> NoReturn:
    """Exit at once when the host of :func:`host_lifeline` exits (its pidfd is readable)."""
    await trio.lowlevel.wait_readable(pidfd)
    os._exit(EXIT_ORPHANED)


def group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` still has a member that is not a zombie.

    ``killpg(pgid, 0)`` also succeeds while only zombies are left: orphans whose new parent
    (init, or a container's PID 1 that never reaps) has not collected them. They no longer
    run, so on Linux the members are looked up in ``/proc``; elsewhere a group that answers
    counts as alive.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        entries = os.listdir("/proc")
    except OSError:
        return True
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as file:
                fields = file.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # After the command name: state, ppid, pgrp.
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


def signal_group(pgid: int, sig: int) -> None:
    """Send ``sig`` to process group ``pgid``, if it is still there."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
