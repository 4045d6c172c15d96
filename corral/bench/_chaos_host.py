"""The chaos driver's host: a real ``corral up`` with a scripted agent, and what to kill in it.

Two shapes, one per chaos mode:

* **kill** — the host runs its embedded control plane, as ``corral up`` does by default; the
  killer's targets are the actors, the harness workers and the control plane, all restarted
  by the host (workers on their session's next turn), and the zygotes when the actors and
  workers are forked from them (the host's restarted by the host, the harness actor's by it).
* **tunnel** — the control plane runs as a process of this driver (``python -m corral.server``
  on its own state dir) and the host reaches it through :class:`DropProxy`, a TCP relay here,
  as a ``[[runners]]`` server: dropping the proxy's connections cuts the tunnel (and the
  runner's HTTP calls to the server) the way a network does, with no process dying.

The agent's script (:func:`script`) gives turn *k* of a session its own tokens, so the checks
can tell a lost delta from a duplicated one, from one of another turn (a history the session
forgot), and its shell call appends *k* to ``ran.txt`` in the session's own directory under
``os_env_root``, so a tool run twice shows there.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from .._jsonlines import JsonObject
from ..actors._control import request
from ..instance import Instance

AGENT = "chaos"
#: The kinds of process the killer knows, besides the actors that ``corral status`` lists.
WORKER = "worker"
CONTROL_PLANE = "control-plane"
TUNNEL = "tunnel"
#: A zygote (``--zygote``): the host's, which forks its actors, or the harness actor's,
#: which forks its workers.
ZYGOTE = "zygote"
#: ``--kind none``: kill nothing (the control run of a workload).
NOTHING = "none"
#: Characters of one delta token: ``kkk.jj|`` (turn, index).
TOKEN = 7


def token(turn: int, index: int) -> str:
    return f"{turn % 1000:03d}.{index:02d}|"


def script(turns: int, deltas: int, delay_ms: int) -> list[list[JsonObject]]:
    """One script turn per session turn: deltas, a shell call, an approval, more deltas.

    ``deltas`` tokens stream before the tool call and as many after the approval, each its
    own delta, ``delay_ms`` apart (the turn's length, and so how often a kill lands mid-turn).
    """
    out: list[list[JsonObject]] = []
    for k in range(turns):
        first = "".join(token(k, j) for j in range(deltas))
        second = "".join(token(k, j) for j in range(deltas, 2 * deltas))
        out.append(
            [
                {"text": first, "chunk": TOKEN, "delay_ms": delay_ms},
                {"tool": "sys_os_shell", "arguments": {"command": f"echo {k} >> ran.txt"}},
                {
                    "elicit": {
                        "message": f"May turn {k} go on?",
                        "requestedSchema": {"properties": {"ok": {"type": "boolean"}}},
                    }
                },
                {"text": second, "chunk": TOKEN, "delay_ms": delay_ms, "on_decline": "no|"},
            ]
        )
    return out


def expected_tokens(turn: int, deltas: int) -> list[str]:
    return [token(turn, j) for j in range(2 * deltas)]


def _agent_yaml(turns: list[list[JsonObject]]) -> str:
    # JSON is YAML: the script needs no YAML writer.
    spec = {"name": AGENT, "executor": {"harness": "scripted", "script": {"turns": turns}}}
    return json.dumps(spec, indent=1)


def config_text(
    root: Path,
    *,
    runner: tuple[str, str] | None = None,
    port: int | None = None,
    zygote: bool = True,
) -> str:
    """``corral.toml`` of a chaos host (and of its control plane: the ``[server]`` part).

    Restart intensity is raised so that a killer's pace (one kill of one kind a second, in
    the targeted modes) is supervision's normal work and never a give-up; the host stops at
    once, with no drain (what the run left hanging is the checks' to find, not to wait
    for); the policy asks
    for every shell call, so each turn parks two approvals: the policy's and the script's.
    ``zygote``: the host forks its actors, and the harness actor its workers, from a zygote
    each (as by default); False: every process is exec'd.
    """
    text = (
        f"[server]\nagents_dirs = [{json.dumps(str(root / 'agents'))}]\n"
        + (f"port = {port}\n" if port else "")
        + '[[server.policies]]\ntool = "sys_os_shell"\naction = "ask"\nmessage = "chaos: run it?"\n'
        "[supervisor]\nintensity = 1000\nperiod_s = 10.0\ndrain_timeout_s = 0\n"
        f"zygote = {json.dumps(zygote)}\n"
        "[actors.harness.options]\nworker_intensity = 1000\n"
        f"zygote = {json.dumps(zygote)}\n"
        f"[actors.tools.options]\nos_env_root = {json.dumps(str(root / 'envs'))}\n"
        "[actors.gateway.options]\nbackoff_base_s = 0.05\nbackoff_cap_s = 0.5\n"
    )
    if runner is not None:
        url, token_ = runner
        text += f"[[runners]]\nserver = {json.dumps(url)}\ntoken = {json.dumps(token_)}\n"
    return text


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- the proxy of the tunnel mode ---------------------------------------------------------------


class DropProxy:
    """A TCP relay 127.0.0.1:``port`` → ``target``; :meth:`drop` cuts every connection."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.drops = 0
        self._scopes: set[trio.CancelScope] = set()

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._relay, listeners)

    async def _relay(self, client: trio.SocketStream) -> None:
        with trio.CancelScope() as scope:
            self._scopes.add(scope)
            try:
                server = await trio.open_tcp_stream("127.0.0.1", self.target_port)
            except OSError:
                await client.aclose()
                return
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_pump, client, server, nursery.cancel_scope)
                    nursery.start_soon(_pump, server, client, nursery.cancel_scope)
            finally:
                self._scopes.discard(scope)
                for stream in (client, server):
                    _reset(stream)
                    with contextlib.suppress(Exception):
                        await trio.aclose_forcefully(stream)

    def drop(self) -> int:
        """Cut every relayed connection now (RST both ways); how many there were."""
        self.drops += 1
        cut = len(self._scopes)
        for scope in list(self._scopes):
            scope.cancel()
        return cut


