"""The zygote process: a template that has imported a runtime and forks children from it.

``python -m corral._zygote ITEM...`` imports each ``MODULE`` or ``MODULE:NAME`` item (the
harness worker's runtime: trio, pyzmq, msgspec, corral's bus; the actors' entry and classes),
says :class:`Ready` and then forks a child per :class:`Fork` request. A forked child shares
every page the zygote had (the interpreter, the imported modules) until it writes to it, so a
worker costs what it does, not a whole interpreter, and starts without importing anything.

**What a fork must not inherit.** A forked process gets one thread and a copy of every lock,
context and buffer of its parent: a zmq context (its I/O threads do not exist in the copy,
so sends are silently lost), a trio run, a thread mid-lock. So the zygote never creates any
of them: it imports and waits in one blocking loop (:mod:`selectors`) on two sockets and
the pidfds of its children, and it refuses to fork (the owner then execs) if it ever finds
a second thread in itself. Each child makes its own zmq context after the fork, as an
exec'd process does.

**What a child is.** The same process an exec would have made: the leader of its own session
and process group (what a kill of its group reaches), in the requested directory, with the
requested environment in ``os.environ`` and — since ``/proc/PID/environ`` shows the memory
that held the environment a process was exec'd with — the same entries there too: the zygote
is exec'd with a reserve of blank environment (:data:`RESERVE_ENV`) that each child
overwrites with its own. Variables to be handed over hidden reach ``os.environ`` only (no
memfd: nothing else can read a forked child's memory). Its parent-death signal is cleared by
the fork; a harness worker ties itself to the host as an exec'd one does
(:mod:`corral._lifeline`). The zygote itself dies with its owner (``PR_SET_PDEATHSIG``): its
children then live on, reparented to the host.

**A child runs once its owner has taken it.** Each request comes with the read end of a
pipe (``SCM_RIGHTS``) whose write end the owner keeps: the child, titled
:data:`FORKED_TITLE_PREFIX` and its entry at once, waits for a byte on it before it becomes
anything, and exits (:data:`EXIT_NOT_TAKEN`) at its end instead — the owner gave up on the
answer (and exec'd the process instead), or died before it knew the child. So no fork the
owner does not hold ever runs beside the one it does, and a child whose owner died between
the fork and its pid file is told by its title (the harness actor's next incarnation kills
it, as an exec'd worker with no pid file).

**A zygote forked from its owner** (:func:`fork_template`: the host's first, #20) is the same
template with the owner's memory instead of a fresh interpreter's, so that the owner's pages
are shared too. It is forked before the owner has a thread, a zmq context or a trio run, and
sheds what it copied of the owner's: every file descriptor but its sockets and the standard
ones, the owner's signal handlers and log handlers. Its environ block is the owner's (blanked
of secrets by the host before the fork), with no reserve: a child shows what of its own
environment fits there (:func:`show_environ`).

**Exits.** The zygote reaps its children (a pidfd each) and reports each exit
(:class:`Died`) on the reports socket: the owner, which cannot wait for a process that is
not its child, learns the return code from it.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import json
import logging
import os
import selectors
import signal
import socket
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import NoReturn

from .. import logs
from .._child_env import RESERVE_ENV
from .._lifeline import die_with_parent
from .._proctitle import set_title
from ._messages import (
    MAX_DATAGRAM,
    Born,
    Died,
    Fork,
    Ready,
    Refused,
    decode_request,
    encode,
)

log = logging.getLogger("corral.zygote")

#: In the zygote's environ: how its owner set it up (JSON: the two socket fds, the owner's pid).
SETUP_ENV = "CORRAL_ZYGOTE"
#: How a forked child's title begins until its entry sets its own: then its entry module.
FORKED_TITLE_PREFIX = "corral: forked "
#: Exit code of a forked child its owner did not take (it ran nothing).
EXIT_NOT_TAKEN = 75


class Template:
    """The zygote's state: its sockets, the selector, the pidfds of its live children."""

    def __init__(self, requests: socket.socket, reports: socket.socket) -> None:
        self.requests = requests
        self.reports = reports
        self.selector = selectors.DefaultSelector()
        self.selector.register(requests, selectors.EVENT_READ)
        #: pidfd → pid of each child not yet reaped.
        self.children: dict[int, int] = {}

    def serve(self) -> None:
        """Fork on request and report exits, until the owner closes the requests socket."""
        while True:
            for key, _ in self.selector.select():
                if key.fileobj is self.requests:
                    data, fds, _, _ = socket.recv_fds(self.requests, MAX_DATAGRAM, 1)
                    if not data:
                        return
                    try:
                        answer = self._fork(decode_request(data), fds[0] if fds else None)
                    except OSError as exc:  # no fork (EAGAIN, ENOMEM): the owner execs
                        answer = Refused(reason=f"fork failed: {exc}")
                    finally:
                        for fd in fds:
                            os.close(fd)
                    self.requests.send(encode(answer))
                else:
                    self._reap(key.fd)

    def _fork(self, request: Fork, go: int | None) -> Born | Refused:
        """Fork ``request``'s child, which waits on ``go`` (the read end of its owner's
        pipe) before it runs."""
        if go is None:
            return Refused(reason="the request came without its go pipe")
        if len(os.listdir("/proc/self/task")) > 1:
            return Refused(reason="the zygote has more than one thread")
        pid = os.fork()
        if pid == 0:
            self._become_child(request, go)
        pidfd = os.pidfd_open(pid)
        self.children[pidfd] = pid
        self.selector.register(pidfd, selectors.EVENT_READ)
        return Born(pid=pid)

    def _reap(self, pidfd: int) -> None:
        pid = self.children.pop(pidfd)
        self.selector.unregister(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        self.reports.send(encode(Died(pid=pid, code=os.waitstatus_to_exitcode(status))))

    def _become_child(self, request: Fork, go: int) -> None:
        """In the forked child: drop the zygote's resources, wait until the owner has taken
        this child (``go``), become what an exec would have made, run ``entry``'s
        ``main()`` and exit (never returns)."""
        code = 1
        try:
            self.selector.close()
            self.requests.close()
            self.reports.close()
            for pidfd in self.children:
                os.close(pidfd)
            set_title(f"{FORKED_TITLE_PREFIX}{request.entry}")
            taken = os.read(go, 1)
            os.close(go)
            if not taken:
                os._exit(EXIT_NOT_TAKEN)
            os.setsid()
            if request.cwd is not None:
                os.chdir(request.cwd)
            # Through os.environ, so that the C environment is replaced too (every entry
            # freshly allocated, none left pointing into the block rewritten next).
            os.environ.clear()
            os.environ.update({**request.shown, **request.hidden})
            show_environ(request.shown)
            importlib.import_module(request.entry).main()
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc.code)
        except BaseException:
            traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                logging.shutdown()
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)


