"""The host: the supervisor process that ``corral up`` runs.

It owns the bus broker (and so every durable mailbox), starts the configured actors in
order as child processes, watches their heartbeats, restarts them per their restart type
within the restart intensity, answers the CLI on the control socket, and on SIGINT/SIGTERM
drains (no new turn starts; the turns in flight get ``supervisor.drain_timeout_s`` to end)
and then stops the actors in reverse order. Under systemd it says when it is ready, when it
stops, and pings the watchdog (:mod:`corral.actors._notify`).

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
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import trio
import zmq

from .. import __version__
from .. import _heap as heap
from .._changes import Changes
from .._child_env import actor_env, blank_environ_block, non_dumpable
from .._exceptions import ConfigError, CorralError, HostAlreadyRunning, RestartIntensityExceeded
from .._lifeline import become_subreaper
from .._zygote import Zygote, drop_seed, seed_fd, seed_status
from ..bus import Broker, DrainRequest, InspectRequest, open_peer
from ..config import (
    BUILTIN,
    ActorSettings,
    Config,
    RunnerSettings,
    actor_plan,
    listen_address,
    role_of,
)
from ..instance import LAYOUT, Instance
from ..runners import resolve_runner_ids
from ._actor_specs import ActorSpecs, actor_preload, check_actor_options, forks_from_zygotes
from ._child_state import ChildState
from ._children import ChildEvent, ChildSupervisor, Exited, GaveUp, Spawning
from ._control import serve_control
from ._control_plane import ControlPlaneUnavailable, EmbeddedControlPlane, wants_control_plane
from ._metrics import ChildRow, HostMetrics, Sources, serve_metrics
from ._notify import Notifier
from ._process import alive, reap_orphans_on_sigchld, spawn, start_time, sweep
from ._specs import ChildSpec, Liveness, SupFlags

log = logging.getLogger("corral.host")

INPROC_ENDPOINT = "inproc://corral-broker"
#: A starting actor gets at least this long to say hello before liveness applies.
START_GRACE_S = 10.0
#: How long the first actors' start waits for the zygote to import their modules (then
#: those not forked are exec'd); it takes ~0.5 s, the time an exec'd actor spends alike.
ZYGOTE_WAIT_S = 5.0
#: How often a drain looks whether the broker has delivered what it holds.
DELIVERY_POLL_S = 0.02

#: The broker's parked entries → the rows of ``corral elicitations``.
ElicitationView = Callable[[list[dict[str, Any]]], list[dict[str, Any]]]


def _blank_environ() -> None:
    """Blank the host's environ block but what it hands every actor (never a secret)."""
    blank_environ_block({*actor_env(), "CORRAL_STATE_DIR", "CORRAL_CONFIG"})


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
        #: Cancelled by a second SIGINT/SIGTERM: stop now, whatever is still in flight.
        self._drain_scope = trio.CancelScope()
        #: The service manager (systemd), when the host runs under one.
        self.notifier = Notifier()
        #: ``[metrics]``: what ``/metrics`` shows, and the address it is served on.
        self.metrics: HostMetrics | None = None
        self.metrics_url: str | None = None
        self.broker: Broker | None = None
        #: Where the actors are forked from (None: each is exec'd).
        self.zygote: Zygote | None = None
        self.children: ChildSupervisor | None = None
        self._peer: Any = None

    @property
    def state(self) -> str:
        """``starting`` until every actor has been started in order, then ``running``, then
        ``draining`` (asked to stop: the turns in flight end) and ``stopping``."""
        return self._state

    @state.setter
    def state(self, value: str) -> None:
        self._state = value
        self.changes.bump()

    # --- the whole life of a host --------------------------------------------------------

    def fork_zygote(self) -> bool:
        """Fork the actors' zygote from this process (``[supervisor] zygote``), so that it
        and every actor it forks share the host's pages (the interpreter, the modules both
        import) instead of holding copies of their own; whether it was. ``corral up`` calls
        it before ``trio.run``: a fork inside a trio run would leave the child inside it.
        The host's environ block is blanked first (:meth:`run` blanks it again, harmlessly),
        since the zygote shows it until a child overwrites its own. Without this call
        :meth:`run` execs the zygote. A host none of whose actors forks from a zygote of its
        own stops the seed here: nothing would ask it for one.

        Raises:
            ConfigError: a built-in actor's options do not decode (:func:`check_actor_options`).
        """
        if not forks_from_zygotes(self.config, check_actor_options(self.config)):
            drop_seed()  # no actor would ask it for a zygote
        if not self.config.supervisor.zygote or self.zygote is not None:
            return False
        _blank_environ()
        self.zygote = self._new_zygote()
        return self.zygote.prefork()

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
        check_actor_options(self.config)  # a bad key stops the host here, before anything starts
        inst = self.instance
        inst.prepare()
        self._claim()
        # A harness actor's workers outlive its crash: reparented to the host, not to init,
        # they stay in its tree for the actor's next incarnation to adopt (docs/supervision.md).
        become_subreaper()
        # The host's secrets stay in os.environ for the actors it hands them to, but out of
        # /proc/<host pid>/environ, which every process of the user reads (docs/security.md).
        _blank_environ()
        if self.config.supervisor.zygote and self.zygote is None:
            self.zygote = self._new_zygote()  # not forked by fork_zygote: it is exec'd
        non_dumpable()  # nor its memory, to other processes of the user
        ctx = zmq.Context()
        try:
            await self._run(ctx, task_status)
        finally:
            ctx.term()
            if self.zygote is not None:
                self.zygote.close()
            inst.host_file.unlink(missing_ok=True)
            self.notifier.close()
        if self._failure is not None:
            raise self._failure

    def _new_zygote(self) -> Zygote:
        seed = seed_fd()  # kept open for the harness actor, which asks it for its zygotes
        keep = () if seed is None else (seed,)
        return Zygote(actor_preload(self.config), actor_env(), fallback=spawn, keep=keep)

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
            spawn=spawn if self.zygote is None else self.zygote.spawn,
        )
        broker.on_hello = lambda name, _pid: children.mark_ready(name)
        broker.exit_reason = self._exit_reason
        broker.on_parked = self.changes.bump
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            if self.zygote is not None:
                # Started first, stopped last: the nursery's cancel, after every actor's stop.
                await nursery.start(self.zygote.run)
            await nursery.start(children.run)
            await nursery.start(reap_orphans_on_sigchld, self._own_pids)
            nursery.start_soon(self.notifier.watchdog)
            nursery.start_soon(heap.release_when_quiet, lambda: broker.stats["routed"])
            async with open_peer(
                "supervisor", INPROC_ENDPOINT, bus=settings.bus, liveness=settings.liveness, ctx=ctx
            ) as peer:
                self._peer = peer
                await nursery.start(serve_control, inst.control_path, self._ops())
                await self._serve_metrics(nursery)
                nursery.start_soon(self._watch_signals)
                if not self._stop.is_set():
                    await self._start_children()
                self.state = "running"
                nursery.start_soon(self._ready_when_all_run)
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
                self.notifier.send("STOPPING=1", "STATUS=stopping")
                with self._drain_scope:
                    await self._drain()
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
        if self.zygote is not None:
            # One import shared by every actor instead of one each; an actor spawned before
            # the zygote is ready (or without one) is exec'd.
            await self.zygote.ready(ZYGOTE_WAIT_S)
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

    async def _serve_metrics(self, nursery: trio.Nursery) -> None:
        """Serve ``/metrics`` if ``[metrics] listen`` is set; an address that cannot be
        bound stops the host (exit 1, the address and the reason named)."""
        listen = self.config.metrics.listen
        if listen is None:
            return
        broker = self.broker
        assert broker is not None
        self.metrics = HostMetrics(
            Sources(
                state=lambda: self.state,
                children=self._child_rows,
                mailboxes=broker.mailboxes,
                dead_letters=broker.dead_letters,
                elicitations=lambda: self._elicitations(broker.parked()),
                inspect=self._snapshot_of,
            )
        )
        host, port = listen_address(listen)
        try:
            bound = await nursery.start(serve_metrics, self.metrics, host, port)
        except OSError as exc:
            self._failure = CorralError(f"cannot serve metrics on {listen}: {exc.strerror or exc}")
            log.error("%s", self._failure)
            self._stop.set()
            return
        shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
        self.metrics_url = f"http://{shown}:{bound[1]}/metrics"
        self.changes.bump()

    def _child_rows(self) -> list[ChildRow]:
        children = self.children.children.values() if self.children else ()
        return [
            ChildRow(
                name=c.spec.name,
                bus_peer=c.spec.bus_peer,
                running=c.state is ChildState.RUNNING,
                pid=c.pid,
                restarts=c.restarts,
                last_exit=c.last_exit,
            )
            for c in children
        ]

    async def _snapshot_of(self, actor: str) -> dict[str, Any] | None:
        """An actor's inspection snapshot, or None if it does not answer within a second.

        Best effort: a busy or restarting actor must not stall ``corral status`` or a
        scrape.
        """
        with trio.move_on_after(1.0):
            try:
                reply = await self._peer.call(actor, InspectRequest(), timeout=1.0)
                return dict(reply.state)
            except Exception:
                log.debug("%s did not answer an inspection", actor, exc_info=True)
        return None

    async def _ready_when_all_run(self) -> None:
        """Tell the service manager ``READY=1`` once every actor runs (once only: a restart
        later is the supervisor's business, not a new start)."""
        seen = -1
        while not self._stop.is_set():
            if self._all_run():
                count = len(self._plan)
                self.notifier.send("READY=1", f"STATUS=running: {count} actors")
                return
            seen = await self.changes.wait_past(seen, 60.0)

    def _all_run(self) -> bool:
        assert self.children is not None
        rows = [c for c in self.children.children.values() if c.spec.bus_peer]
        return bool(rows) and all(c.state is ChildState.RUNNING for c in rows)

    async def _drain(self) -> None:
        """Let the work in flight end before the actors stop, for at most
        ``supervisor.drain_timeout_s``: every running actor is asked to take no new work and
        to answer once what it has in flight is done (dispatch: its active turns; the
        gateway: the events it has not sent yet), or at the deadline with what is left. Two
        rounds, the second once the first left nothing: an actor's drain may leave work to
        another's (the gateway relays the end of the turn dispatch waited for). What is left at
        the deadline ends as after a crash: a turn in flight ``failed``
        (``harness_restarted``) once the next host runs, never lost or run twice."""
        timeout = self.config.supervisor.drain_timeout_s
        if timeout <= 0 or self._failure is not None or self.state != "running":
            return
        self.state = "draining"
        log.info("draining for up to %.0fs (a second signal stops at once)", timeout)
        self.notifier.send(f"STATUS=draining: the turns in flight end (up to {timeout:.0f}s)")
        deadline = trio.current_time() + timeout
        left = await self._drain_round(deadline)
        if not any(left.values()):
            # Once more: what the first round waited for may have left work to another
            # actor (the end of a turn, to the gateway to relay). Asked once the broker has
            # delivered that work: an actor handles its messages in order, so its drain then
            # starts with the work in hand.
            await self._delivered(deadline)
            left = await self._drain_round(deadline)
        busy = {name: n for name, n in left.items() if n}
        if busy:
            log.warning("drain timed out after %.0fs; still in flight: %s", timeout, busy)
        else:
            log.info("drained")

    async def _delivered(self, deadline: float) -> None:
        """Return once no running actor's mailbox holds a durable message not yet delivered
        to it (or at the deadline)."""
        assert self.broker is not None and self.children is not None
        broker, children = self.broker, self.children.children
        with trio.move_on_at(deadline):
            while any(
                box["queued"]
                for name, child in children.items()
                if child.spec.bus_peer and child.state is ChildState.RUNNING
                for box in broker.mailboxes(name)
            ):
                await trio.sleep(DELIVERY_POLL_S)

    async def _drain_round(self, deadline: float) -> dict[str, int]:
        """Ask every running actor to drain, at once; what each has left in flight."""
        assert self.children is not None
        left: dict[str, int] = {}

        async def ask(name: str) -> None:
            wait_s = max(0.0, deadline - trio.current_time())
            try:
                reply = await self._peer.call(name, DrainRequest(wait_s=wait_s), timeout=wait_s + 2)
                left[name] = reply.in_flight
            except Exception as exc:
                # Gone meanwhile: what it had in flight ends as after a crash.
                log.warning("drain: %s did not answer: %s", name, exc)
                left[name] = 0

        async with trio.open_nursery() as nursery:
            for name, child in self.children.children.items():
                if child.spec.bus_peer and child.state is ChildState.RUNNING:
                    nursery.start_soon(ask, name)
        return left

    def _on_child_event(self, event: ChildEvent) -> None:
        assert self.broker is not None and self.children is not None
        self.changes.bump()
        child = self.children.children.get(event.name)
        # The control plane is a child too, but never joins the bus: no mailbox, no hold.
        bus_peer = child is not None and child.spec.bus_peer
        if isinstance(event, Spawning) and self.metrics is not None:
            rows = {row.name: row for row in self._child_rows()}
            if event.name in rows:
                self.metrics.child_spawning(rows[event.name])
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
        # Only the processes this one waits for by pid: a forked actor is the zygote's child,
        # and the host's to reap only once its zygote has died (then it is reparented here).
        children = self.children.children.values() if self.children is not None else ()
        own = [c.proc.pid for c in children if isinstance(c.proc, subprocess.Popen)]
        if self.zygote is not None and self.zygote.proc is not None:
            own.append(self.zygote.proc.pid)
        return own

    async def _watch_signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                log.info("received %s", signal.Signals(signum).name)
                if self._stop.is_set():
                    self._drain_scope.cancel()  # asked twice: stop now
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
            "requeue_dead_letters": self._op_requeue_dead_letters,
            "purge_dead_letters": self._op_purge_dead_letters,
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
                "metrics": self.metrics_url,
                "zygote": None if self.zygote is None else self.zygote.statistics(),
                "seed": seed_status(),
                "heap_releases": heap.stats["releases"],
                "bus": None if self.broker is None else self.broker.stats,
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
        snapshot = await self._snapshot_of(actor)
        return list((snapshot or {}).get(key, []))

    async def _op_mailboxes(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.broker is not None
        actor = request.get("actor")
        peek = int(request.get("peek") or 0)
        return {"mailboxes": self.broker.mailboxes(actor, peek=peek)}

    async def _op_dead_letters(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.broker is not None
        return {"dead_letters": self.broker.dead_letters()}

    async def _op_requeue_dead_letters(self, request: dict[str, Any]) -> dict[str, Any]:
        """Deliver the dead letters ``ids`` again: ``{"requeued": [id], "refused": [{id,
        error}], "unknown": [id]}`` (a refused one stays a dead letter)."""
        assert self.broker is not None
        answer: dict[str, list[Any]] = {"requeued": [], "refused": [], "unknown": []}
        for mid in [str(i) for i in request.get("ids", [])]:
            try:
                self.broker.requeue_dead(mid)
            except KeyError:
                answer["unknown"].append(mid)
            except ValueError as exc:
                answer["refused"].append({"id": mid, "error": str(exc)})
            else:
                answer["requeued"].append(mid)
        return answer

    async def _op_purge_dead_letters(self, request: dict[str, Any]) -> dict[str, Any]:
        """Drop the dead letters ``ids`` for good: ``{"purged": [id], "unknown": [id]}``."""
        assert self.broker is not None
        ids = [str(i) for i in request.get("ids", [])]
        purged = self.broker.purge_dead(ids)
        return {"purged": purged, "unknown": [i for i in ids if i not in purged]}

    async def _op_elicitations(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.broker is not None
        return {"elicitations": self._elicitations(self.broker.parked())}

    async def _op_inspect(self, request: dict[str, Any]) -> dict[str, Any]:
        reply = await self._peer.call(str(request["actor"]), InspectRequest(), timeout=5)
        return msgspec.to_builtins(reply)

    async def _op_stop(self, request: dict[str, Any]) -> dict[str, Any]:
        self._stop.set()
        return {"stopping": True}
