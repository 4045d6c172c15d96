"""The harness actor's session workers: spawned, called, forwarded to, heard from, reaped.

One worker process per session, supervised by the actor's own
:class:`~corral.actors._children.ChildSupervisor` (restarted on demand, counted per
session). This part starts a session's worker (forked from the actor's zygote when it can,
:mod:`corral._zygote`) and waits until it is up, calls it (giving up at once if it exits
meanwhile), passes it the inputs dispatch sends mid-turn, takes its heartbeats and stops
idle ones (H-08). It knows nothing of how a turn ends: that is
:mod:`._turns`, above it in the chain (:mod:`._base`).
"""

from __future__ import annotations

import logging
import time

import msgspec
import trio

from ... import logs
from ..._exceptions import BusError, RestartIntensityExceeded, Unreachable
from ...bus import Incoming, Request
from ...harnesses.protocol import (
    InputAccepted,
    Interrupt,
    PolicyVerdict,
    ToolResult,
    WorkerAlive,
    worker_address,
)
from .._actor import every, handles
from .._deferred import Deferred
from ._adopt import worker_record, worker_spec
from ._base import HarnessBase
from ._records import WorkerState

log = logging.getLogger("corral.actors.harness")

#: The inputs this actor passes on to the session's worker as they are.
Forwarded = ToolResult | PolicyVerdict | Interrupt

#: Exit code of a worker that could not load its harness implementation.
EXIT_CANNOT_LOAD = 78
#: How long a worker's spawn waits for a zygote that is starting (then it is exec'd).
ZYGOTE_WAIT_S = 5.0


