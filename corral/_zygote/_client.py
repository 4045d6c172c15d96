"""The owner's side of a zygote: keep one running, fork children from it, exec without it.

:class:`Zygote` starts the template process (by exec, from the owner's trio thread, so that
its ``PR_SET_PDEATHSIG`` ties it to the owner), reads its reports, and starts it again when
it dies — within an intensity (more than :data:`INTENSITY` deaths in :data:`PERIOD_S`
seconds and it is given up on). :meth:`Zygote.spawn` has the signature of the exec spawn
(:func:`corral.actors._process.spawn`) and is a drop-in for it: it forks when the zygote is
ready and preloaded the module ``argv`` runs, and execs (the ``fallback``) otherwise — no
zygote yet, a dead one, one that refuses or does not answer.

A forked child is not the owner's child: the owner holds it as a :class:`Forked`, whose
return code the zygote reports. When the zygote dies its children live on (reparented to
the host): their exit is then seen through a pidfd, the status unknown, as for a process
adopted from a dead harness actor.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec
import trio

from .._child_env import RESERVE, split_hidden
from ._messages import (
    MAX_DATAGRAM,
    Born,
    Died,
    Fork,
    Ready,
    decode_answer,
    decode_report,
    encode,
)
from ._seed import sprout
from ._template import SETUP_ENV, fork_template

log = logging.getLogger("corral.zygote")

#: What a process the zygote forked returns once gone with its status unknown (the
#: zygote died before it reported it): the value of :data:`corral.actors._process.UNKNOWN_EXIT`.
UNKNOWN_EXIT = 1 << 16
#: The zygote is given up on (every child exec'd) after more deaths than this in PERIOD_S.
INTENSITY = 3
PERIOD_S = 60.0
#: How long a fork request may take before the zygote counts as wedged (it is killed, the
#: child exec'd). The owner's trio thread waits that long, so it stays well inside the 3 s
#: in which the host counts a silent actor dead (a fork takes about a millisecond).
ANSWER_TIMEOUT_S = 1.0
#: How long a zygote asked of the seed has to say Ready (it imports next to nothing).
SEED_READY_S = 5.0

#: What a child that makes HTTP requests imports only when it first does, so a zygote's
#: owner adds them to its preload: httpx imports httpcore (and with it h2, hpack, anyio and
#: certifi, ~55 modules and ~0.2 s) at its first client's first request, and a host name's
#: first encoding imports ``encodings.idna``. Imported after a fork, they are the child's
#: own pages; imported before, they are shared. So is the TLS context every client of a
#: process uses (:mod:`corral._tls`), built here once instead of once per client.
HTTP_CLIENT_MODULES = ("httpcore", "encodings.idna", "corral._tls:DEFAULT_CONTEXT")

#: The exec spawn: ``spawn(argv, env=..., cwd=...)``.
Spawn = Callable[..., Any]


class Forked:
    """A child forked by the zygote, held like :class:`subprocess.Popen`: ``pid``,
    ``poll()``, ``returncode`` and ``await wait()``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        #: Its return code, as the zygote reported it.
        self._status: int | None = None
        #: The zygote died before reporting: the exit is seen through the pidfd alone.
        self._orphaned = False
        self._news = trio.Event()
        try:
            self._pidfd: int | None = os.pidfd_open(pid)
        except ProcessLookupError:  # exited and reaped already: its report is on the way
            self._pidfd = None

    def died(self, code: int) -> None:
        """The zygote reported the exit."""
        self._status = code
        self._news.set()

    def orphaned(self) -> None:
        """The zygote is gone (the process lives on, or ended unreported)."""
        self._orphaned = True
        self._news.set()

    def poll(self) -> int | None:
        """The return code once the process has exited, else None."""
        if self.returncode is None:
            if self._status is not None:
                self._settle(self._status)
            elif self._orphaned and self._gone():
                self._settle(UNKNOWN_EXIT)
        return self.returncode

    async def wait(self) -> int:
        """Wait (without a thread) until the process has exited; its return code."""
        while self.poll() is None:
            if not self._orphaned:
                await self._news.wait()
            elif self._pidfd is not None:
                # Each waiter on a pidfd of its own: trio lets one task wait on an fd.
                pidfd = os.dup(self._pidfd)
                try:
                    await trio.lowlevel.wait_readable(pidfd)
                finally:
                    trio.lowlevel.notify_closing(pidfd)
                    os.close(pidfd)
        assert self.returncode is not None
        return self.returncode

    def _gone(self) -> bool:
        return self._pidfd is None or bool(select.select([self._pidfd], [], [], 0)[0])

    def _settle(self, code: int) -> None:
        self.returncode = code
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


