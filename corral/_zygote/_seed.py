"""The seed: a template ``corral up`` forks before it holds any secret, from which each
harness actor's zygote is forked.

**Why.** A worker must never hold the host's memory: its runner tokens, its configuration,
its environment (D-13..D-15; an agent's shell runs as the worker's user). So the harness
actor's zygote was exec'd, a whole interpreter of its own that shared no page with the host's
tree (~19 MB of PSS beside one worker). The seed is the host's memory from before there was
anything to hide: ``corral up`` execs itself again with every variable that is not on the
actors' allow-list moved to a memfd (:func:`corral._child_env.reexec_clean`, called before
anything else is imported), imports what the actors and the workers run, forks the seed
(:func:`fork_seed`), and only then reads the memfd
(:func:`corral._child_env.take_hidden_env`), its flags and its config. The seed, each zygote
it forks and each worker those fork share the host's pages up to that moment, and nothing
the host read after it.

**How a harness actor reaches it.** The seed holds one end of a ``SOCK_SEQPACKET`` socket
pair; the other, the *seed socket*, stays open in the host and, through the actors' zygote, in
every actor forked from it (:data:`SEED_ENV` names its fd and inode: an exec'd actor, whose
fds were closed, finds no socket of that inode and does without). A request is one datagram,
a :class:`~._messages.Sprout` naming what the new zygote imports, carrying the zygote's two
sockets (``SCM_RIGHTS``): the seed forks a zygote that serves them exactly as an exec'd one
would (:func:`~._template.serve`) and answers nothing on the seed socket. The owner learns the
rest from the zygote's reports socket: Ready, or its close (then it execs its zygote, as it
does for a host not started by ``corral up``, or once the seed is gone).

**Lifetimes.** The seed dies with the host (``PR_SET_PDEATHSIG``) and ends when every seed
socket is closed. The kernel reaps the zygotes it forks (``SIGCHLD`` ignored); each ends when
its owner closes its requests socket (the owner stops, or dies: its sockets close with it),
and its workers live on, reparented to the host, for the harness actor's next incarnation to
adopt, as the workers of an exec'd zygote do.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import select
import signal
import socket
import stat
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from .. import logs
from .._child_env import CLEAN_ENV, RESERVE_ENV
from .._lifeline import die_with_parent
from .._proctitle import set_title
from ._messages import MAX_DATAGRAM, Sprout, decode_sprout, encode
from ._template import in_child, preload_all, serve, shed, show_environ

log = logging.getLogger("corral.zygote")

#: In a process that holds the seed socket: ``FD:INODE`` of it.
SEED_ENV = "CORRAL_SEED"

#: The seed this process forked: its pid and a pidfd on it (for :func:`seed_status`).
_forked: tuple[int, int] | None = None


def fork_seed(items: Sequence[str]) -> int | None:
    """In a ``corral up`` exec'd by :func:`~corral._child_env.reexec_clean`, before it reads
    its hidden variables: import ``items`` (what the actors and the workers run), fork the
    seed, and name the seed socket in :data:`SEED_ENV`; its fd. None, and no seed, in any
    other process or with a second thread (a fork copies no thread but the caller's)."""
    clean = os.environ.pop(CLEAN_ENV, None) == str(os.getpid())
    if not clean or len(os.listdir("/proc/self/task")) > 1:
        os.environ.pop(RESERVE_ENV, None)
        return None
    preload_all(items)
    # Collected, then frozen: a collection in the host would write to every object it visits,
    # and so copy into the host the pages the seed's line shares with it.
    gc.collect()
    gc.freeze()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    host = os.getpid()
    try:
        pid = os.fork()
    except OSError as exc:
        log.warning("could not fork the seed (harness zygotes are exec'd): %s", exc)
        ours.close()
        theirs.close()
        return None
    if pid == 0:

        def become() -> None:
            ours.close()
            _become_seed(host, theirs)

        in_child(become)
    theirs.close()
    os.environ.pop(RESERVE_ENV, None)
    global _forked
    _forked = (pid, os.pidfd_open(pid))
    fd = ours.detach()  # open for the host's life: the actors' zygote keeps it for its actors
    os.environ[SEED_ENV] = f"{fd}:{os.fstat(fd).st_ino}"
    return fd


def drop_seed() -> None:
    """Stop the seed this process forked, and close its seed socket: no process of this host
    will ask it for a zygote (the seed's pages, unshared, would cost memory for nothing)."""
    global _forked
    fd = seed_fd()
    os.environ.pop(SEED_ENV, None)
    if fd is not None:
        os.close(fd)
    if _forked is not None:
        _, pidfd = _forked
        _forked = None
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        os.close(pidfd)  # the host reaps it with its other orphans


def seed_status() -> dict[str, Any] | None:
    """The seed this process forked, as ``corral status`` shows it: ``{pid, alive}``; None
    if it forked none."""
    if _forked is None:
        return None
    pid, pidfd = _forked
    return {"pid": pid, "alive": not select.select([pidfd], [], [], 0)[0]}


def seed_fd(environ: Mapping[str, str] | None = None) -> int | None:
    """The seed socket :data:`SEED_ENV` names, if this process holds it (an exec'd process
    holds none: its fd, if open at all, is another file)."""
    source = os.environ if environ is None else environ
    fd_s, _, ino_s = source.get(SEED_ENV, "").partition(":")
    try:
        fd, ino = int(fd_s), int(ino_s)
        info = os.fstat(fd)
    except (ValueError, OSError):
        return None
    return fd if stat.S_ISSOCK(info.st_mode) and info.st_ino == ino else None


def sprout(
    fd: int, items: Sequence[str], env: Mapping[str, str]
) -> tuple[socket.socket, socket.socket]:
    """Ask the seed on ``fd`` for a zygote that imports ``items``, its environment ``env``:
    the (requests, reports) sockets it will serve. It says Ready on the second, or closes it.

    Raises:
        OSError: the seed is gone (or its socket full).
    """
    requests, theirs_requests = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    reports, theirs_reports = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    seed = socket.socket(fileno=os.dup(fd))
    try:
        seed.setblocking(False)
        socket.send_fds(
            seed,
            [encode(Sprout(items=list(items), env=dict(env)))],
            [theirs_requests.fileno(), theirs_reports.fileno()],
        )
    except OSError:
        requests.close()
        reports.close()
        raise
    finally:
        seed.close()
        theirs_requests.close()
        theirs_reports.close()
    return requests, reports


def _become_seed(host: int, sock: socket.socket) -> None:
    """In the seed: shed what was the host's, then fork a zygote per request until every
    seed socket is closed."""
    shed({sock.fileno()})
    die_with_parent(host)
    set_title("corral: seed")
    logs.setup("seed")
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the zygotes
    while True:
        data, fds, _, _ = socket.recv_fds(sock, MAX_DATAGRAM, 2)
        if not data:
            return
        try:
            request = decode_sprout(data)
            if len(fds) != 2:
                raise ValueError(f"{len(fds)} sockets came with it, not 2")
            _sprout(sock, request, fds)
        except (msgspec.DecodeError, ValueError, OSError) as exc:
            log.warning("the seed forked no zygote: %s", exc)
        finally:
            for fd in fds:
                os.close(fd)


def _sprout(sock: socket.socket, request: Sprout, fds: list[int]) -> None:
    """Fork the zygote ``request`` asks for, serving ``fds`` (requests, reports)."""
    if os.fork():
        return
    in_child(lambda: _become_zygote(sock, request, fds))


def _become_zygote(sock: socket.socket, request: Sprout, fds: list[int]) -> None:
    """In a zygote the seed forked: drop the seed's socket, take the owner's two, then
    serve as an exec'd zygote would."""
    sock.close()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # a zygote reaps its children itself
    requests = socket.socket(fileno=os.dup(fds[0]))
    reports = socket.socket(fileno=os.dup(fds[1]))
    for fd in fds:
        os.close(fd)
    os.environ.clear()
    os.environ.update(request.env)
    show_environ(request.env)
    set_title("corral: zygote")
    logs.setup("zygote")
    preload_all(request.items)
    serve(requests, reports)