def environ_block(env: dict[str, str]) -> bytes:
    """``env`` as an environ block holds it: ``NAME=value`` entries, each NUL-terminated."""
    return b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items())


def _block_bounds() -> tuple[int, int]:
    """Where this process's environ block is in its memory: (start, end), from stat(5)."""
    with open("/proc/self/stat", "rb") as file:
        fields = file.read().rsplit(b")", 1)[1].split()
    # After the command name, env_start and env_end are fields 50 and 51 of stat(5).
    return int(fields[47]), int(fields[48])


def show_environ(env: dict[str, str]) -> None:
    """Overwrite this process's environ block with ``env`` and blank the rest of it, so that
    ``/proc/PID/environ`` shows ``env`` (followed by NULs, which readers skip as empty
    entries). The block is the zygote's, inherited: its entries are no secret of anyone's.
    An exec'd zygote's block has room for any environment (:data:`RESERVE_ENV`); one forked
    from the host has the host's, and shows the entries of ``env`` that fit, in order (the
    process's ``os.environ`` holds them all either way)."""
    start, end = _block_bounds()
    data = b""
    for entry in environ_block(env).split(b"\0")[:-1]:
        if len(data) + len(entry) + 1 > end - start:
            break
        data += entry + b"\0"
    ctypes.memmove(start, data, len(data))
    ctypes.memset(start + len(data), 0, end - start - len(data))


