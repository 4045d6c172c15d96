"""One shell command in its own process group: run, its output capped, ended whole.

``sys_os_shell`` (:mod:`corral.tools.os_tools`, whose docstring sets out the rules) and the
environments' shell routes (:mod:`corral.tools.environment`) both run commands through
:func:`run_shell`. What makes it hard is ending a command for good: background jobs outlive
the shell, a process that ignores SIGTERM needs SIGKILL, and zombies nobody reaps still
answer ``killpg(pgid, 0)``, so the group's members are looked up in ``/proc``.
"""

from __future__ import annotations

import codecs
import os
import shutil
import signal
import subprocess
from pathlib import Path

import trio

from .._child_env import base_env
from .._lifeline import group_alive, signal_group
from ._api import ProcessTracker, ToolError
from ._replies import ShellResult
from .sandbox import Sandbox, wrap
from .threads import in_thread

#: Seconds a ``sys_os_shell`` command gets when the call does not say.
DEFAULT_SHELL_TIMEOUT_S = 120.0
#: Seconds between SIGTERM and SIGKILL when a command's process group is ended.
KILL_GRACE_S = 2.0

_CHUNK = 64 * 1024


def shell_path() -> str:
    """The shell ``sys_os_shell`` runs: ``/bin/bash``, else ``bash`` on PATH, else ``/bin/sh``."""
    if os.access("/bin/bash", os.X_OK):
        return "/bin/bash"
    return shutil.which("bash") or "/bin/sh"


class _CappedText:
    """Decodes a byte stream as it arrives, keeping the first ``cap`` characters."""

    def __init__(self, cap: int) -> None:
        self._cap = cap
        self._parts: list[str] = []
        self.kept = 0
        self.dropped = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._done = False

    def feed(self, data: bytes | bytearray) -> None:
        self._add(self._decoder.decode(data))

    def finish(self) -> None:
        if not self._done:
            self._done = True
            self._add(self._decoder.decode(b"", final=True))

    def _add(self, text: str) -> None:
        room = self._cap - self.kept
        if room > 0:
            head = text[:room]
            self._parts.append(head)
            self.kept += len(head)
        self.dropped += len(text) - min(len(text), max(room, 0))

    def text(self) -> str:
        return "".join(self._parts)


def _shares(out_len: int, err_len: int, cap: int) -> tuple[int, int]:
    """How many characters of stdout and of stderr fit in ``cap`` together."""
    if out_len + err_len <= cap:
        return out_len, err_len
    half = cap // 2
    if out_len <= half:
        return out_len, cap - out_len
    if err_len <= half:
        return cap - err_len, err_len
    return half, cap - half


def _finish_text(sink: _CappedText, keep: int) -> str:
    text = sink.text()
    dropped = sink.dropped + len(text) - keep
    text = text[:keep]
    if dropped:
        text += f"\n...[truncated {dropped} chars]"
    return text


async def _pump(stream: trio.abc.ReceiveStream, sink: _CappedText) -> None:
    try:
        while chunk := await stream.receive_some(_CHUNK):
            sink.feed(chunk)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


async def _end_group(process: trio.Process) -> None:
    """SIGTERM the command's process group, SIGKILL what is left after the grace period.

    Runs shielded: it is what a cancelled call does on its way out.
    """
    pgid = process.pid  # start_new_session: the shell leads its own group
    if process.returncode is not None and not await in_thread(group_alive, pgid):
        return
    signal_group(pgid, signal.SIGTERM)
    with trio.move_on_after(KILL_GRACE_S):
        await process.wait()
        # Members that outlive the leader (background jobs) are polled: there is no
        # notification when a process we are not the parent of exits.
        while await in_thread(group_alive, pgid):
            await trio.sleep(0.05)
    if process.returncode is None or await in_thread(group_alive, pgid):
        signal_group(pgid, signal.SIGKILL)
        await process.wait()
        # SIGKILL is delivered asynchronously: make sure the members are gone too before the
        # call reports that they are, bounded in case one is stuck in the kernel.
        with trio.move_on_after(KILL_GRACE_S):
            while await in_thread(group_alive, pgid):
                await trio.sleep(0.01)


async def run_shell(
    command: str,
    *,
    cwd: Path,
    timeout_s: float,
    max_output_chars: int,
    processes: ProcessTracker | None = None,
    sandbox: Sandbox | None = None,
) -> ShellResult:
    """Run ``command`` with bash in ``cwd`` and its own process group (:mod:`.os_tools`).

    The environment is the host's allow-listed one (no secrets: the command is the model's).
    ``processes`` is told about the group while it lives. With a ``sandbox``, bash runs
    inside it (:mod:`corral.tools.sandbox`); bubblewrap then leads the group.

    Returns:
        ``{"stdout", "stderr", "exit_code", "timed_out", "shell", "cwd"}``. ``exit_code``
        is negative when a signal ended the shell (``-15`` after a timeout's SIGTERM).

    Raises:
        ToolError: the shell could not be started.
    """
    shell = shell_path()
    environ = {**base_env(), "PWD": str(cwd)}
    argv = [shell, "-c", command]
    if sandbox is not None:
        argv = wrap(argv, sandbox, cwd=cwd, env=environ)
    try:
        process = await trio.lowlevel.open_process(
            argv,
            cwd=str(cwd),
            env=environ,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        raise ToolError(f"cannot start {shell} in {str(cwd)!r}: {exc.strerror or exc}") from exc
    assert process.stdout is not None and process.stderr is not None
    if processes is not None:
        processes.started(process.pid)
    out, err = _CappedText(max_output_chars), _CappedText(max_output_chars)
    try:
        with trio.move_on_after(timeout_s) as deadline:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_pump, process.stdout, out)
                nursery.start_soon(_pump, process.stderr, err)
                await process.wait()
    finally:
        with trio.CancelScope(shield=True):
            await _end_group(process)
            if processes is not None:
                processes.ended(process.pid)
            await process.stdout.aclose()
            await process.stderr.aclose()
    out.finish()
    err.finish()
    keep_out, keep_err = _shares(out.kept, err.kept, max_output_chars)
    return {
        "stdout": _finish_text(out, keep_out),
        "stderr": _finish_text(err, keep_err),
        "exit_code": process.returncode,
        "timed_out": deadline.cancelled_caught,
        "shell": shell,
        "cwd": str(cwd),
    }