def _reset(stream: trio.SocketStream) -> None:
    """Make the close an RST, as a dropped network path looks to both ends."""
    import socket
    import struct

    with contextlib.suppress(OSError):
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


async def _pump(src: trio.SocketStream, dst: trio.SocketStream, scope: trio.CancelScope) -> None:
    try:
        while data := await src.receive_some(65536):
            await dst.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
    scope.cancel()


# --- the host ------------------------------------------------------------------------------------


@dataclass
class ChaosHost:
    """A running chaos host and the ways to reach and hurt it."""

    root: Path
    inst: Instance
    proc: subprocess.Popen
    #: Where the control plane writes ``server.json``.
    plane_dir: Path
    proxy: DropProxy | None = None
    #: The control plane process this driver runs (tunnel mode), else None.
    plane: subprocess.Popen | None = None
    log_path: Path = field(default_factory=Path)

    def client_token(self) -> str:
        """The control plane's client token (the driver is a client like ``corral send``)."""
        # Read here, not through the CLI's client, which the benchmarks may not import.
        return (self.plane_dir / "server" / "client_token").read_text().strip()

    def locate(self) -> str | None:
        """The control plane's URL, or None while it (re)starts."""
        try:
            info = json.loads((self.plane_dir / "server" / "server.json").read_text())
        except (OSError, ValueError):
            return None
        pid = info.get("pid")
        if not isinstance(pid, int) or not Path(f"/proc/{pid}").exists():
            return None
        return str(info["url"]).rstrip("/")

    def status(self) -> JsonObject:
        return request(self.inst.control_path, "status", timeout=10)

    def parked(self) -> list[JsonObject]:
        """Elicitations the host still holds parked."""
        listed = request(self.inst.control_path, "elicitations", timeout=10)["elicitations"]
        return [e for e in listed if e.get("state") == "parked"]

    def targets(self, kind: str) -> list[int]:
        """Live pids of one kind: an actor's name, :data:`WORKER`, :data:`CONTROL_PLANE` or
        :data:`ZYGOTE` (the harness actor's, which forks the workers, the host's, which
        forks the actors, or the seed, which forks the harness actor's)."""
        status = self.status()
        if kind == ZYGOTE:
            state = request(self.inst.control_path, "inspect", timeout=10, actor="harness")
            zygotes = [state["state"].get("zygote"), status["host"].get("zygote")]
            seed = status["host"].get("seed") or {}
            return [z["pid"] for z in zygotes if z and z.get("pid")] + (
                [seed["pid"]] if seed.get("alive") else []
            )
        if kind == WORKER:
            return [w["pid"] for w in status["workers"] if w.get("pid")]
        if kind == CONTROL_PLANE:
            server = status.get("server") or {}
            return [server["pid"]] if server.get("pid") and server["state"] == "running" else []
        return [
            a["pid"]
            for a in status["actors"]
            if a["name"] == kind and a.get("pid") and a["state"] == "running"
        ]

    def actor_names(self) -> list[str]:
        return sorted(a["name"] for a in self.status()["actors"])

    def settled(self) -> bool:
        """Every actor and the control plane running, the tunnel connected."""
        try:
            status = self.status()
        except (OSError, RuntimeError, ValueError):
            return False
        server = status.get("server")
        return (
            all(a["state"] == "running" for a in status["actors"])
            and (server is None or server["state"] == "running")
            and any(t["state"] == "connected" for t in status["tunnels"])
        )

    def known_pids(self) -> set[int]:
        """The pids the host accounts for: itself, its actors, control plane and workers."""
        status = self.status()
        pids = {status["host"]["pid"], *(a["pid"] for a in status["actors"] if a.get("pid"))}
        pids |= {w["pid"] for w in status["workers"] if w.get("pid")}
        if status.get("server") and status["server"].get("pid"):
            pids.add(status["server"]["pid"])
        if self.plane is not None:
            pids.add(self.plane.pid)
        return pids

    def processes(self) -> list[int]:
        """Live processes started for this host: anything whose command line or environment
        names its root directory (state dir, control plane, agents, envs)."""
        return processes_under(self.root)


