"""Reusable child supervision: spawn, monitor, restart, stop — OTP one_for_one.

The host supervisor runs its actors with this, and the harness actor runs its worker
processes with it too. A :class:`ChildSupervisor` owns one trio task per child that spawns
the process, waits for it to exit and, per the child's restart type, spawns it again.
Restart intensity is counted across all children of one supervisor: more than
``intensity`` restarts in ``period_s`` seconds and the supervisor gives up
(``on_give_up``), because a crash loop must stop loudly rather than spin.

Child state is explicit: ``starting`` (spawned, not yet said hello), ``running``,
``restarting`` (exited, waiting for its restart delay), ``stopped``, ``failed`` (gave up).
"""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from ._process import describe_exit, kill_group, spawn, terminate, wait_exit, write_pidfile
from ._restart import RestartType, add_restart, intensity_exceeded, should_restart

log = logging.getLogger("corral.supervisor")


@dataclass(frozen=True, slots=True)
class ChildSpec:
    """How to start one child and what to do when it exits."""

    name: str
    argv: list[str]
    env: dict[str, str]
    restart: RestartType = "permanent"
    shutdown_timeout_s: float = 5.0
    cwd: Path | None = None


@dataclass(slots=True)
class Child:
    """A child's live record, as ``corral status`` shows it."""

    spec: ChildSpec
    state: str = "starting"
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    last_exit: dict[str, Any] | None = None
    started_at: float = 0.0
    kill_reason: str | None = None
    stopping: bool = False
    exited: trio.Event = field(default_factory=trio.Event)
    ready: trio.Event = field(default_factory=trio.Event)

    @property
    def pid(self) -> int | None:
        """The running process id, if any."""
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def statistics(self) -> dict[str, Any]:
        """The row ``corral status`` prints."""
        return {
            "name": self.spec.name,
            "pid": self.pid,
            "state": self.state,
            "restarts": self.restarts,
            "last_exit": self.last_exit,
            "uptime_s": round(time.monotonic() - self.started_at, 3)
            if self.state == "running"
            else None,
        }


class ChildSupervisor:
    """Supervises a dynamic set of child processes.

    Args:
        intensity: restarts allowed within ``period_s`` before giving up.
        period_s: the window for ``intensity``.
        run_dir: where pid files go, for the start-up sweep of a later supervisor.
        restart_delay: seconds before a restart, doubling per consecutive crash of the
            same child up to ``max_restart_delay`` (0: restart at once, as OTP does).
        on_spawn: called with the child's name just before each spawn (first or restart).
        on_exit: called with (name, last_exit) whenever a child exits.
        on_give_up: called with (name, last_exit) when intensity is exceeded; the
            supervisor stops restarting that child and marks it ``failed``.
    """

    def __init__(
        self,
        *,
        intensity: int,
        period_s: float,
        run_dir: Path,
        restart_delay: float = 0.0,
        max_restart_delay: float = 5.0,
        on_spawn: Callable[[str], None] | None = None,
        on_exit: Callable[[str, dict[str, Any]], None] | None = None,
        on_give_up: Callable[[str, dict[str, Any] | None], None] | None = None,
    ) -> None:
        self.intensity = intensity
        self.period_s = period_s
        self.run_dir = run_dir
        self.restart_delay = restart_delay
        self.max_restart_delay = max_restart_delay
        self.on_spawn = on_spawn
        self.on_exit = on_exit
        self.on_give_up = on_give_up
        self.children: dict[str, Child] = {}
        self._restarts: list[float] = []
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

    def start_child(self, spec: ChildSpec) -> Child:
        """Spawn a child now and supervise it. Its state is ``starting`` until marked ready."""
        if self._nursery is None:
            raise RuntimeError("the supervisor is not running")
        if spec.name in self.children and self.children[spec.name].state not in (
            "stopped",
            "failed",
        ):
            raise ValueError(f"child {spec.name!r} is already running")
        child = Child(spec=spec)
        self.children[spec.name] = child
        self._spawn(child)
        self._nursery.start_soon(self._watch, child)
        return child

    def mark_ready(self, name: str) -> None:
        """The child said hello: it is running."""
        child = self.children.get(name)
        if child is not None and child.state == "starting":
            child.state = "running"
            child.ready.set()

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

    async def stop_all(self) -> None:
        """Stop every child, in reverse start order."""
        self._stopping = True
        for name in reversed(list(self.children)):
            await self.stop_child(name)

    def statistics(self) -> list[dict[str, Any]]:
        """Rows for ``corral status``, in start order."""
        return [c.statistics() for c in self.children.values()]

    # --- the per-child loop ----------------------------------------------------------------

    def _spawn(self, child: Child) -> None:
        child.state = "starting"
        child.ready = trio.Event()
        child.kill_reason = None
        child.started_at = time.monotonic()
        if self.on_spawn is not None:
            self.on_spawn(child.spec.name)
        child.proc = spawn(child.spec.argv, env=child.spec.env, cwd=child.spec.cwd)
        write_pidfile(self.run_dir / f"{_file_safe(child.spec.name)}.pid", child.proc.pid)

    async def _watch(self, child: Child) -> None:
        consecutive = 0
        try:
            while True:
                assert child.proc is not None
                code = await wait_exit(child.proc)
                (self.run_dir / f"{_file_safe(child.spec.name)}.pid").unlink(missing_ok=True)
                child.last_exit = describe_exit(
                    code,
                    reason=f"{child.kill_reason} ({describe_exit(code)['reason']})"
                    if child.kill_reason
                    else None,
                )
                child.last_exit["pid"] = child.proc.pid
                uptime = time.monotonic() - child.started_at
                if not child.stopping:
                    log.warning("%s exited: %s", child.spec.name, child.last_exit["reason"])
                if self.on_exit is not None:
                    self.on_exit(child.spec.name, child.last_exit)
                stopping = self._stopping or child.stopping
                if not should_restart(child.spec.restart, exit_code=code, stopping=stopping):
                    child.state = "stopped"
                    return
                self._restarts = add_restart(self._restarts, time.monotonic(), self.period_s)
                if intensity_exceeded(self._restarts, self.intensity):
                    child.state = "failed"
                    if self.on_give_up is not None:
                        self.on_give_up(child.spec.name, child.last_exit)
                    return
                child.state = "restarting"
                consecutive = consecutive + 1 if uptime < self.period_s else 1
                if self.restart_delay:
                    delay = min(self.restart_delay * 2 ** (consecutive - 1), self.max_restart_delay)
                    await trio.sleep(delay)
                    if self._stopping or child.stopping:
                        child.state = "stopped"
                        return
                child.restarts += 1
                self._spawn(child)
        finally:
            child.exited.set()
            if child.proc is not None and child.proc.poll() is None:
                kill_group(child.proc.pid, signal.SIGKILL)


def _file_safe(name: str) -> str:
    return name.replace("/", "__")