def _exit_code(code: object) -> int:
    """The process exit code of ``sys.exit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def preload(item: str) -> None:
    """Import ``MODULE``, or ``MODULE:NAME`` and look ``NAME`` up in it: a package whose
    exports are imported on first use (:mod:`corral._lazy`, the dispatch and gateway actors)
    loads the module that defines ``NAME`` only then, and a child should not have to."""
    module, _, name = item.partition(":")
    imported = importlib.import_module(module)
    if name:
        getattr(imported, name)


def preload_all(items: Sequence[str]) -> None:
    for item in items:
        try:
            preload(item)
        except Exception:  # its children import it themselves, and fail as an exec would
            log.exception("the zygote could not preload %s", item)


def main() -> None:
    """Entry point of the zygote: ``python -m corral._zygote ITEM...`` (each ``MODULE`` or
    ``MODULE:NAME``, :func:`preload`)."""
    setup = json.loads(os.environ.pop(SETUP_ENV))
    os.environ.pop(RESERVE_ENV, None)
    die_with_parent(int(setup["owner"]))
    requests = socket.socket(fileno=int(setup["requests"]))
    reports = socket.socket(fileno=int(setup["reports"]))
    set_title("corral: zygote")
    logs.setup("zygote")
    preload_all(sys.argv[1:])
    serve(requests, reports)


def fork_template(
    items: tuple[str, ...], keep: tuple[int, ...] = ()
) -> tuple[int, socket.socket, socket.socket] | None:
    """Make this process's first zygote by forking it, after importing ``items`` here: the
    zygote, and every child it forks, then share this process's pages too (the interpreter
    and the modules both import), where an exec'd zygote holds a copy of its own. The
    zygote's (pid, requests socket, reports socket); None, and nothing forked, if this
    process has a second thread (a fork copies no thread but the caller's).

    Call it from the main thread before anything fork-unsafe exists: a zmq context, a
    thread, a trio run (trio keeps its run in a thread-local, which the fork copies: every
    child of the zygote would find itself inside that run and fail to start its own). The
    child gets no lock or buffer it needs: it closes every file descriptor but its two
    sockets and the standard ones, restores default signal handling and logs afresh. It
    shows this process's environ block, which the host has blanked of its secrets; a child
    forked from it shows what of its own environment fits there (:func:`show_environ`)."""
    if len(os.listdir("/proc/self/task")) > 1:
        return None
    preload_all(items)
    # Collected, then frozen on both sides: a collection in the owner would write to every
    # object it visits and so copy, into the owner, the pages the zygote shares with it.
    gc.collect()
    gc.freeze()
    requests, theirs_requests = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    reports, theirs_reports = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    owner = os.getpid()
    pid = os.fork()
    if pid == 0:

        def become() -> None:
            requests.close()
            reports.close()
            _become_template(owner, theirs_requests, theirs_reports, keep)

        in_child(become)
    theirs_requests.close()
    theirs_reports.close()
    return pid, requests, reports


def in_child(run: Callable[[], object]) -> NoReturn:
    """In a process just forked: ``run()``, then exit without returning into the caller's
    copy of the parent's stack (0; 1 with the traceback on stderr if it raised)."""
    code = 1
    try:
        run()
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)


def _become_template(
    owner: int, requests: socket.socket, reports: socket.socket, keep: tuple[int, ...]
) -> None:
    """In a zygote forked from its owner: shed what was the owner's but ``keep`` (which its
    children inherit), then serve."""
    shed({requests.fileno(), reports.fileno(), *keep})
    die_with_parent(owner)
    set_title("corral: zygote")
    logs.setup("zygote")
    serve(requests, reports)


def shed(keep: set[int]) -> None:
    """In a process just forked from a host: close the host's log handlers and every file
    descriptor but ``keep`` and the standard ones (stdin reopened on ``/dev/null``), restore
    default signal handling and lead a session of its own."""
    root = logging.getLogger()
    for handler in root.handlers:  # this copy's file descriptors, closed before the rest
        handler.close()
    root.handlers.clear()
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    signal.set_wakeup_fd(-1)
    for signum in signal.valid_signals():
        with contextlib.suppress(OSError, ValueError):
            if callable(signal.getsignal(signum)):
                if signum == signal.SIGINT:
                    signal.signal(signum, signal.default_int_handler)
                else:
                    signal.signal(signum, signal.SIG_DFL)
    os.setsid()


def serve(requests: socket.socket, reports: socket.socket) -> None:
    """Say Ready, then fork on request until the owner closes the requests socket."""
    # What the zygote holds stays out of its children's collections: a collection writes to
    # every object it visits, and the pages it writes to are copied, no longer shared.
    gc.freeze()
    template = Template(requests, reports)
    try:
        reports.send(encode(Ready(pid=os.getpid())))
        template.serve()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the owner closed its end (it stops, or stopped while this one imported)