class WorkerPool(HarnessBase):
    """The session workers of the harness actor."""

    async def _ensure_worker(
        self, session_id: str, harness: str, target: str, env: dict[str, str]
    ) -> tuple[str | None, bool]:
        """Spawn the session's worker if needed and wait until it is up: an error or None,
        and whether the worker died while it started (a kill, a crash: another may start;
        not one that cannot load its harness or did not start in time)."""
        name = worker_address(session_id)
        state = self.workers.get(session_id)
        child = self.children.children.get(name)
        alive = state is not None and not state.exited and child is not None and child.pid
        if alive and state is not None and state.harness == harness:
            return None, False
        if child is not None and child.state.up:
            # A worker on its way out (reaped, or another harness): let it finish first.
            await self.children.stop_child(name)
        new = WorkerState(session_id=session_id, harness=harness)
        self.workers[session_id] = new
        record = self.children.record
        spec = {
            "session_id": session_id,
            "target": target,
            "endpoint": self.peer.endpoint,
            "host_pid": record["host_pid"],
            "host_start": record["host_start"],
            "bus": msgspec.to_builtins(self.peer.bus),
            "liveness": msgspec.to_builtins(self.peer.liveness),
            "options": {},
        }
        if self.zygote is not None:
            # A zygote still importing is worth a short wait: the worker then starts sooner
            # than an exec would, and costs a fraction of one.
            await self.zygote.ready(ZYGOTE_WAIT_S)
        # The worker logs as the host does (corral.logs): the settings the host handed over.
        child_env = {**env, **logs.child_env(), "CORRAL_WORKER": msgspec.json.encode(spec).decode()}
        try:
            # A crashed worker's restart waits out its backoff here: the first crash in the
            # period respawns at once, each further one doubles the wait.
            child = await self.children.start_child(
                worker_spec(session_id, harness, child_env),
                record=worker_record(session_id, harness),
            )
        except RestartIntensityExceeded as exc:
            new.exited = True
            return str(exc), False
        except OSError as exc:
            new.exited = True
            return f"the {harness!r} harness could not start: {exc}", False
        new.pid = child.pid
        self.stats["spawned"] += 1
        with trio.move_on_after(self.start_timeout_s):
            await child.settled()
        if child.ready.is_set():
            return None, False
        exit_info = child.last_exit if child.exited.is_set() else None
        if exit_info and exit_info["code"] == EXIT_CANNOT_LOAD:
            return f"the {harness!r} harness could not be loaded ({target})", False
        if exit_info:
            why = f"the {harness!r} harness worker exited at start: {exit_info['reason']}"
            return why, True
        self.children.kill(name, "did not start in time")
        late = f"the {harness!r} harness worker did not start within {self.start_timeout_s:g}s"
        return late, False

    async def _call_worker(
        self, name: str, msg: Request[InputAccepted], timeout: float
    ) -> InputAccepted:
        """Call a worker, giving up at once if its process exits meanwhile.

        Raises:
            Unreachable: the worker is gone (or went while the call was under way).
        """
        child = self.children.children.get(name)
        reply: InputAccepted | None = None
        error: BusError | None = None
        async with trio.open_nursery() as nursery:

            async def watch_exit() -> None:
                if child is not None:
                    await child.exited.wait()
                    nursery.cancel_scope.cancel()

            async def call() -> None:
                nonlocal reply, error
                try:
                    reply = await self.peer.call(name, msg, timeout=timeout)
                except BusError as exc:
                    error = exc
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch_exit)
            nursery.start_soon(call)
        if error is not None:
            raise error
        if reply is None:
            # Its exit beat the call's failure: say how it ended, as an exit seen first does.
            last = child.last_exit if child is not None else None
            raise Unreachable(f"the worker {name!r} {last['reason'] if last else 'exited'}")
        return reply

    async def _await_exit(self, name: str) -> None:
        child = self.children.children.get(name)
        if child is not None:
            with trio.move_on_after(5):
                await child.exited.wait()
        state = self.workers.get(name.removeprefix("harness/"))
        if state is not None and not state.exited:
            state.exited = True
            state.exited_at = time.monotonic()

    @handles(Forwarded)
    async def forward(self, msg: Forwarded, incoming: Incoming) -> None:
        deferred = self.defer(incoming)
        self.in_order(msg.session_id, lambda: self._forward(msg, deferred), deferred)

    async def _forward(self, msg: Forwarded, deferred: Deferred) -> None:
        incoming = deferred.incoming
        state = self.workers.get(msg.session_id)
        if state is None or state.exited:
            await self.peer.reply(incoming, InputAccepted(status=404, error={"code": "no_worker"}))
            deferred.ack()
            return
        try:
            reply = await self._call_worker(worker_address(msg.session_id), msg, 10)
        except Exception as exc:
            reply = InputAccepted(
                status=503, error={"code": "worker_unreachable", "message": str(exc)}
            )
        await self.peer.reply(incoming, reply)
        deferred.ack()

    @handles(WorkerAlive)
    async def alive(self, msg: WorkerAlive, incoming: Incoming) -> None:
        state = self.workers.get(msg.session_id)
        if state is None or state.exited:
            return
        child = self.children.children.get(worker_address(msg.session_id))
        if child is None or child.pid != msg.pid:
            return
        now = time.monotonic()
        state.last_seen = now
        self.children.mark_ready(worker_address(msg.session_id))
        if msg.busy or msg.session_id in self.turns:
            state.last_active = now

    def _last_seen(self, name: str) -> float | None:
        """A worker's last heartbeat (its WorkerAlive), for the supervisor's liveness."""
        state = self.workers.get(name.removeprefix("harness/"))
        return state.last_seen if state is not None and not state.exited else None

    @every(0.25)
    async def _reap_workers(self) -> None:
        """Stop idle workers (H-08) and forget exited ones that nothing needs any more.

        Liveness is not checked here: the supervisor does it (``watch_liveness``), from the
        workers' heartbeats, as the host does for actors.
        """
        now = time.monotonic()
        for session_id, state in list(self.workers.items()):
            name = worker_address(session_id)
            child = self.children.children.get(name)
            if state.exited:
                period = self.children.flags.period_s
                if session_id not in self.turns and state.reclaimable(child, now, period):
                    if child is not None:
                        self.children.forget(name)
                    del self.workers[session_id]
                continue
            if child is None or not child.ready.is_set():
                continue
            if (
                self.idle_timeout_s > 0
                and session_id not in self.turns
                and now - state.last_active > self.idle_timeout_s
            ):
                log.info("reaping idle worker %s", name)
                self.stats["reaped"] += 1
                state.exited = True
                state.exited_at = now
                self.nursery.start_soon(self.children.stop_child, name)  # type: ignore[union-attr]