class _ForkedZygote:
    """A zygote this process forked itself (:func:`~._template.fork_template`), held like the
    :class:`subprocess.Popen` of an exec'd one: ``pid``, ``poll()``, ``kill()``, ``wait()``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._wait(os.WNOHANG)
        return self.returncode

    def wait(self) -> int:
        while self.returncode is None:
            self._wait(0)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            os.kill(self.pid, signal.SIGKILL)

    def _wait(self, flags: int) -> None:
        try:
            pid, status = os.waitpid(self.pid, flags)
        except ChildProcessError:  # reaped by someone else: its status is unknown
            self.returncode = UNKNOWN_EXIT
            return
        if pid:
            self.returncode = os.waitstatus_to_exitcode(status)


class _SeededZygote:
    """A zygote the seed forked (:mod:`._seed`), held like the :class:`subprocess.Popen` of an
    exec'd one through a pidfd: the seed, its parent, reaps it, so its code is unknown."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        try:
            self._pidfd: int | None = os.pidfd_open(pid)
        except ProcessLookupError:
            self._pidfd = None
            self.returncode = UNKNOWN_EXIT

    def poll(self) -> int | None:
        pidfd = self._pidfd
        if self.returncode is None and pidfd is not None and select.select([pidfd], [], [], 0)[0]:
            self._settle()
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None and self._pidfd is not None:
            select.select([self._pidfd], [], [])
            self._settle()
        return UNKNOWN_EXIT

    def kill(self) -> None:
        if self.returncode is None and self._pidfd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    def _settle(self) -> None:
        self.returncode = UNKNOWN_EXIT
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


