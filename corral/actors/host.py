"""The host: the supervisor process that ``corral up`` runs.

It owns the bus broker (and so every durable mailbox), starts the configured actors in
order as child processes, watches their heartbeats, restarts them per their restart type
within the restart intensity, answers the CLI on the control socket, and on SIGINT/SIGTERM
stops the actors in reverse order.

If an actor crashes more than ``supervisor.intensity`` times in ``supervisor.period_s``
seconds the host stops every actor and exits with an error naming the actor and its last
exit — a crash loop is loud, never a silent spin.

The embedded control plane. With no runner configured (no ``[[runners]]``, no ``--server``)
and ``[server].enabled``, the host first starts ``python -m corral.server`` as a supervised
child (before any actor, so it is stopped last), waits for the ``server/server.json`` it
writes once listening, and binds one runner to it: the gateway's tunnel goes to its URL with
its runner token, and dispatch and policy make their runner → server calls there. The control
plane is not a bus peer, so instead of heartbeats the host probes it over HTTP and kills it
when it stops answering; after a restart it waits for the new ``server.json`` again, and if
the URL or token changed it restarts the actors that talk to it with the new binding.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import msgspec
import trio
import zmq

from .. import __version__
from .._child_env import (
    NETWORK_VARS,
    actor_env,
    blank_environ_block,
    hide,
    non_dumpable,
    spec_variables,
)
from .._exceptions import (
    ConfigError,
    CorralError,
    HostAlreadyRunning,
    RestartIntensityExceeded,
    SupervisionError,
)
from .._lifeline import become_subreaper
from ..bus import Broker, InspectRequest, open_peer
from ..config import (
    BUILTIN,
    BUILTIN_ACTORS,
    BUILTIN_OPTIONS,
    CUSTOM_ROLE,
    ActorRole,
    ActorSettings,
    Config,
    RunnerSettings,
    actor_plan,
    check_options,
)
from ..instance import LAYOUT, Instance
from ..runners import resolve_runner_ids
from ._changes import Changes
from ._child_state import ChildState
from ._children import ChildEvent, ChildSupervisor, Exited, GaveUp, Spawning
from ._control import serve_control
from ._process import alive, reap_orphans_on_sigchld, start_time, sweep
from ._specs import ChildSpec, Liveness, SupFlags

log = logging.getLogger("corral.host")

INPROC_ENDPOINT = "inproc://corral-broker"
#: A starting actor gets at least this long to say hello before liveness applies.
START_GRACE_S = 10.0

#: The actor that starts harness workers, and so expands ``$VAR`` in agent specs: the one
#: that is handed the host's variables.
_EXPANDS_VARS = BUILTIN["harness"].target

#: The control plane's name among the host's children (it is not an actor: ``corral status``
#: reports it under ``server``, not ``actors``).
SERVER_CHILD = "server"
#: A (re)started control plane gets this long to write its ``server.json``.
CONTROL_PLANE_START_S = 30.0
#: How often a running control plane is probed over HTTP, and how long it may go without
#: answering before it is killed (and restarted) as hung.
CONTROL_PLANE_PROBE_S = 2.0
CONTROL_PLANE_PROBE_WINDOW_S = 20.0
#: How the control plane child starts. It arranges to die with the host first (the same
#: ``PR_SET_PDEATHSIG`` every actor sets, :mod:`corral._lifeline`), then runs
#: ``python -m corral.server`` unchanged: the server stays a separate program that knows
#: nothing of the host.
_SERVER_BOOT = (
    "import runpy, sys; "
    "from corral._lifeline import die_with_parent; "
    "die_with_parent(int(sys.argv.pop(1))); "
    "runpy.run_module('corral.server', run_name='__main__', alter_sys=True)"
)


#: The broker's parked entries → the rows of ``corral elicitations``.
ElicitationView = Callable[[list[dict[str, Any]]], list[dict[str, Any]]]


class ControlPlaneUnavailable(SupervisionError):
    """The embedded control plane did not come up before its deadline."""


def read_server_file(path: Path) -> dict[str, Any] | None:
    """The control plane's ``server.json``, or None if absent or half-written."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("url") else None


