"""The real omnigent 0.19.1 server, and omnigent's own runner, as local processes.

Shared by ``corral bench relay --against`` and the interop suite (tests/interop): both run
``omnigent server`` from a virtualenv holding omnigent (``.ci/omnigent-venv`` builds and caches
one), on loopback with sqlite and an isolated HOME, so nothing of the user's own omnigent set-up
is read or written (PROTOCOL_0_19.md, "How to run the real server locally").
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import IO

import httpx

from ._common import NotRunnable

VERSION = "0.19.1"
#: Where ``.ci/omnigent-venv`` caches the venv, unless ``$CORRAL_OMNIGENT_VENV`` names one.
VENV_ENV = "CORRAL_OMNIGENT_VENV"
INSTALL_HINT = (
    f"omnigent {VERSION} is not installed: build its venv with .ci/omnigent-venv (a corral "
    f"checkout), or `python3.12 -m venv DIR && DIR/bin/pip install omnigent=={VERSION}` "
    f"and set {VENV_ENV}=DIR"
)


def venv_path() -> Path:
    """The omnigent venv (``bin/omnigent`` and ``bin/python`` in it); NotRunnable if none."""
    named = os.environ.get(VENV_ENV)
    if named:
        venv = Path(named)
    else:
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        venv = cache / "corral" / f"omnigent-{VERSION}"
    if not ((venv / "bin" / "omnigent").is_file() and (venv / "bin" / "python").is_file()):
        raise NotRunnable(f"{INSTALL_HINT} (looked in {venv})")
    return venv


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def runner_id_for(token: str) -> str:
    """The id the server binds to a tunnel token (PROTOCOL_0_19.md §A.1)."""
    return "runner_token_" + hashlib.sha256(f"omnigent-runner:{token}".encode()).hexdigest()[:32]


def runner_online(server_url: str, runner_id: str) -> bool:
    try:
        r = httpx.get(f"{server_url}/v1/runners/{runner_id}/status", timeout=2)
    except httpx.HTTPError:
        return False
    return r.status_code == 200 and bool(r.json().get("online"))


def isolated_env(home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without omnigent's and corral's settings, omnigent's files
    under ``home``, its analytics off."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMNIGENT_", "CORRAL_"))}
    env.update(
        HOME=str(home),
        OMNIGENT_CONFIG_HOME=str(home / ".omnigent"),
        OMNIGENT_ANALYTICS="0",
        DISABLE_TELEMETRY="true",
    )
    env.update(extra or {})
    return env


def runner_env(server_url: str, token: str, workspace: Path, home: Path) -> dict[str, str]:
    """What omnigent's runner is started with (what ``omnigent run --server`` gives it): the
    server, its id, the token that id is bound to, the workspace; omnigent's files isolated."""
    return isolated_env(
        home,
        {
            "RUNNER_SERVER_URL": server_url,
            "OMNIGENT_RUNNER_ID": runner_id_for(token),
            "OMNIGENT_RUNNER_TUNNEL_BINDING_TOKEN": token,
            "OMNIGENT_RUNNER_WORKSPACE": str(workspace),
        },
    )


def runner_command(venv: Path) -> list[str]:
    """omnigent's own runner (run with cwd = its workspace)."""
    return [str(venv / "bin" / "python"), "-P", "-m", "omnigent.runner._entry"]


def stop_group(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    """Signal the process group ``proc`` leads (started with ``start_new_session``); SIGKILL
    it if it has not exited 20 s later."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, sig)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


class OmnigentServer:
    """``omnigent server`` on loopback with sqlite under ``root``, ``agents`` loaded (agent
    YAML files or bundle directories); its output goes to ``root/server.out``, its log to
    ``root/home/.omnigent/logs/server``."""

    def __init__(
        self, venv: Path, root: Path, agents: list[Path], env: dict[str, str] | None = None
    ) -> None:
        self.venv = venv
        self.root = root
        self.home = root / "home"
        self.agents = agents
        self.extra_env = env or {}
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self._out: IO[bytes] | None = None

    def env(self) -> dict[str, str]:
        return isolated_env(self.home, self.extra_env)

    def start(self, timeout: float = 90) -> OmnigentServer:
        """Start it and return once ``GET /api/version`` answers (migrations run first)."""
        self.home.mkdir(parents=True, exist_ok=True)
        args = [
            str(self.venv / "bin" / "omnigent"),
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--database-uri",
            f"sqlite:///{self.root / 'omni.db'}",
            "--artifact-location",
            str(self.root / "artifacts"),
            "--no-open",
        ]
        for agent in self.agents:
            args += ["--agent", str(agent)]
        out = self._out = open(self.root / "server.out", "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            args, env=self.env(), stdout=out, stderr=out, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        try:
            while not self._ready():
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"omnigent server on {self.url} not ready in {timeout:g}s "
                        f"({self.root / 'server.out'})"
                    )
                time.sleep(0.1)  # polling the server: nothing to wait on
        except BaseException:
            self.stop()  # a server that never came up is not left running
            raise
        return self

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            out = (self.root / "server.out").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"omnigent server exited {self.proc.returncode}:\n{out}")
        try:
            return httpx.get(f"{self.url}/api/version", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None:
            stop_group(self.proc, sig)
        if self._out is not None:
            self._out.close()
            self._out = None

    def log_text(self) -> str:
        logs = sorted((self.home / ".omnigent" / "logs" / "server").glob("server-*.log"))
        return "".join(p.read_text(errors="replace") for p in logs)
