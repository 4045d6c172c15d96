"""Taking over the workers of a dead incarnation of the harness actor (#15).

A worker dies with the host, not with the harness actor (:mod:`corral._lifeline`): when the
actor is killed, its workers are reparented to the host (a child subreaper) and go on with
their turns — exec'd ones, and those forked from its zygote, which dies with the actor. Its
next incarnation finds them by their pid files, each recording the host it belongs to (pid
and start time) and the worker's session and harness: the workers of this very host are
adopted (:meth:`~corral.actors._children.ChildSupervisor.adopt`), anything else — the
leftovers of an earlier host, e.g. a worker that was stopped when its host died and so could
not see it go — is killed, and so is a worker of this host with no pid file (its actor died
between the spawn and the file's write; told by its command line, or by the title its zygote
gave it). Each adopted worker is then asked what it holds
(:class:`~corral.harnesses.protocol.Inventory`): the turn it runs, the elicitations that
turn waits on, the turn it last ended.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import trio

from ..._exceptions import BusError
from ..._proctitle import WORKER_TITLE_PREFIX
from ..._zygote import FORKED_TITLE_PREFIX
from ...harnesses.protocol import Holdings, Inventory, worker_address
from .._actor import ActorContext
from .._children import ChildSupervisor
from .._process import kill_group, start_time, sweep_except
from .._specs import ChildSpec
from ._records import OwnedTurn, ParkedElicitation, WorkerState

log = logging.getLogger("corral.actors.harness")

#: The module a harness worker runs (``python -m``), by which the host's children are told
#: until the worker sets its process title (``WORKER_TITLE_PREFIX``).
WORKER_MODULE = "corral.harnesses._worker"
#: How a worker's title begins: its own, or the one a zygote gives a worker it forked until
#: the worker sets its own.
_WORKER_TITLES = (WORKER_TITLE_PREFIX.encode(), f"{FORKED_TITLE_PREFIX}{WORKER_MODULE}".encode())


def host_record(ctx: ActorContext) -> dict[str, Any]:
    """Which host this actor's workers belong to (for their pid files and lifelines): the
    one its context names — its parent is the host's zygote when that forked it."""
    if ctx.host_pid is None:
        host = os.getppid()
        return {"host_pid": host, "host_start": start_time(host)}
    return {"host_pid": ctx.host_pid, "host_start": ctx.host_start}


def worker_record(session_id: str, harness: str) -> dict[str, Any]:
    """What a worker's pid file says of it, for a successor that adopts it."""
    return {"session_id": session_id, "harness": harness}


def worker_spec(session_id: str, harness: str, env: dict[str, str]) -> ChildSpec:
    """A session's worker as its supervisor knows it (``env``: its spawn environment)."""
    return ChildSpec(
        name=worker_address(session_id),
        argv=[sys.executable, "-m", WORKER_MODULE],
        env=env,
        restart="transient",
        restart_on="demand",
        shutdown_timeout_s=2.0,
        label=f"the {harness!r} harness worker of this session",
    )


def adopt_workers(children: ChildSupervisor, run_dir: Path) -> dict[str, WorkerState]:
    """Adopt the live workers of this host in ``run_dir`` and kill every other process
    there; the adopted ones by session. The host is the one ``children`` records in each
    pid file (:func:`host_record`)."""
    host = children.record

    def ours(info: dict[str, Any]) -> bool:
        mine = all(info.get(key) == value for key, value in host.items())
        return mine and isinstance(info.get("session_id"), str) and "harness" in info

    killed, kept = sweep_except(run_dir, ours)
    if killed:
        log.warning("killed %d workers of an earlier host: %s", len(killed), killed)
    unrecorded = _unrecorded_workers(host["host_pid"], {int(info["pid"]) for info in kept})
    for pid in unrecorded:
        kill_group(pid, signal.SIGKILL)
    if unrecorded:
        log.warning("killed %d workers with no pid file: %s", len(unrecorded), unrecorded)
    adopted: dict[str, WorkerState] = {}
    for info in kept:
        session_id, harness = info["session_id"], str(info["harness"])
        record = worker_record(session_id, harness)
        # Its spawn environment is not needed again: a worker that exits is spawned anew
        # for its session's next turn, from that turn's start.
        spec = worker_spec(session_id, harness, {})
        child = children.adopt(spec, int(info["pid"]), info.get("start_time"), record=record)
        if child is not None:
            adopted[session_id] = WorkerState(session_id=session_id, harness=harness, pid=child.pid)
    if adopted:
        log.info("adopted %d workers of the previous incarnation", len(adopted))
    return adopted


def _unrecorded_workers(host_pid: int, recorded: set[int]) -> list[int]:
    """The host's children that run a harness worker but are not ``recorded``: spawned by an
    incarnation that died before it wrote their pid files, they ran no turn (a turn is given
    to a worker only after that), and nobody would ever stop them but the host's end."""
    children: set[int] = set()
    for listing in Path(f"/proc/{host_pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            children.update(int(pid) for pid in listing.read_text().split())
    found = []
    for pid in sorted(children - recorded):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        # A worker that has set its title shows that instead of its command line; one forked
        # from a zygote, the title the zygote gave it until then.
        if cmdline.startswith(_WORKER_TITLES) or WORKER_MODULE.encode() in cmdline.split(b"\0"):
            found.append(pid)
    return found


async def ask_holdings(
    peer: Any, children: ChildSupervisor, workers: dict[str, WorkerState], timeout: float
) -> dict[str, Holdings]:
    """Ask every worker of ``children`` (the adopted ones, at start) at once what it holds,
    by session; one that exits, or does not answer within ``timeout`` (stopped, wedged), is
    left out — one killed with its harness actor is not waited for. An answer is a sign of
    life (``workers``' ``last_seen``): the others' wait must not count against it."""
    answers: dict[str, Holdings] = {}

    async def ask(session_id: str, exited: trio.Event) -> None:
        name = worker_address(session_id)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_cancel_on, exited, nursery.cancel_scope)
            try:
                reply = await peer.call(name, Inventory(session_id=session_id), timeout=timeout)
            except BusError as exc:
                log.warning("adopted worker of %s did not say what it holds: %s", session_id, exc)
            else:
                answers[session_id] = reply
                if session_id in workers:
                    workers[session_id].last_seen = time.monotonic()
            nursery.cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        for name, child in children.children.items():
            nursery.start_soon(ask, name.removeprefix("harness/"), child.exited)
    return answers


async def _cancel_on(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


def take_back(
    turn: OwnedTurn,
    holdings: dict[str, Holdings],
    worker: WorkerState | None,
    parked: dict[str, ParkedElicitation],
) -> bool:
    """Whether the session's adopted ``worker`` holds ``turn``, whose start a previous
    incarnation took (it runs the turn, or ended it and its terminal is on the way): then
    the turn is this incarnation's again without being started again — the worker's
    terminal, or its death, ends it — and the elicitations it waits on are the turn's again.
    The session's ``holdings`` are used up either way."""
    session_id, turn_id = turn.start.session_id, turn.start.turn_id
    held = holdings.get(session_id)
    if held is None or turn_id not in (held.turn_id, held.ended):
        return False
    del holdings[session_id]
    if worker is None or worker.exited:
        return False
    log.info("turn %s is run on by its adopted worker", turn_id)
    turn.elicitations.update(i for i, p in parked.items() if p.msg.turn_id == turn_id)
    worker.last_active = time.monotonic()
    return True