def role_of(name: str) -> ActorRole:
    """A built-in actor's role (even with another ``target``); an actor of your own has none."""
    return BUILTIN.get(name, CUSTOM_ROLE)


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
        #: The control plane's ``server.json`` as last read (embedded mode only).
        self.control_plane: dict[str, Any] | None = None
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
                if self.control_plane is not None:
                    nursery.start_soon(self._watch_control_plane)
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
        if self._wants_control_plane() and not await self._start_control_plane():
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
        role = role_of(name)
        return ChildSpec(
            name=name,
            argv=[sys.executable, "-m", "corral.actors._entry"],
            env=self._actor_env(name, target, actor),
            restart=actor.restart or role.restart,
            shutdown_timeout_s=actor.shutdown_timeout_s
            or role.shutdown_timeout_s
            or self.config.supervisor.shutdown_timeout_s,
            label=f"actor {name!r}",
        )

    def _actor_env(self, name: str, target: str, actor: ActorSettings) -> dict[str, str]:
        """An actor's environment: its environ block holds only :func:`actor_env` and the
        state dir; its spec (the runner tokens in it), the proxy settings of an actor that
        talks to servers and, for the harness actor, the host's variables that ``$VAR`` in
        an agent spec expands from reach it hidden (:func:`corral._child_env.hide`)."""
        hidden = {"CORRAL_CHILD": json.dumps(self._child_spec(name, target, actor))}
        if role_of(name).serves_runners:
            hidden.update({k: os.environ[k] for k in NETWORK_VARS if k in os.environ})
        if target == _EXPANDS_VARS:
            hidden.update(spec_variables())
        return hide({**actor_env(), "CORRAL_STATE_DIR": str(self.instance.state_dir)}, hidden)

    def _resolve_runners(self) -> list[RunnerSettings]:
        """``[[runners]]`` plus the one of ``--server`` or the control plane, ids resolved once
        (stable made-up ids live in the state dir) so every actor sees the same ids."""
        runners = list(self.config.runners)
        if self.runner is not None:
            runners.append(self.runner)
        elif self.control_plane is not None:
            info = self.control_plane
            runners.append(
                RunnerSettings(
                    server=str(info["url"]),
                    id=info.get("runner_id") or None,
                    token=info.get("runner_token") or None,
                )
            )
        return resolve_runner_ids(runners, self.instance.state_dir)

    def _child_spec(self, name: str, target: str, actor: Any) -> dict[str, Any]:
        options = dict(actor.options)
        role = role_of(name)
        if role.serves_runners and self.runners:
            # The host's runners, after any listed in the actor's own options.
            options["runners"] = [
                *options.get("runners", []),
                *msgspec.to_builtins(self.runners),
            ]
        if role.gets_workspace and self.config.workspace:
            options["workspace"] = self.config.workspace
        if role.knows_actors:
            plan = {actor for actor, _, _ in actor_plan(self.config)}
            for option, other in role.knows_actors.items():
                options.setdefault(option, other in plan)
        return {
            "name": name,
            "target": target,
            "endpoint": self.instance.bus_endpoint,
            "state_dir": str(self.instance.state_dir),
            "options": options,
            "bus": msgspec.to_builtins(self.config.bus),
            "liveness": msgspec.to_builtins(self.config.liveness),
            "parent_pid": os.getpid(),
        }

    # --- the embedded control plane --------------------------------------------------------

    @property
    def server_file(self) -> Path:
        """Where the control plane writes its address and runner token once listening."""
        return self.instance.state_dir / "server" / "server.json"

    def _wants_control_plane(self) -> bool:
        """No runner configured anywhere, ``[server].enabled`` and a gateway to bind."""
        if self.runner is not None or self.config.runners or not self.config.server.enabled:
            return False
        tunnels = [s for name, _, s in actor_plan(self.config) if role_of(name).opens_tunnel]
        if not tunnels or any(s.options.get("runners") for s in tunnels):
            return False
        try:
            found = importlib.util.find_spec("corral.server.__main__") is not None
        except ImportError:
            found = False
        if not found:
            # A trimmed install: run as a runner with no server rather than not at all.
            log.warning("the embedded control plane (corral.server) is not installed")
        return found

    def _control_plane_argv(self) -> list[str]:
        argv = [
            sys.executable,
            "-c",
            _SERVER_BOOT,
            str(os.getpid()),
            "--state-dir",
            str(self.instance.state_dir),
            "--host",
            self.config.server.host,
        ]
        if self.config_path is not None:
            argv += ["--config", str(self.config_path)]
        if self.config.server.port:
            argv += ["--port", str(self.config.server.port)]
        return argv

    async def _start_control_plane(self) -> bool:
        """Start the control plane and bind the runner to it; False if it never came up."""
        assert self.children is not None
        child = await self.children.start_child(
            ChildSpec(
                name=SERVER_CHILD,
                argv=self._control_plane_argv(),
                env=actor_env(),
                restart="permanent",
                shutdown_timeout_s=self.config.supervisor.shutdown_timeout_s,
                bus_peer=False,
                label="the embedded control plane",
            )
        )
        info = None
        with trio.move_on_after(CONTROL_PLANE_START_S):
            info = await self._await_server_file()
        if info is None:
            if not self._stop.is_set():
                last = child.last_exit["reason"] if child.last_exit else "still running"
                self._failure = ControlPlaneUnavailable(
                    f"the embedded control plane did not start within "
                    f"{CONTROL_PLANE_START_S:g}s: no {self.server_file} from it "
                    f"(last exit: {last}). Serve another server with `corral up --server URL` "
                    "or set [server] enabled = false."
                )
                log.error("%s", self._failure)
                self._stop.set()
            return False
        self._bind(info)
        return True

    async def _await_server_file(self) -> dict[str, Any] | None:
        """Wait for the ``server.json`` of the control plane's current process.

        A file left by an earlier process (another pid) does not count. Returns None if the
        child stopped or failed, or the host is stopping.
        """
        assert self.children is not None
        while not self._stop.is_set():
            child = self.children.children.get(SERVER_CHILD)
            if child is None or child.state.over:
                return None
            info = read_server_file(self.server_file)
            if info is not None and child.pid is not None and info.get("pid") == child.pid:
                self.children.mark_ready(SERVER_CHILD)
                return info
            await trio.sleep(0.05)
        return None

    def _bind(self, info: dict[str, Any]) -> None:
        self.control_plane = info
        self.changes.bump()
        log.info(
            "control plane at %s (pid %s, runner %s)",
            info["url"],
            info.get("pid"),
            info.get("runner_id"),
        )

    async def _watch_control_plane(self) -> None:
        """Bring a restarted control plane back into service; kill a hung one."""
        assert self.children is not None
        # One probe every few seconds is not worth an INFO line each.
        logging.getLogger("httpx").setLevel(logging.WARNING)
        last_ok = next_probe = time.monotonic()
        async with httpx.AsyncClient(timeout=5.0) as http:
            while not self._stop.is_set():
                child = self.children.children.get(SERVER_CHILD)
                if child is None or child.state.over:
                    return
                if child.state in (ChildState.STARTING, ChildState.RESTARTING):
                    with trio.move_on_after(CONTROL_PLANE_START_S) as scope:
                        info = await self._await_server_file()
                    if scope.cancelled_caught:
                        self.children.kill(
                            SERVER_CHILD, f"no server.json within {CONTROL_PLANE_START_S:g}s"
                        )
                        continue
                    if info is None:
                        return
                    await self._rebind(info)
                    last_ok = next_probe = time.monotonic() + CONTROL_PLANE_PROBE_S
                    continue
                # Asleep until the next probe; the control plane exiting (a change of the
                # host's status) wakes it at once.
                bound, nap = self.control_plane, next_probe - time.monotonic()
                if bound is None or nap > 0:
                    await self.changes.wait_past(self.changes.version, max(nap, 0.05))
                    continue
                next_probe = time.monotonic() + CONTROL_PLANE_PROBE_S
                try:
                    await http.get(str(bound["url"]).rstrip("/") + "/api/version")
                    last_ok = time.monotonic()  # any answer at all proves it is serving
                except httpx.HTTPError as exc:
                    silent = time.monotonic() - last_ok
                    if silent > CONTROL_PLANE_PROBE_WINDOW_S and child.state is ChildState.RUNNING:
                        reason = f"no HTTP answer for {silent:.0f}s ({exc})"
                        self.children.kill(SERVER_CHILD, reason)

    async def _rebind(self, info: dict[str, Any]) -> None:
        """A restarted control plane is up: if its address or token changed, restart the
        actors that talk to it with the new runner."""
        before = self.runners
        self._bind(info)
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
        child = self.children.children.get(SERVER_CHILD) if self.children else None
        if child is None:
            return None
        info = self.control_plane or {}
        return {
            "url": info.get("url"),
            "pid": child.pid,
            "state": child.state.value,
            "restarts": child.restarts,
            "last_exit": child.last_exit,
            "runner_id": info.get("runner_id"),
        }

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


def check_actor_options(config: Config) -> None:
    """Decode the options of every built-in actor the host will run with its options Struct.

    The host does it before it starts anything, so that a typo in ``[actors.<name>.options]``
    stops ``corral up`` with the key named instead of crash-looping the actor. An actor whose
    ``target`` replaces the built-in class is left to check its own options, and so is one
    whose module does not import here (its child process reports that, and crash-loops).

    Raises:
        ConfigError: naming the first bad key (``actors.dispatch.options.turn_timout_s``).
    """
    for name, target, settings in actor_plan(config):
        where = BUILTIN_OPTIONS.get(name)
        if where is None or target != BUILTIN_ACTORS[name]:
            continue
        module, _, attr = where.partition(":")
        try:
            schema = getattr(importlib.import_module(module), attr)
        except Exception as exc:
            log.warning("cannot import %s in the host: %s", where, exc)
            continue
        check_options(name, settings.options, schema)
