"""A coding-agent CLI as a child of a harness worker, speaking JSON lines on stdio.

Claude Code's stream-json mode, the Codex app-server and pi's RPC mode all read one JSON
object per line on stdin and write one per line on stdout (docs/harnesses.md). A worker
kind opens the CLI with :func:`open_cli`, writes with :meth:`CliProcess.send` and reads with
:meth:`CliProcess.receive`; leaving the block ends the CLI.

Three rules the worker's supervision depends on:

* **The CLI dies with its worker.** It is started with ``PR_SET_PDEATHSIG`` (SIGKILL) from
  the trio thread itself — the kernel sends the signal when the *thread* that forked the
  child exits, so the fork must not happen in one of trio's worker threads, which come and
  go — and exits at once if the worker was already gone when it started. A ``kill -9`` of
  the worker leaves no CLI behind to go on acting.
* **Its whole process group ends with it.** The CLI leads a session of its own, so the
  shells and tools it started are signalled with it: SIGTERM, then SIGKILL after
  :data:`KILL_GRACE_S`.
* **Its output is bounded.** A line longer than :data:`MAX_LINE_BYTES` ends the CLI with
  :class:`CliError` instead of growing the worker's memory; lines that are not a JSON object
  (a CLI's stray diagnostics) are logged once each and skipped; stderr keeps only its last
  :data:`STDERR_TAIL_BYTES`, which :class:`CliExited` quotes.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import signal
import subprocess
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

import trio

from .._lifeline import group_alive, signal_group
from ._turn import TurnFailed

_T = TypeVar("_T")

log = logging.getLogger("corral.harnesses.cli")

#: The longest line a CLI may write (a whole tool output can be one line).
MAX_LINE_BYTES = 32 * 1024 * 1024
#: How much of the CLI's stderr is kept for the error that reports its exit.
STDERR_TAIL_BYTES = 8 * 1024
#: How long the CLI's group has between SIGTERM and SIGKILL.
KILL_GRACE_S = 3.0

_PR_SET_PDEATHSIG = 1


class CliError(Exception):
    """The CLI cannot be used: it did not start, or it broke the JSON-lines protocol."""


class CliExited(CliError):
    """The CLI's stdout ended (it exited or closed it); ``returncode`` is None while it still
    runs, negative for a signal."""

    def __init__(self, message: str, *, returncode: int | None, stderr: str) -> None:
        super().__init__(message)
        self.returncode = returncode
        self.stderr = stderr


class CliProcess:
    """A running CLI: send and receive JSON objects, one per line."""

    def __init__(self, proc: subprocess.Popen[bytes], command: str) -> None:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        self.proc = proc
        self.command = command
        self._stdin = trio.lowlevel.FdStream(os.dup(proc.stdin.fileno()))
        self._stdout = trio.lowlevel.FdStream(os.dup(proc.stdout.fileno()))
        self._stderr = trio.lowlevel.FdStream(os.dup(proc.stderr.fileno()))
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            pipe.close()
        self._buffer = bytearray()
        self._stderr_tail: deque[bytes] = deque()
        self._stderr_size = 0
        self._stderr_ended = trio.Event()
        self._send_lock = trio.Lock()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def stderr_tail(self) -> str:
        """The last :data:`STDERR_TAIL_BYTES` the CLI wrote on stderr."""
        return b"".join(self._stderr_tail).decode(errors="replace")

    async def send(self, message: Mapping[str, Any]) -> None:
        """Write one JSON object as one line.

        Raises:
            CliExited: the CLI no longer reads its stdin.
        """
        line = json.dumps(message, separators=(",", ":"), ensure_ascii=False) + "\n"
        async with self._send_lock:
            try:
                await self._stdin.send_all(line.encode())
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                await self._settle()
                raise self._exited("stopped reading its input") from exc

    async def receive(self) -> dict[str, Any]:
        """The next JSON object the CLI writes.

        Raises:
            CliExited: its stdout ended.
            CliError: a line over :data:`MAX_LINE_BYTES`.
        """
        while True:
            end = self._buffer.find(b"\n")
            while end < 0:
                if len(self._buffer) > MAX_LINE_BYTES:
                    raise CliError(
                        f"{self.command} wrote a line over {MAX_LINE_BYTES} bytes on stdout"
                    )
                chunk = await self._stdout.receive_some(1 << 16)
                if not chunk:
                    await self._settle()
                    raise self._exited("ended its output")
                start = len(self._buffer)
                self._buffer += chunk
                found = chunk.find(b"\n")
                end = -1 if found < 0 else start + found
            line = bytes(self._buffer[:end]).strip()
            del self._buffer[: end + 1]
            if not line:
                continue
            try:
                decoded = json.loads(line)
            except ValueError:
                decoded = None
            if isinstance(decoded, dict):
                return decoded
            log.warning("%s wrote a line that is not a JSON object: %.200r", self.command, line)

    def end_commands(self) -> int:
        """SIGKILL what the CLI started in sessions of its own, and everything under it; the
        CLI lives on.

        The Codex app-server runs each command in a session of its own (through its sandbox
        helper and ``bwrap``, which starts yet another) and leaves it running when the turn
        that started it is interrupted; the group signal of leaving :func:`open_cli` misses
        it, and only the sandbox's own ``PDEATHSIG`` takes it when the CLI ends. A kind that
        keeps its CLI after an interrupt calls this so nothing of the turn goes on: each
        child of the CLI outside the CLI's session, every descendant of those, and every
        process in a session one of them is in (an orphan reparented away is still there).
        Reads ``/proc`` (a few milliseconds). Returns how many processes were signalled.
        """
        table = _process_table()
        own = table.get(self.pid, (0, 0))[1]
        children: dict[int, list[int]] = {}
        for pid, (ppid, _) in table.items():
            children.setdefault(ppid, []).append(pid)
        found: set[int] = set()
        frontier = [p for p in children.get(self.pid, []) if table[p][1] != own]
        while frontier:
            pid = frontier.pop()
            if pid not in found:
                found.add(pid)
                frontier.extend(children.get(pid, []))
        sessions = {table[p][1] for p in found}
        found |= {pid for pid, (_, sid) in table.items() if sid in sessions}
        found.discard(self.pid)
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        return len(found)

    async def close_input(self) -> None:
        """Close the CLI's stdin (some CLIs end their session on EOF)."""
        await self._stdin.aclose()

    async def wait(self) -> int:
        """Wait (without a thread) for the CLI to exit; its returncode."""
        if self.proc.poll() is not None:
            return self.proc.returncode
        try:
            pidfd = os.pidfd_open(self.proc.pid)
        except ProcessLookupError:
            return self.proc.wait()
        try:
            while self.proc.poll() is None:
                await trio.lowlevel.wait_readable(pidfd)
        finally:
            os.close(pidfd)
        return self.proc.returncode

    async def _settle(self) -> None:
        """After stdout or stdin ends: give the CLI a moment to exit and its stderr to be read
        to the end, so its exit code and its last words can be told (a CLI that dies at once ends
        both pipes before the stderr reader has run)."""
        with trio.move_on_after(1.0):
            await self.wait()
            await self._stderr_ended.wait()

    def _exited(self, what: str) -> CliExited:
        code = self.proc.poll()
        how = "" if code is None else f" ({_describe(code)})"
        tail = self.stderr_tail.strip()
        last = f": {tail.splitlines()[-1][:300]}" if tail else ""
        return CliExited(
            f"{self.command} {what}{how}{last}", returncode=code, stderr=self.stderr_tail
        )

    async def _drain_stderr(self) -> None:
        try:
            while chunk := await self._stderr.receive_some(1 << 14):
                self._stderr_tail.append(chunk)
                self._stderr_size += len(chunk)
                while self._stderr_size > STDERR_TAIL_BYTES and len(self._stderr_tail) > 1:
                    self._stderr_size -= len(self._stderr_tail.popleft())
        finally:
            self._stderr_ended.set()

    async def _end(self) -> None:
        """SIGTERM the CLI's group, SIGKILL it after :data:`KILL_GRACE_S`, and return once
        no member runs (bounded: one stuck in the kernel is left); close the pipes."""
        pgid = self.proc.pid  # start_new_session: the CLI leads its own group
        if self.proc.poll() is None:
            signal_group(pgid, signal.SIGTERM)
            with trio.move_on_after(KILL_GRACE_S):
                await self.wait()
        # Whatever of the group is left (the CLI's shells) goes with it.
        signal_group(pgid, signal.SIGKILL)
        await self.wait()
        # SIGKILL is delivered asynchronously, and the members are not this process's
        # children to wait for: polled, so that "ended" means gone.
        with trio.move_on_after(KILL_GRACE_S):
            while await trio.to_thread.run_sync(group_alive, pgid):
                await trio.sleep(0.01)
        for stream in (self._stdin, self._stdout, self._stderr):
            await stream.aclose()