class Zygote:
    """One zygote process, kept running for its owner (:meth:`run`), and the spawn that
    forks from it (:meth:`spawn`).

    Args:
        preload: what the zygote imports, each ``MODULE`` or ``MODULE:NAME`` (then ``NAME``
            is looked up too, :func:`._template.preload`); it forks children that run one
            of the modules
            (``argv`` ``[python, "-m", MODULE]``).
        env: the zygote's environment (never a secret: every child's environ block is a
            copy of its memory until overwritten).
        fallback: the exec spawn, for everything the zygote does not fork.
        seed: the seed socket (:func:`._seed.seed_fd`): each zygote is forked by the seed
            while it gives one, and exec'd otherwise.
        keep: file descriptors a zygote this process forks (:meth:`prefork`) keeps open for
            its children (the host's: the seed socket, for the harness actor).
    """

    def __init__(
        self,
        preload: tuple[str, ...],
        env: Mapping[str, str],
        fallback: Spawn,
        *,
        seed: int | None = None,
        keep: tuple[int, ...] = (),
    ) -> None:
        self.preload = preload
        self.env = dict(env)
        self.fallback = fallback
        self.proc: subprocess.Popen[bytes] | _ForkedZygote | _SeededZygote | None = None
        #: The first zygote, forked by :meth:`prefork` and not yet taken by :meth:`run`.
        self._preforked: tuple[int, socket.socket, socket.socket] | None = None
        #: The seed socket each zygote is asked of first (:mod:`._seed`); None once the seed
        #: failed to give one.
        self.seed = seed
        self._seeded = False
        self.keep = keep
        self._requests: socket.socket | None = None
        self._ready = trio.Event()
        self._children: dict[int, Forked] = {}
        self._deaths: list[float] = []
        self.gave_up = False
        self.stats = {
            "forked": 0,
            "exec": 0,
            "zygote_starts": 0,
            "zygotes_forked": 0,
            "zygotes_seeded": 0,
        }

    def prefork(self) -> bool:
        """Fork the first zygote from this process, before :meth:`run` (which takes it), so
        that it and its children share this process's pages: call it from the main thread
        before any thread or zmq context exists (:func:`~._template.fork_template`). Every
        later zygote, after a death, is exec'd. Whether one was forked (not with a second
        thread here, or when the fork fails: :meth:`run` then execs the first one too)."""
        try:
            self._preforked = fork_template(self.preload, self.keep)
        except OSError as exc:
            log.warning("could not fork the zygote (it is exec'd): %s", exc)
        return self._preforked is not None

    @property
    def pid(self) -> int | None:
        """The zygote's pid while it takes requests."""
        taking = self._requests is not None and self._ready.is_set()
        return self.proc.pid if self.proc is not None and taking else None

    def close(self) -> None:
        """Close the sockets of a zygote :meth:`prefork` made and :meth:`run` never took (its
        owner failed before it ran): that zygote then exits."""
        if self._preforked is not None:
            _, requests, reports = self._preforked
            self._preforked = None
            requests.close()
            reports.close()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep a zygote running until cancelled (then stop it), or until it is given up
        on: it died more than :data:`INTENSITY` times in :data:`PERIOD_S` seconds, or it
        cannot be started at all."""
        task_status.started()
        try:
            while True:
                try:
                    reports = self._start()
                except OSError as exc:
                    log.warning("no zygote (workers are exec'd): %s", exc)
                    self.gave_up = True
                    return
                await self._read(reports)
                if self._lost():
                    return
        finally:
            with trio.CancelScope(shield=True):
                await self._stop()

    async def ready(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the zygote to take requests; whether it does."""
        if not self.gave_up:
            with trio.move_on_after(timeout):
                await self._ready.wait()
        return self._ready.is_set()

    def spawn(self, argv: list[str], *, env: dict[str, str], cwd: Path | None = None) -> Any:
        """Fork ``argv``'s process from the zygote when it can, else exec it (``fallback``):
        a :class:`Forked`, or what the fallback returns.

        Blocks the calling thread until the zygote answers (a fork takes about a
        millisecond); one that does not within :data:`ANSWER_TIMEOUT_S` is killed. The
        forked child runs only once it is taken here (its go pipe, :mod:`._template`): one
        forked after this gave up on the answer exits without running.
        """
        entry = _entry_of(argv)
        requests = self._requests
        if entry not in self.preload or requests is None or not self._ready.is_set():
            return self._exec(argv, env, cwd)
        shown, hidden = split_hidden(env)
        request = Fork(
            entry=entry, shown=shown, hidden=hidden, cwd=None if cwd is None else str(cwd)
        )
        go_read, go = os.pipe()
        try:
            try:
                socket.send_fds(requests, [encode(request)], [go_read])
            finally:
                os.close(go_read)
            answer = decode_answer(requests.recv(MAX_DATAGRAM))
        except (OSError, msgspec.DecodeError) as exc:
            os.close(go)
            log.warning("the zygote did not answer (%s): killed, the child exec'd", exc)
            # Asked no more: a late answer to this request must not be taken for the next.
            self._requests = None
            requests.close()
            self._kill()
            return self._exec(argv, env, cwd)
        if not isinstance(answer, Born):
            os.close(go)
            log.warning("the zygote refused to fork (%s): the child is exec'd", answer.reason)
            return self._exec(argv, env, cwd)
        child = Forked(answer.pid)
        self._children[answer.pid] = child
        self.stats["forked"] += 1
        # A child dead already has no reader left: its exit is reported as any other.
        with contextlib.suppress(BrokenPipeError):
            os.write(go, b"\1")
        os.close(go)
        return child

    def statistics(self) -> dict[str, Any]:
        """The zygote's pid (None: none runs), whether it was given up on, and counts."""
        return {"pid": self.pid, "gave_up": self.gave_up, **self.stats}

    # --- the zygote process ----------------------------------------------------------------

    def _exec(self, argv: list[str], env: dict[str, str], cwd: Path | None) -> Any:
        self.stats["exec"] += 1
        return self.fallback(argv, env=env, cwd=cwd)

    def _start(self) -> trio.socket.SocketType:
        """Take the zygote :meth:`prefork` made, else ask the seed for one, else exec one;
        the reports socket it is ready on."""
        self._seeded = False
        if self._preforked is not None:
            pid, requests, reports = self._preforked
            self._preforked = None
            self.proc = _ForkedZygote(pid)
            self.stats["zygotes_forked"] += 1
        elif (sprouted := self._sprout()) is not None:
            requests, reports = sprouted
        else:
            requests, reports = self._exec_zygote()
        requests.settimeout(ANSWER_TIMEOUT_S)
        self._requests = requests
        self.stats["zygote_starts"] += 1
        return trio.socket.from_stdlib_socket(reports)

    def _sprout(self) -> tuple[socket.socket, socket.socket] | None:
        """Ask the seed for a zygote (its pid comes with its Ready); None without a seed."""
        if self.seed is None:
            return None
        try:
            sprouted = sprout(self.seed, self.preload, self.env)
        except OSError as exc:
            log.warning("the seed is gone (the zygote is exec'd): %s", exc)
            self.seed = None
            return None
        self.proc = None
        self._seeded = True
        self.stats["zygotes_seeded"] += 1
        return sprouted

    def _exec_zygote(self) -> tuple[socket.socket, socket.socket]:
        """Exec a zygote: its requests and reports sockets."""
        requests, theirs_requests = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        reports, theirs_reports = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        setup = {
            "owner": os.getpid(),
            "requests": theirs_requests.fileno(),
            "reports": theirs_reports.fileno(),
        }
        env = {
            **self.env,
            SETUP_ENV: json.dumps(setup),
            **RESERVE,
        }
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "corral._zygote", *self.preload],
                env=env,
                stdin=subprocess.DEVNULL,
                close_fds=True,
                pass_fds=(theirs_requests.fileno(), theirs_reports.fileno()),
                start_new_session=True,
            )
        except OSError:
            requests.close()
            reports.close()
            raise
        finally:
            theirs_requests.close()
            theirs_reports.close()
        return requests, reports

    async def _read(self, reports: trio.socket.SocketType) -> None:
        """Take the zygote's reports until it is gone."""
        with reports:
            while True:
                # A zygote the seed was asked for and that never says Ready (the seed is
                # stopped, say) is given up on, as one that exited would be.
                first = self._seeded and not self._ready.is_set()
                data = b""
                with (
                    trio.move_on_after(SEED_READY_S if first else math.inf),
                    contextlib.suppress(OSError),
                ):
                    data = await reports.recv(MAX_DATAGRAM)
                if not data:
                    return
                report = decode_report(data)
                if isinstance(report, Ready):
                    if self.proc is None:  # the seed forked it: not this process's child
                        self.proc = _SeededZygote(report.pid)
                    self._ready.set()
                elif isinstance(report, Died):
                    child = self._children.pop(report.pid, None)
                    if child is not None:
                        child.died(report.code)

    def _orphan_children(self) -> None:
        """No zygote will report an exit of a child it forked: each is watched through its
        pidfd from now on."""
        for child in self._children.values():
            child.orphaned()
        self._children.clear()

    def _lost(self) -> bool:
        """The zygote is gone: orphan its children, reap it; whether to give up on it."""
        was_ready = self._ready.is_set()
        self._ready = trio.Event()
        if self._requests is not None:
            self._requests.close()
            self._requests = None
        self._orphan_children()
        code = None
        if self.proc is not None:
            self._kill()
            code = self.proc.wait()
        log.warning("the zygote exited (%s)", code if was_ready else f"{code}, before it was ready")
        if self._seeded and not was_ready:
            log.warning("the seed gave no zygote: the next one is exec'd")
            self.seed = None
            return False
        now = time.monotonic()
        self._deaths = [now, *(t for t in self._deaths if t > now - PERIOD_S)]
        if len(self._deaths) > INTENSITY or not was_ready:
            log.warning("the zygote is given up on: workers are exec'd from now on")
            self.gave_up = True
        return self.gave_up

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()

    async def _stop(self) -> None:
        """Close the requests socket (the zygote then exits) and reap it. Its children live
        on (they are stopped by their owner's supervisor, after this): their exits are seen
        through their pidfds, since no report of the zygote is read any more."""
        if self._requests is not None:
            self._requests.close()
            self._requests = None
        self._orphan_children()
        proc = self.proc
        if proc is None:
            return
        with trio.move_on_after(2):
            while proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    pidfd = os.pidfd_open(proc.pid)
                    try:
                        await trio.lowlevel.wait_readable(pidfd)
                    finally:
                        trio.lowlevel.notify_closing(pidfd)
                        os.close(pidfd)
        self._kill()
        proc.wait()


def _entry_of(argv: list[str]) -> str | None:
    """The module ``argv`` runs when it is ``[python, "-m", MODULE]``, else None."""
    if len(argv) == 3 and argv[0] == sys.executable and argv[1] == "-m":
        return argv[2]
    return None
