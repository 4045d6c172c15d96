"""The host: the supervisor process that ``corral up`` runs.

It owns the bus broker (and so every durable mailbox), starts the configured actors in
order as child processes, watches their heartbeats, restarts them per their restart type
within the restart intensity, answers the CLI on the control socket, and on SIGINT/SIGTERM
stops the actors in reverse order.

If an actor crashes more than ``supervisor.intensity`` times in ``supervisor.period_s``
seconds the host stops every actor and exits with an error naming the actor and its last
exit — a crash loop is loud, never a silent spin.

The embedded control plane (:mod:`corral.actors._control_plane`): with no runner configured
and ``[server].enabled``, the host starts ``python -m corral.server`` as a supervised child
before any actor and binds one runner to it. What the host hands each actor, from its role,
is :mod:`corral.actors._actor_specs`.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import trio
import zmq

from .. import __version__
from .._child_env import actor_env, blank_environ_block, non_dumpable
from .._exceptions import ConfigError, CorralError, HostAlreadyRunning, RestartIntensityExceeded
from .._lifeline import become_subreaper
from ..bus import Broker, InspectRequest, open_peer
from ..config import BUILTIN, ActorSettings, Config, RunnerSettings, actor_plan, role_of
from ..instance import LAYOUT, Instance
from ..runners import resolve_runner_ids
from ._actor_specs import ActorSpecs, check_actor_options
from ._changes import Changes
from ._child_state import ChildState
from ._children import ChildEvent, ChildSupervisor, Exited, GaveUp, Spawning
from ._control import serve_control
from ._control_plane import ControlPlaneUnavailable, EmbeddedControlPlane, wants_control_plane
from ._process import alive, reap_orphans_on_sigchld, start_time, sweep
from ._specs import ChildSpec, Liveness, SupFlags

log = logging.getLogger("corral.host")

INPROC_ENDPOINT = "inproc://corral-broker"
#: A starting actor gets at least this long to say hello before liveness applies.
START_GRACE_S = 10.0

#: The broker's parked entries → the rows of ``corral elicitations``.
ElicitationView = Callable[[list[dict[str, Any]]], list[dict[str, Any]]]


class Host:
    """One corral host on one state dir.

    Args:
        config: the validated ``corral.toml``.
        state_dir: where the host keeps its state.
        config_path: the file ``config`` came from; the control plane reads it too.
        runner: the one runner ``corral up --server`` serves, besides any ``[[runners]]``.
        elicitations: which of the broker's parked entries are elicitations, and how each
            shows in ``corral elicitations`` (the supervisor knows no actor's messages; the
            CLI passes :func:`corral.actors.elicitations.elicitation_rows`).
    """

    def __init__(
        self,
        config: Config,
        state_dir: Path,
        *,
        config_path: Path | None = None,
        runner: RunnerSettings | None = None,
        elicitations: ElicitationView = lambda parked: [],
    ) -> None:
        self.config = config
        self._elicitations = elicitations
        self.config_path = config_path.absolute() if config_path is not None else None
        self.runner = runner
        self.instance = Instance(state_dir)
        self.started = time.monotonic()
        self._failure: CorralError | None = None
        #: Every runner this host serves, ids resolved: ``[[runners]]``, then the runner of
        #: ``--server`` or the one bound to the embedded control plane.
        self.runners: list[RunnerSettings] = []
        #: The embedded control plane, once the host wants one.
        self.control_plane: EmbeddedControlPlane | None = None
        self._plan: dict[str, tuple[str, ActorSettings]] = {}
        #: Bumped on every change of what ``status`` shows of the host itself.
        self.changes = Changes()
        self._state = "starting"
        self._stop = trio.Event()
        self.broker: Broker | None = None
        self.children: ChildSupervisor | None = None
        self._peer: Any = None

    @property
    def state(self) -> str:
        """``starting`` until every actor has been started in order, then ``running``, then
        ``stopping``."""
        return self._state

    @state.setter
    def state(self, value: str) -> None:
        self._state = value
        self.changes.bump()

    # --- the whole life of a host --------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until SIGINT/SIGTERM or a ``stop`` request.

        Raises:
            HostAlreadyRunning: another live host owns the state dir.
            RestartIntensityExceeded: an actor (or the control plane) crash-looped; everything
                was stopped.
            ControlPlaneUnavailable: the embedded control plane never came up.
            ConfigError: a built-in actor's options do not decode (before anything starts),
                or two runners resolved to the same id.
        """
        check_actor_options(self.config)
        inst = self.instance
        inst.prepare()
        self._claim()
        # A harness actor's workers outlive its crash: reparented to the host, not to init,
        # they stay in its tree for the actor's next incarnation to adopt (docs/supervision.md).
        become_subreaper()
        # The host's secrets stay in os.environ for the actors it hands them to, but out of
        # /proc/<host pid>/environ, which every process of the user reads (docs/security.md).
        blank_environ_block({*actor_env(), "CORRAL_STATE_DIR", "CORRAL_CONFIG"})
        non_dumpable()  # nor its memory, to other processes of the user
        ctx = zmq.Context()
        try:
            await self._run(ctx, task_status)
        finally:
            ctx.term()
            inst.host_file.unlink(missing_ok=True)
        if self._failure is not None:
            raise self._failure

    def _claim(self) -> None:
        inst = self.instance
        other = inst.read_host()
        if (
            other
            and other.get("pid") != os.getpid()
            and alive(other["pid"], other.get("start_time"))
        ):
            raise HostAlreadyRunning(
                f"a corral host (pid {other['pid']}) already runs on {inst.state_dir}"
            )
        killed = sweep(inst.children_dir)
        if killed:
            log.warning("killed %d leftover processes of an earlier host: %s", len(killed), killed)
        record = {
            "layout": LAYOUT,
            "pid": os.getpid(),
            "start_time": start_time(os.getpid()),
            "started_at": time.time(),
            "version": __version__,
            "state_dir": str(inst.state_dir),
            "control": str(inst.control_path),
            "bus": inst.bus_endpoint,
            # Where `corral logs` finds this host's log (None: stderr only).
            "log_file": self.config.logging.file or None,
        }
        tmp = inst.host_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, inst.host_file)

    async def _run(self, ctx: zmq.Context, task_status: trio.TaskStatus[None]) -> None:
        settings = self.config
        inst = self.instance
        broker = self.broker = Broker(
            [inst.bus_endpoint, INPROC_ENDPOINT], inst.mailbox_log, settings.bus, ctx=ctx
        )
        live = settings.liveness
        window = live.interval_s * live.liveness
        children = self.children = ChildSupervisor(
            SupFlags(
                intensity=settings.supervisor.intensity,
                period_s=settings.supervisor.period_s,
                liveness=Liveness(
                    window_s=window,
                    check_s=live.interval_s / 2,
                    start_grace_s=max(window, START_GRACE_S),
                ),
            ),
            run_dir=inst.children_dir,
            on_event=self._on_child_event,
        )
        broker.on_hello = lambda name, _pid: children.mark_ready(name)
        broker.exit_reason = self._exit_reason
        broker.on_parked = self.changes.bump
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            await nursery.start(children.run)
            await nursery.start(reap_orphans_on_sigchld, self._own_pids)
            async with open_peer(
                "supervisor", INPROC_ENDPOINT, bus=settings.bus, liveness=settings.liveness, ctx=ctx
            ) as peer:
                self._peer = peer
                await nursery.start(serve_control, inst.control_path, self._ops())
                nursery.start_soon(self._watch_signals)
                await self._start_children()
                self.state = "running"
                nursery.start_soon(children.watch_liveness, broker.last_seen)
                if self.control_plane is not None and self.control_plane.info is not None:
                    nursery.start_soon(self.control_plane.watch, self._rebind)
                if not self._stop.is_set():
                    log.info(
                        "corral host up: pid=%d state_dir=%s children=%s",
                        os.getpid(),
                        inst.state_dir,
                        ",".join(children.children),
                    )
                task_status.started()
                await self._stop.wait()
                self.state = "stopping"
                log.info("stopping actors")
                await children.stop_all()
            nursery.cancel_scope.cancel()

    async def _start_children(self) -> None:
        assert self.children is not None and self.broker is not None
        if wants_control_plane(self.config, self.runner):
            self.control_plane = EmbeddedControlPlane(
                config=self.config,
                instance=self.instance,
                config_path=self.config_path,
                children=self.children,
                changes=self.changes,
                stop=self._stop,
            )
            try:
                if not await self.control_plane.start():
                    return
            except ControlPlaneUnavailable as exc:
                self._failure = exc
                log.error("%s", exc)
                self._stop.set()
                return
        try:
            self.runners = self._resolve_runners()
        except ConfigError as exc:
            self._failure = exc
            log.error("%s", exc)
            self._stop.set()
            return
        plan = actor_plan(self.config)
        # Every actor starts at once, so their imports overlap; the broker holds stream
        # messages to one that has not said hello yet (its Spawning event), so no actor depends on
        # the order.
        started = []
        for name, target, actor in plan:
            self._plan[name] = (target, actor)
            started.append(await self.children.start_child(self._actor_spec(name, target, actor)))
        with trio.move_on_after(START_GRACE_S):
            for child in started:
                while not (child.ready.is_set() or child.state.over or self._stop.is_set()):
                    with trio.move_on_after(0.05):
                        await child.ready.wait()

    def _on_child_event(self, event: ChildEvent) -> None:
        assert self.broker is not None and self.children is not None
        self.changes.bump()
        child = self.children.children.get(event.name)
        # The control plane is a child too, but never joins the bus: no mailbox, no hold.
        bus_peer = child is not None and child.spec.bus_peer
        match event:
            case Spawning(name) if bus_peer:
                self.broker.starting(name)
            case Exited(name) if bus_peer:
                self.broker.peer_down(name)
            case GaveUp():
                self._give_up(event)

    def _actor_spec(self, name: str, target: str, actor: ActorSettings) -> ChildSpec:
        return ActorSpecs(self.config, self.instance, self.runners).spec(name, target, actor)

    def _resolve_runners(self) -> list[RunnerSettings]:
        """``[[runners]]`` plus the one of ``--server`` or the control plane, ids resolved once
        (stable made-up ids live in the state dir) so every actor sees the same ids."""
        runners = list(self.config.runners)
        if self.runner is not None:
            runners.append(self.runner)
        elif self.control_plane is not None and (bound := self.control_plane.runner()):
            runners.append(bound)
        return resolve_runner_ids(runners, self.instance.state_dir)

    async def _rebind(self) -> None:
        """A restarted control plane is up: if its address or token changed, restart the
        actors that talk to it with the new runner."""
        before = self.runners
        try:
            self.runners = self._resolve_runners()
        except ConfigError as exc:
            log.error("cannot rebind to the restarted control plane: %s", exc)
            return
        if self.runners == before:
            return
        log.warning("the control plane came back with a new address or token; rebinding")
        assert self.children is not None
        for name, (target, actor) in list(self._plan.items()):
            if not role_of(name).serves_runners or self._stop.is_set():
                continue
            await self.children.stop_child(name)
            await self.children.start_child(self._actor_spec(name, target, actor))

    def _own_pids(self) -> list[int]:
        children = self.children.children.values() if self.children is not None else ()
        return [c.proc.pid for c in children if c.proc is not None]

    async def _watch_signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                log.info("received %s", signal.Signals(signum).name)
                self._stop.set()

    def _give_up(self, event: GaveUp) -> None:
        assert self.children is not None
        self._failure = RestartIntensityExceeded(
            event.message(self.children.children[event.name].spec.called),
            child=event.name,
            last_exit=event.last_exit,
        )
        log.error("%s", self._failure)
        self._stop.set()

    def _exit_reason(self, name: str) -> str | None:
        child = self.children.children.get(name) if self.children else None
        return child.last_exit["reason"] if child and child.last_exit else None

    # --- control operations ----------------------------------------------------------------

    def _ops(self) -> dict[str, Any]:
        return {
            "status": self._op_status,
            "wait": self._op_wait,
            "mailboxes": self._op_mailboxes,
            "dead_letters": self._op_dead_letters,
            "inspect": self._op_inspect,
            "elicitations": self._op_elicitations,
            "stop": self._op_stop,
        }

    async def _op_status(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.children is not None
        # Each built-in actor's lists that status shows (its role), [] when it does not run.
        lists = {
            key: await self._actor_state(name, key)
            for name, role in BUILTIN.items()
            for key in role.status_lists
        }
        return {
            **lists,
            "host": {
                "pid": os.getpid(),
                "state": self.state,
                "state_dir": str(self.instance.state_dir),
                "uptime_s": round(time.monotonic() - self.started, 3),
                "version": __version__,
                # What ``wait`` waits past: bumped on each change of the host's own rows.
                "changes": self.changes.version,
            },
            "actors": [c.statistics() for c in self.children.children.values() if c.spec.bus_peer],
            "server": self._server_status(),
        }

    async def _op_wait(self, request: dict[str, Any]) -> dict[str, Any]:
        """The answer of op ``then`` (``status`` or ``elicitations``) once the host's change
        counter is past ``after``, or after ``wait_s`` (at most 60 s) either way, with the
        counter as ``changes``: a long poll, so that a waiter for a restart, a parked
        elicitation or the host to be running asks once per change instead of every few
        milliseconds."""
        then = {"status": self._op_status, "elicitations": self._op_elicitations}
        op = then.get(str(request.get("then", "status")))
        if op is None:
            raise ValueError(f"wait: 'then' is one of {sorted(then)}")
        after = int(request.get("after", -1))
        wait_s = min(max(float(request.get("wait_s", 10.0)), 0.0), 60.0)
        changes = await self.changes.wait_past(after, wait_s)
        return {**await op(request), "changes": changes}

    def _server_status(self) -> dict[str, Any] | None:
        """The embedded control plane's row of ``corral status``; None when there is none."""
        return self.control_plane.status() if self.control_plane is not None else None

    async def _actor_state(self, actor: str, key: str) -> list[dict[str, Any]]:
        """One list from an actor's inspection snapshot, or [] if it does not answer soon.

        Best effort: a busy or restarting actor must not stall ``corral status``.
        """
        assert self.children is not None
        child = self.children.children.get(actor)
        if child is None or child.state is not ChildState.RUNNING:
            return []
        with trio.move_on_after(1.0):
            try:
                reply = await self._peer.call(actor, InspectRequest(), timeout=1.0)
                return list(reply.state.get(key, []))
            except Exception:
                log.debug("status: %s did not answer", actor, exc_info=True)
        return []

    async def _op_mailboxes(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.broker is not None
        actor = request.get("actor")
        peek = int(request.get("peek") or 0)
        return {"mailboxes": self.broker.mailboxes(actor, peek=peek)}

    async def _op_dead_letters(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.broker is not None
        return {"dead_letters": self.broker.dead_letters()}

    async def _op_elicitations(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.broker is not None
        return {"elicitations": self._elicitations(self.broker.parked())}

    async def _op_inspect(self, request: dict[str, Any]) -> dict[str, Any]:
        reply = await self._peer.call(str(request["actor"]), InspectRequest(), timeout=5)
        return msgspec.to_builtins(reply)

    async def _op_stop(self, request: dict[str, Any]) -> dict[str, Any]:
        self._stop.set()
        return {"stopping": True}