@contextlib.asynccontextmanager
async def open_cli(
    argv: Sequence[str], *, env: Mapping[str, str], cwd: Path | str
) -> AsyncIterator[CliProcess]:
    """Start ``argv`` and yield it as a :class:`CliProcess`; end it (and its group) on exit.

    Raises:
        CliError: it could not be started.
    """
    proc = _spawn(argv, env, cwd)
    cli = CliProcess(proc, Path(argv[0]).name)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cli._drain_stderr)
            try:
                yield cli
            finally:
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await cli._end()


def _spawn(argv: Sequence[str], env: Mapping[str, str], cwd: Path | str) -> subprocess.Popen[bytes]:
    """Fork and exec the CLI, here in the trio thread (see the module's docstring)."""
    try:
        return subprocess.Popen(
            list(argv),
            env=dict(env),
            cwd=str(cwd),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            close_fds=True,
            start_new_session=True,
            # The worker starts no thread that forks, so running Python in the child between
            # fork and exec is safe; it is the only way to set PDEATHSIG before the exec.
            preexec_fn=_die_with_this_process(),
        )
    except OSError as exc:
        raise CliError(f"cannot start {argv[0]}: {exc.strerror or exc}") from exc


def _die_with_this_process() -> Any:
    """The child's pre-exec step: SIGKILL when this process dies; exit if it already has.

    libc's ``prctl`` is looked up here, before the fork: the child only calls it.
    """
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def in_child() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(70)

    return in_child


