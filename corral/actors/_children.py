"""Reusable child supervision: spawn, monitor, restart, stop — OTP one_for_one.

The host supervisor runs its actors with this, and the harness actor runs its worker
processes with it too: the same restart accounting, backoff and liveness for both, each
told by data (:class:`~._specs.SupFlags` for the supervisor, :class:`~._specs.ChildSpec`
per child) how it differs. A :class:`ChildSupervisor` owns one trio task per child that
spawns the process, waits for it to exit and, per the child's restart type, spawns it
again — at once or after its backoff (``restart_on = "exit"``), or when its owner next
starts it (``"demand"``). More than ``intensity`` restarts in ``period_s`` seconds and the
supervisor gives up on the child (a :class:`GaveUp` event), because a crash loop must stop
loudly rather than spin.

What happens is reported to the owner as one typed event at a time (:data:`ChildEvent`):
:class:`Spawning`, :class:`Exited`, :class:`GaveUp`. A child's state moves only through
:func:`~._child_state.step` (the state machine is drawn in :mod:`._child_state`).
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import trio

from .._exceptions import RestartIntensityExceeded
from ._child_state import ChildState, decide_exit, silent_for, step
from ._process import (
    Adopted,
    Process,
    Spawn,
    describe_exit,
    kill_group,
    spawn,
    terminate,
    wait_exit,
    write_pidfile,
)
from ._restart import add_restart, forget_old, intensity_exceeded, restart_delay, should_restart
from ._specs import ChildSpec, SupFlags

log = logging.getLogger("corral.supervisor")


class Spawning(msgspec.Struct, frozen=True):
    """The child is about to be spawned (its first start or a restart)."""

    name: str


class Ready(msgspec.Struct, frozen=True):
    """The child said hello (or is otherwise ready): it is ``running``."""

    name: str


class Exited(msgspec.Struct, frozen=True):
    """The child's process exited (``last_exit``: code, reason, at, pid)."""

    name: str
    last_exit: dict[str, Any]


class GaveUp(msgspec.Struct, frozen=True):
    """The child restarted more than ``intensity`` times in ``period_s``: it is ``failed``."""

    name: str
    last_exit: dict[str, Any] | None
    intensity: int
    period_s: float

    def message(self, called: str) -> str:
        """``actor 'x' restarted more than R times in Ts; last exit: ...``."""
        reason = self.last_exit["reason"] if self.last_exit else "unknown"
        return (
            f"{called} restarted more than {self.intensity} times in {self.period_s:g}s; "
            f"last exit: {reason}"
        )


ChildEvent = Spawning | Ready | Exited | GaveUp


@dataclass(slots=True)
class Child:
    """A child's live record, as ``corral status`` shows it."""

    spec: ChildSpec
    state: ChildState
    proc: Process | None = None
    #: What its pid file records besides pid and start time (e.g. what a successor that
    #: adopts it needs to know about it).
    record: dict[str, Any] = field(default_factory=dict)
    restarts: int = 0
    last_exit: dict[str, Any] | None = None
    started_at: float = 0.0
    kill_reason: str | None = None
    stopping: bool = False
    #: When a child restarted on demand may be spawned again (its backoff).
    restart_due: float = 0.0
    exited: trio.Event = field(default_factory=trio.Event)
    ready: trio.Event = field(default_factory=trio.Event)

    @property
    def pid(self) -> int | None:
        """The running process id, if any."""
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    async def settled(self) -> bool:
        """Wait until the child is ready (True) or its process has exited (False)."""
        async with trio.open_nursery() as nursery:

            async def until(event: trio.Event) -> None:
                await event.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(until, self.ready)
            nursery.start_soon(until, self.exited)
        return self.ready.is_set()

    def statistics(self) -> dict[str, Any]:
        """The row ``corral status`` prints."""
        return {
            "name": self.spec.name,
            "pid": self.pid,
            "state": self.state.value,
            "restarts": self.restarts,
            "last_exit": self.last_exit,
            "uptime_s": round(time.monotonic() - self.started_at, 3)
            if self.state is ChildState.RUNNING
            else None,
        }


