"""The embedded control plane as one child of the host: started, waited for, probed, rebound.

With no runner configured (no ``[[runners]]``, no ``--server``) and ``[server].enabled``, the
host first starts ``python -m corral.server`` as a supervised child (before any actor, so it
is stopped last), waits for the ``server/server.json`` it writes once listening, and binds
one runner to it (:meth:`EmbeddedControlPlane.runner`). The control plane is not a bus peer,
so instead of heartbeats :meth:`EmbeddedControlPlane.watch` probes it over HTTP and kills it
when it stops answering; after a restart it waits for the new ``server.json`` again and
tells the host, which restarts the actors that talk to it if the URL or token changed.

It is apart from :mod:`corral.actors.host` because none of it is about actors: it is the one
child that speaks HTTP instead of the bus, with a readiness and a liveness of its own.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import trio

from .._changes import Changes
from .._child_env import actor_env
from .._exceptions import SupervisionError
from .._tls import default_context
from ..config import Config, RunnerSettings, actor_plan, role_of
from ..instance import Instance
from ._child_state import ChildState
from ._children import ChildSupervisor
from ._specs import ChildSpec

log = logging.getLogger("corral.host")

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


class ControlPlaneUnavailable(SupervisionError):
    """The embedded control plane did not come up before its deadline."""


def read_server_file(path: Path) -> dict[str, Any] | None:
    """The control plane's ``server.json``, or None if absent or half-written."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("url") else None


def wants_control_plane(config: Config, runner: RunnerSettings | None) -> bool:
    """No runner configured anywhere (``runner``: the one of ``--server``),
    ``[server].enabled`` and an actor that opens a tunnel to bind."""
    if runner is not None or config.runners or not config.server.enabled:
        return False
    tunnels = [s for name, _, s in actor_plan(config) if role_of(name).opens_tunnel]
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


