"""The host: the supervisor process that ``corral up`` runs.

It owns the bus broker (and so every durable mailbox), starts the configured actors in
order as child processes, watches their heartbeats, restarts them per their restart type
within the restart intensity, answers the CLI on the control socket, and on SIGINT/SIGTERM
stops the actors in reverse order.

If an actor crashes more than ``supervisor.intensity`` times in ``supervisor.period_s``
seconds the host stops every actor and exits with an error naming the actor and its last
exit — a crash loop is loud, never a silent spin.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import trio
import zmq

from .. import __version__
from .._exceptions import HostAlreadyRunning, ProtocolError, RestartIntensityExceeded
from ..bus import BodyDecoder, Broker, InspectRequest, decode_envelope, open_peer
from ..config import Config, actor_plan
from ..harnesses.protocol import ElicitationParked
from ..instance import LAYOUT, Instance
from ._children import ChildSpec, ChildSupervisor
from ._control import serve_control
from ._process import alive, start_time, sweep

log = logging.getLogger("corral.host")

INPROC_ENDPOINT = "inproc://corral-broker"
#: A starting actor gets at least this long to say hello before liveness applies.
START_GRACE_S = 10.0


class Host:
    """One corral host on one state dir."""

    def __init__(self, config: Config, state_dir: Path) -> None:
        self.config = config
        self.instance = Instance(state_dir)
        self.started = time.monotonic()
        self._failure: RestartIntensityExceeded | None = None
        #: ``starting`` until every actor has been started in order, then ``running``,
        #: then ``stopping``.
        self.state = "starting"
        self._stop = trio.Event()
        self.broker: Broker | None = None
        self.children: ChildSupervisor | None = None
        self._peer: Any = None

    # --- the whole life of a host --------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until SIGINT/SIGTERM or a ``stop`` request.

        Raises:
            HostAlreadyRunning: another live host owns the state dir.
            RestartIntensityExceeded: an actor crash-looped; everything was stopped.
        """
        inst = self.instance
        inst.prepare()
        self._claim()
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
        children = self.children = ChildSupervisor(
            intensity=settings.supervisor.intensity,
            period_s=settings.supervisor.period_s,
            run_dir=inst.children_dir,
            on_exit=lambda name, _exit: broker.peer_down(name),
            on_give_up=self._give_up,
        )
        broker.on_hello = lambda name, _pid: children.mark_ready(name)
        broker.exit_reason = self._exit_reason
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            await nursery.start(children.run)
            async with open_peer(
                "supervisor", INPROC_ENDPOINT, bus=settings.bus, liveness=settings.liveness, ctx=ctx
            ) as peer:
                self._peer = peer
                await nursery.start(serve_control, inst.control_path, self._ops())
                nursery.start_soon(self._watch_signals)
                await self._start_children()
                self.state = "running"
                nursery.start_soon(self._watch_liveness)
                log.info(
                    "corral host up: pid=%d state_dir=%s actors=%s",
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
        plan = actor_plan(self.config)
        _import_protocols([target for _, target, _ in plan])
        for name, target, actor in plan:
            if self._stop.is_set():
                return
            self.broker.register(name)
            spec = ChildSpec(
                name=name,
                argv=[sys.executable, "-m", "corral.actors._entry"],
                env={
                    **os.environ,
                    "CORRAL_CHILD": json.dumps(self._child_spec(name, target, actor)),
                },
                restart=actor.restart,
                shutdown_timeout_s=actor.shutdown_timeout_s
                or self.config.supervisor.shutdown_timeout_s,
            )
            child = self.children.start_child(spec)
            # Start in order: the next actor starts once this one is up (or gave up).
            with trio.move_on_after(START_GRACE_S):
                while not child.ready.is_set() and child.state not in ("failed", "stopped"):
                    with trio.move_on_after(0.05):
                        await child.ready.wait()

    def _child_spec(self, name: str, target: str, actor: Any) -> dict[str, Any]:
        options = actor.options
        if name == "gateway" and self.config.runners:
            # The top-level [[runners]] tables, after any listed in the gateway's options.
            runners = msgspec.to_builtins(self.config.runners)
            options = {**options, "runners": [*options.get("runners", []), *runners]}
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

    async def _watch_liveness(self) -> None:
        assert self.children is not None and self.broker is not None
        live = self.config.liveness
        window = live.interval_s * live.liveness
        while True:
            await trio.sleep(live.interval_s / 2)
            now = time.monotonic()
            for name, child in self.children.children.items():
                if child.state not in ("starting", "running") or child.pid is None:
                    continue
                seen = max(self.broker.last_seen(name) or 0.0, child.started_at)
                limit = window if child.state == "running" else max(window, START_GRACE_S)
                if now - seen > limit:
                    self.children.kill(name, f"no heartbeat for {now - seen:.1f}s")

    async def _watch_signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                log.info("received %s", signal.Signals(signum).name)
                self._stop.set()

    def _give_up(self, name: str, last_exit: dict[str, Any] | None) -> None:
        reason = last_exit["reason"] if last_exit else "unknown"
        s = self.config.supervisor
        self._failure = RestartIntensityExceeded(
            f"actor {name!r} restarted more than {s.intensity} times in {s.period_s:g}s; "
            f"last exit: {reason}",
            child=name,
            last_exit=last_exit,
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
            "mailboxes": self._op_mailboxes,
            "dead_letters": self._op_dead_letters,
            "inspect": self._op_inspect,
            "elicitations": self._op_elicitations,
            "stop": self._op_stop,
        }

    async def _op_status(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.children is not None
        return {
            "workers": await self._actor_state("harness", "workers"),
            "tunnels": await self._actor_state("gateway", "tunnels"),
            "host": {
                "pid": os.getpid(),
                "state": self.state,
                "state_dir": str(self.instance.state_dir),
                "uptime_s": round(time.monotonic() - self.started, 3),
                "version": __version__,
            },
            "actors": self.children.statistics(),
        }

    async def _actor_state(self, actor: str, key: str) -> list[dict[str, Any]]:
        """One list from an actor's inspection snapshot, or [] if it does not answer soon.

        Best effort: a busy or restarting actor must not stall ``corral status``.
        """
        assert self.children is not None
        child = self.children.children.get(actor)
        if child is None or child.state != "running":
            return []
        with trio.move_on_after(1.0):
            try:
                reply = await self._peer.call(actor, InspectRequest(), timeout=1.0)
                return list(reply.state.get(key, []))  # type: ignore[attr-defined]
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
        rows = []
        decoder = BodyDecoder()
        for row in self.broker.parked():
            try:
                env = decode_envelope(row["frame"])
                msg = decoder.decode(env)
            except ProtocolError:
                continue
            if not isinstance(msg, ElicitationParked):
                continue
            rows.append(
                {
                    "elicitation_id": msg.elicitation_id,
                    "session_id": msg.session_id,
                    "turn_id": msg.turn_id,
                    "owner": f"{msg.owner}#{msg.incarnation}",
                    "state": row["state"],
                    "reason": row["reason"],
                    "created_at": env.created_at,
                    "params": msg.params,
                }
            )
        return {"elicitations": rows}

    async def _op_inspect(self, request: dict[str, Any]) -> dict[str, Any]:
        reply = await self._peer.call(str(request["actor"]), InspectRequest(), timeout=5)
        return msgspec.to_builtins(reply)

    async def _op_stop(self, request: dict[str, Any]) -> dict[str, Any]:
        self._stop.set()
        return {"stopping": True}


def _import_protocols(targets: list[str]) -> None:
    """Import each actor's module so the broker knows the message types it handles.

    A module that fails to import is left to its child process to report (and crash-loop).
    """
    for target in targets:
        try:
            importlib.import_module(target.partition(":")[0])
        except Exception as exc:
            log.warning("cannot import %s in the host: %s", target, exc)