class ChildSupervisor:
    """Supervises a dynamic set of child processes.

    Args:
        flags: strategy, intensity, period, backoff and liveness of this supervisor.
        run_dir: where pid files go, for the start-up sweep of a later supervisor.
        on_event: called with each :data:`ChildEvent` as it happens (in the supervisor's
            task: it must not block).
        record: what every child's pid file records besides its own (e.g. which host it
            belongs to).
        spawn: what starts a child process (the exec spawn by default; the harness actor's
            forks its workers from a zygote, :mod:`corral._zygote`).
    """

    def __init__(
        self,
        flags: SupFlags,
        *,
        run_dir: Path,
        on_event: Callable[[ChildEvent], None] = lambda event: None,
        record: dict[str, Any] | None = None,
        spawn: Spawn = spawn,
    ) -> None:
        self.flags = flags
        self.spawn = spawn
        self.run_dir = run_dir
        self.on_event = on_event
        self.record = dict(record or {})
        self.children: dict[str, Child] = {}
        #: Restart times within the period, per child or all under "" (``intensity_per``).
        self._restarts: dict[str, list[float]] = {}
        self._nursery: trio.Nursery | None = None
        self._stopping = False

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the children's tasks; returns (after stopping them) when cancelled."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None

    # --- starting and stopping -------------------------------------------------------------

    async def start_child(self, spec: ChildSpec, *, record: dict[str, Any] | None = None) -> Child:
        """Spawn a child now and supervise it. Its state is ``starting`` until marked ready.
        ``record`` goes into its pid file.

        A child left ``restarting`` for its owner (``restart_on = "demand"``) is spawned
        again once its backoff has passed (this waits for it); one the supervisor gave up on
        starts again once its restarts within the period allow.

        Raises:
            ValueError: the child is up, or being restarted by the supervisor.
            RestartIntensityExceeded: the child failed and its restarts within the period
                still exceed the intensity.
        """
        if self._nursery is None:
            raise RuntimeError("the supervisor is not running")
        old = self.children.get(spec.name)
        if old is not None and (old.state.up or not old.exited.is_set()):
            raise ValueError(f"child {spec.name!r} is already running")
        if old is not None and old.state is ChildState.RESTARTING:
            wait = old.restart_due - time.monotonic()
            if wait > 0:
                await trio.sleep(wait)
        if old is not None and old.state is ChildState.FAILED:
            restarts = forget_old(self._history(spec.name), time.monotonic(), self.flags.period_s)
            if intensity_exceeded(restarts, self.flags.intensity):
                raise RestartIntensityExceeded(
                    GaveUp(
                        spec.name, old.last_exit, self.flags.intensity, self.flags.period_s
                    ).message(spec.called),
                    child=spec.name,
                    last_exit=old.last_exit,
                )
        if self._stopping:
            raise ValueError(f"child {spec.name!r} is not started: the supervisor is stopping")
        child = Child(
            spec=spec, state=step(old.state if old else None, "spawn"), record=dict(record or {})
        )
        if old is not None and spec.restart_on == "demand" and old.spec.restart_on == "demand":
            # The same child again: its restarts and last exit carry on.
            child.restarts = old.restarts + (old.state is not ChildState.STOPPED)
            child.last_exit = old.last_exit
        self.children[spec.name] = child
        self._spawn(child)
        self._nursery.start_soon(self._watch, child)
        return child

    def adopt(
        self, spec: ChildSpec, pid: int, started: int | None, *, record: dict[str, Any]
    ) -> Child | None:
        """Supervise a live process this supervisor did not spawn — a dead predecessor's
        child, reparented to the host — as one of its own: the same record, state, liveness
        and restart accounting. It is ``running`` at once (its liveness window starts now);
        its exit is seen through a pidfd and its exit status is unknown (it is not our
        child), which its ``last_exit`` says: ``{"code": None, "reason": "exited (status
        unknown: ...)"}``, counted as an abnormal exit. None if the process is gone.

        Its pid file is its predecessor's, already in ``run_dir`` (with ``record``).

        Raises:
            ValueError: a child of that name is up.
        """
        if self._nursery is None:
            raise RuntimeError("the supervisor is not running")
        old = self.children.get(spec.name)
        if old is not None and (old.state.up or not old.exited.is_set()):
            raise ValueError(f"child {spec.name!r} is already running")
        proc = Adopted.open(pid, started)
        if proc is None:
            (self.run_dir / f"{_file_safe(spec.name)}.pid").unlink(missing_ok=True)
            return None
        child = Child(spec=spec, state=step(None, "spawn"), proc=proc, record=dict(record))
        child.started_at = time.monotonic()
        child.state = step(child.state, "ready")
        child.ready.set()
        self.children[spec.name] = child
        self._nursery.start_soon(self._watch, child)
        self.on_event(Ready(spec.name))
        return child

    def mark_ready(self, name: str) -> None:
        """The child said hello (or is otherwise ready): it is running."""
        child = self.children.get(name)
        if child is not None and child.state is ChildState.STARTING:
            child.state = step(child.state, "ready")
            child.ready.set()
            self.on_event(Ready(name))

    def kill(self, name: str, reason: str) -> None:
        """SIGKILL a child (e.g. it stopped heartbeating); it is restarted per its spec."""
        child = self.children.get(name)
        if child is None or child.proc is None or child.proc.poll() is not None:
            return
        child.kill_reason = reason
        log.warning("killing %s (pid %d): %s", name, child.proc.pid, reason)
        kill_group(child.proc.pid, signal.SIGCONT)
        kill_group(child.proc.pid, signal.SIGKILL)

    async def stop_child(self, name: str) -> None:
        """Stop a child for good: SIGTERM, then SIGKILL after its shutdown timeout."""
        child = self.children.get(name)
        if child is None:
            return
        child.stopping = True
        if child.proc is not None:
            await terminate(child.proc, child.spec.shutdown_timeout_s)
        await child.exited.wait()
        if child.state is ChildState.RESTARTING:
            child.state = step(child.state, "stop")

    async def stop_all(self) -> None:
        """Stop every child, in reverse start order."""
        self._stopping = True
        for name in reversed(list(self.children)):
            await self.stop_child(name)

    def forget(self, name: str) -> None:
        """Drop the record of a child whose process is gone (its restarts too, when counted
        per child): a supervisor of many short-lived children stays bounded.

        Raises:
            ValueError: the child is still up.
        """
        child = self.children.get(name)
        if child is None:
            return
        if child.state.up or not child.exited.is_set():
            raise ValueError(f"child {name!r} is still running")
        del self.children[name]
        if self.flags.intensity_per == "child":
            self._restarts.pop(name, None)

    def statistics(self) -> list[dict[str, Any]]:
        """Rows for ``corral status``, in start order."""
        return [c.statistics() for c in self.children.values()]

    # --- liveness --------------------------------------------------------------------------

    async def watch_liveness(self, last_seen: Callable[[str], float | None]) -> None:
        """Kill every bus-peer child that stays silent too long (per ``flags.liveness``),
        until cancelled; ``last_seen(name)`` is the monotonic time of its last sign of life."""
        liveness = self.flags.liveness
        if liveness is None:
            return
        while True:
            await trio.sleep(liveness.check_s)
            self.check_liveness(last_seen, time.monotonic())

    def check_liveness(self, last_seen: Callable[[str], float | None], now: float) -> None:
        """One round of :meth:`watch_liveness`."""
        liveness = self.flags.liveness
        if liveness is None:
            return
        for name, child in list(self.children.items()):
            if not child.spec.bus_peer or child.pid is None:
                continue
            silence = silent_for(
                child.state,
                last_seen=max(last_seen(name) or 0.0, child.started_at),
                now=now,
                window_s=liveness.window_s,
                start_grace_s=liveness.start_grace_s,
            )
            if silence is not None:
                self.kill(name, f"no heartbeat for {silence:.1f}s")

    # --- the per-child loop ----------------------------------------------------------------

    def _history(self, name: str) -> list[float]:
        return self._restarts.get(name if self.flags.intensity_per == "child" else "", [])

    def _spawn(self, child: Child) -> None:
        child.ready = trio.Event()
        child.kill_reason = None
        child.started_at = time.monotonic()
        self.on_event(Spawning(child.spec.name))
        child.proc = self.spawn(child.spec.argv, env=child.spec.env, cwd=child.spec.cwd)
        write_pidfile(
            self.run_dir / f"{_file_safe(child.spec.name)}.pid",
            child.proc.pid,
            **self.record,
            **child.record,
        )

    async def _watch(self, child: Child) -> None:
        name = child.spec.name
        try:
            while True:
                assert child.proc is not None
                code = await wait_exit(child.proc)
                (self.run_dir / f"{_file_safe(name)}.pid").unlink(missing_ok=True)
                child.last_exit = describe_exit(
                    code,
                    reason=f"{child.kill_reason} ({describe_exit(code)['reason']})"
                    if child.kill_reason
                    else None,
                )
                child.last_exit["pid"] = child.proc.pid
                if not child.stopping:
                    log.warning("%s exited: %s", name, child.last_exit["reason"])
                self.on_event(Exited(name, child.last_exit))
                stopping = self._stopping or child.stopping
                restart = should_restart(child.spec.restart, exit_code=code, stopping=stopping)
                restarts: list[float] = []
                if restart:
                    key = name if self.flags.intensity_per == "child" else ""
                    restarts = add_restart(
                        self._restarts.get(key, []), time.monotonic(), self.flags.period_s
                    )
                    self._restarts[key] = restarts
                decision = decide_exit(
                    restart=restart, gave_up=intensity_exceeded(restarts, self.flags.intensity)
                )
                child.state = step(child.state, decision)
                if decision == "give_up":
                    self.on_event(
                        GaveUp(name, child.last_exit, self.flags.intensity, self.flags.period_s)
                    )
                if decision != "restart":
                    return
                backoff = self.flags.backoff
                delay = restart_delay(len(restarts), first_s=backoff.first_s, max_s=backoff.max_s)
                if child.spec.restart_on == "demand":
                    child.restart_due = time.monotonic() + delay
                    return
                if delay:
                    await trio.sleep(delay)
                if self._stopping or child.stopping:
                    child.state = step(child.state, "stop")
                    return
                child.restarts += 1
                child.state = step(child.state, "spawn")
                self._spawn(child)
        finally:
            child.exited.set()
            if child.proc is not None and child.proc.poll() is None:
                kill_group(child.proc.pid, signal.SIGKILL)


def _file_safe(name: str) -> str:
    return name.replace("/", "__")