class EmbeddedControlPlane:
    """The host's embedded control plane, run as its child :data:`SERVER_CHILD`.

    Args:
        config: the host's ``corral.toml``.
        instance: the host's state dir.
        config_path: the file ``config`` came from, which the control plane reads too.
        children: the host's supervisor, which runs it.
        changes: bumped when it binds (its address shows in ``corral status``).
        stop: set when the host stops; every wait here ends then.
    """

    def __init__(
        self,
        *,
        config: Config,
        instance: Instance,
        config_path: Path | None,
        children: ChildSupervisor,
        changes: Changes,
        stop: trio.Event,
    ) -> None:
        self._config = config
        self._instance = instance
        self._config_path = config_path
        self._children = children
        self._changes = changes
        self._stop = stop
        #: Its ``server.json`` as last read; None until it first came up.
        self.info: dict[str, Any] | None = None

    @property
    def server_file(self) -> Path:
        """Where the control plane writes its address and runner token once listening."""
        return self._instance.state_dir / "server" / "server.json"

    def runner(self) -> RunnerSettings | None:
        """The runner bound to it (its URL and runner token); None before it first came up."""
        info = self.info
        if info is None:
            return None
        return RunnerSettings(
            server=str(info["url"]),
            id=info.get("runner_id") or None,
            token=info.get("runner_token") or None,
        )

    def _argv(self) -> list[str]:
        argv = [
            sys.executable,
            "-c",
            _SERVER_BOOT,
            str(os.getpid()),
            "--state-dir",
            str(self._instance.state_dir),
            "--host",
            self._config.server.host,
        ]
        if self._config_path is not None:
            argv += ["--config", str(self._config_path)]
        if self._config.server.port:
            argv += ["--port", str(self._config.server.port)]
        return argv

    async def start(self) -> bool:
        """Start the control plane and bind to it; False if the host began stopping first.

        Raises:
            ControlPlaneUnavailable: it wrote no ``server.json`` within
                :data:`CONTROL_PLANE_START_S`.
        """
        child = await self._children.start_child(
            ChildSpec(
                name=SERVER_CHILD,
                argv=self._argv(),
                env=actor_env(),
                restart="permanent",
                shutdown_timeout_s=self._config.supervisor.shutdown_timeout_s,
                bus_peer=False,
                label="the embedded control plane",
            )
        )
        info = None
        with trio.move_on_after(CONTROL_PLANE_START_S):
            info = await self._await_server_file()
        if info is None:
            if self._stop.is_set():
                return False
            last = child.last_exit["reason"] if child.last_exit else "still running"
            raise ControlPlaneUnavailable(
                f"the embedded control plane did not start within "
                f"{CONTROL_PLANE_START_S:g}s: no {self.server_file} from it "
                f"(last exit: {last}). Serve another server with `corral up --server URL` "
                "or set [server] enabled = false."
            )
        self._bind(info)
        return True

    async def _await_server_file(self) -> dict[str, Any] | None:
        """Wait for the ``server.json`` of the control plane's current process.

        A file left by an earlier process (another pid) does not count. Returns None if the
        child stopped or failed, or the host is stopping.
        """
        while not self._stop.is_set():
            child = self._children.children.get(SERVER_CHILD)
            if child is None or child.state.over:
                return None
            info = read_server_file(self.server_file)
            if info is not None and child.pid is not None and info.get("pid") == child.pid:
                self._children.mark_ready(SERVER_CHILD)
                return info
            await trio.sleep(0.05)
        return None

    def _bind(self, info: dict[str, Any]) -> None:
        self.info = info
        self._changes.bump()
        log.info(
            "control plane at %s (pid %s, runner %s)",
            info["url"],
            info.get("pid"),
            info.get("runner_id"),
        )

    async def watch(self, rebound: Callable[[], Awaitable[None]]) -> None:
        """Bring a restarted control plane back into service, then await ``rebound()``; kill
        a hung one."""
        children = self._children
        last_ok = next_probe = time.monotonic()
        async with httpx.AsyncClient(timeout=5.0, verify=default_context()) as http:
            while not self._stop.is_set():
                child = children.children.get(SERVER_CHILD)
                if child is None or child.state.over:
                    return
                if child.state in (ChildState.STARTING, ChildState.RESTARTING):
                    with trio.move_on_after(CONTROL_PLANE_START_S) as scope:
                        info = await self._await_server_file()
                    if scope.cancelled_caught:
                        children.kill(
                            SERVER_CHILD, f"no server.json within {CONTROL_PLANE_START_S:g}s"
                        )
                        continue
                    if info is None:
                        return
                    self._bind(info)
                    await rebound()
                    last_ok = next_probe = time.monotonic() + CONTROL_PLANE_PROBE_S
                    continue
                # Asleep until the next probe; the control plane exiting (a change of the
                # host's status) wakes it at once.
                bound, nap = self.info, next_probe - time.monotonic()
                if bound is None or nap > 0:
                    await self._changes.wait_past(self._changes.version, max(nap, 0.05))
                    continue
                next_probe = time.monotonic() + CONTROL_PLANE_PROBE_S
                try:
                    await http.get(str(bound["url"]).rstrip("/") + "/api/version")
                    last_ok = time.monotonic()  # any answer at all proves it is serving
                except httpx.HTTPError as exc:
                    silent = time.monotonic() - last_ok
                    if silent > CONTROL_PLANE_PROBE_WINDOW_S and child.state is ChildState.RUNNING:
                        reason = f"no HTTP answer for {silent:.0f}s ({exc})"
                        children.kill(SERVER_CHILD, reason)

    def status(self) -> dict[str, Any] | None:
        """Its row of ``corral status``; None when it was never started."""
        child = self._children.children.get(SERVER_CHILD)
        if child is None:
            return None
        info = self.info or {}
        return {
            "url": info.get("url"),
            "pid": child.pid,
            "state": child.state.value,
            "restarts": child.restarts,
            "last_exit": child.last_exit,
            "runner_id": info.get("runner_id"),
        }