def _process_table() -> dict[int, tuple[int, int]]:
    """Every live process: pid → (parent pid, session id), from ``/proc``."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue  # it exited meanwhile
        if fields[0] not in (b"Z", b"X"):
            table[int(entry.name)] = (int(fields[1]), int(fields[3]))
    return table


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"killed by signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


async def started_while_checked(
    check: Callable[[], Awaitable[object]], start: Callable[[], Awaitable[_T]]
) -> _T:
    """What ``start()`` started, once ``check()`` passed too. A new session's CLI starts
    while the model call's policy question is out (its start is most of a first turn's
    wait); a DENY (``check`` raising) leaves it started for the next turn."""
    with unwrapped():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(check)
            return await start()


class _Relaying(Protocol):
    #: Whether the CLI's run of this turn may still be going (asked, not yet settled).
    outstanding: bool


@contextlib.asynccontextmanager
async def interrupted_on_exit(
    relay: _Relaying,
    *,
    end: Callable[[], Awaitable[None]],
    interrupt: Callable[[], Awaitable[None]],
) -> AsyncIterator[None]:
    """Relay a turn from a CLI that outlives it (codex, pi): a turn that leaves the CLI's run
    going (cancelled, failed) interrupts it, shielded; one that timed out ends the CLI
    instead, since a CLI that stopped talking will not take an interrupt either."""
    try:
        yield
    except TurnFailed as exc:
        if exc.code == "timeout":
            relay.outstanding = False
            with trio.CancelScope(shield=True):
                await end()
        raise
    finally:
        if relay.outstanding:
            with trio.CancelScope(shield=True):
                await interrupt()


@contextlib.contextmanager
def unwrapped() -> Iterator[None]:
    """Give back the first failure a nursery wrapped in an exception group as itself: a
    :class:`TurnFailed` for the worker to report, a :class:`CliError` to map (the codex and
    pi kinds run a turn beside their CLI's reader). Cancellation alone stays as it is
    (trio's scopes take it out of the group)."""
    try:
        yield
    except BaseExceptionGroup as group:
        failures = [e for e in _leaves(group) if not isinstance(e, trio.Cancelled)]
        if failures and isinstance(failures[0], Exception):
            raise failures[0] from group
        raise


def _leaves(group: BaseExceptionGroup[BaseException]) -> Iterator[BaseException]:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from _leaves(exc)
        else:
            yield exc