def processes_under(root: Path) -> list[int]:
    needle = str(root).encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            stat = (entry / "stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] == "Z":
                continue
            if (
                needle in (entry / "cmdline").read_bytes()
                or needle in (entry / "environ").read_bytes()
            ):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _wait(predicate: Any, timeout: float, what: str, proc: subprocess.Popen | None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the chaos host exited ({proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the chaos host: no {what} within {timeout:g}s")
        time.sleep(0.05)


def _spawn(argv: list[str], log_path: Path) -> subprocess.Popen:
    with open(log_path, "ab") as log_file:
        return subprocess.Popen(
            argv, stdout=log_file, stderr=log_file, start_new_session=True, env=dict(os.environ)
        )


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@contextlib.contextmanager
def _root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="corral-chaos-"))
    try:
        yield root
    finally:
        if not os.environ.get("CORRAL_CHAOS_KEEP"):
            shutil.rmtree(root, ignore_errors=True)


@contextlib.asynccontextmanager
async def chaos_host(
    turns: list[list[JsonObject]], *, tunnel: bool, zygote: bool = True
) -> AsyncIterator[ChaosHost]:
    """A chaos host for ``turns`` (the agent's script), up and connected; ``zygote``: its
    actors and its harness workers are forked from zygotes.

    Its log (and the control plane's) is ``<root>/host.log``; set ``CORRAL_CHAOS_KEEP=1`` to
    keep the root directory after the run.
    """
    with _root() as root:
        (root / "agents").mkdir()
        (root / "agents" / f"{AGENT}.yaml").write_text(_agent_yaml(turns))
        state = root / "state"
        log_path = root / "host.log"
        config = root / "corral.toml"
        async with trio.open_nursery() as nursery:
            plane: subprocess.Popen | None = None
            proxy: DropProxy | None = None
            plane_dir = state
            if tunnel:
                plane_dir = root / "plane"
                port = _free_port()
                config.write_text(config_text(root, port=port, zygote=zygote))
                plane = _spawn(
                    [
                        sys.executable,
                        "-m",
                        "corral.server",
                        "--state-dir",
                        str(plane_dir),
                        "--config",
                        str(config),
                    ],
                    log_path,
                )
                info_file = plane_dir / "server" / "server.json"
                await trio.to_thread.run_sync(_wait, info_file.exists, 30, "control plane", plane)
                info = json.loads(info_file.read_text())
                proxy = DropProxy(port)
                await nursery.start(proxy.serve)
                runner = (f"http://127.0.0.1:{proxy.port}", str(info["runner_token"]))
                config.write_text(config_text(root, runner=runner, port=port, zygote=zygote))
            else:
                config.write_text(config_text(root, zygote=zygote))
            argv = [sys.executable, "-m", "corral", "up", "--state-dir", str(state)]
            proc = _spawn([*argv, "--config", str(config)], log_path)
            host = ChaosHost(root, Instance(state), proc, plane_dir, proxy, plane, log_path)
            try:
                await trio.to_thread.run_sync(_wait, host.settled, 90, "settled host", proc)
                await trio.to_thread.run_sync(_wait, host.locate, 30, "control plane", proc)
                yield host
            finally:
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(_stop, proc)
                    await trio.to_thread.run_sync(_stop, plane)
                nursery.cancel_scope.cancel()
