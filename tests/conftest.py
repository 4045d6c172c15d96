"""Shared fixtures: a real corral host in a subprocess, on a fresh state dir."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.actors._control import request
from corral.instance import Instance


def wait_until(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "") -> Any:
    """Poll ``predicate`` until it returns something truthy, or fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(0.02)


def corral(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess:
    """Run the real ``corral`` CLI."""
    return subprocess.run(
        [sys.executable, "-m", "corral", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


class HostProcess:
    """A ``corral up`` subprocess and ways to look at it."""

    def __init__(self, state_dir: Path, config: str = "") -> None:
        self.state_dir = state_dir
        self.instance = Instance(state_dir)
        state_dir.parent.mkdir(parents=True, exist_ok=True)
        self.config_path = state_dir.parent / f"{state_dir.name}.toml"
        self.config_path.write_text(config)
        self.log_path = state_dir.parent / f"{state_dir.name}.log"
        self.proc: subprocess.Popen | None = None

    def start(self, *, wait: bool = True) -> HostProcess:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()/kill9()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "corral",
                "up",
                "--state-dir",
                str(self.state_dir),
                "--config",
                str(self.config_path),
            ],
            stdout=self._log,
            stderr=self._log,
            start_new_session=True,
        )
        if wait:
            wait_until(self._all_running, 20, "every actor running")
        return self

    def _all_running(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"host exited early ({self.proc.returncode}):\n{self.log()}")
        try:
            status = self.ask("status")
        except (OSError, RuntimeError, ValueError):
            return False
        # Actors start one after another: the host says when the last one has.
        return status["host"]["state"] == "running" and all(
            a["state"] == "running" for a in status["actors"]
        )

    def ask(self, op: str, **args: Any) -> Any:
        return request(self.instance.control_path, op, **args)

    def status(self) -> dict[str, Any]:
        return self.ask("status")

    def actor(self, name: str) -> dict[str, Any]:
        return next(a for a in self.status()["actors"] if a["name"] == name)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    @property
    def endpoint(self) -> str:
        return self.instance.bus_endpoint

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout)
        self._log.close()
        return code

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)
        self._log.close()


def processes_of(state_dir: Path) -> list[int]:
    """Pids of live processes started for ``state_dir`` (found through /proc)."""
    needle = str(state_dir).encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            cmdline = (entry / "cmdline").read_bytes()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            continue
        if needle in environ or needle in cmdline:
            pids.append(int(entry.name))
    return pids


FAST_LIVENESS = """
[liveness]
interval_s = 0.2
liveness = 3
"""

#: The test-only echo actor (``tests/_echo.py``), which no production host runs. The hosts
#: of a test module that sets ``RUNS_ECHO = True`` run it as well.
ECHO_ACTOR = """
[actors.echo]
target = "tests._echo:EchoActor"
"""


@pytest.fixture
def host_factory(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., HostProcess]]:
    hosts: list[HostProcess] = []
    module_echo = getattr(request.module, "RUNS_ECHO", False)

    def make(
        config: str = FAST_LIVENESS, name: str = "state", *, echo: bool | None = None
    ) -> HostProcess:
        config += os.environ.get("CORRAL_TEST_EXTRA_CONFIG", "")
        if module_echo if echo is None else echo:
            config += ECHO_ACTOR
        if "[server]" not in config:
            # Tests of the host and its actors drive them directly (a stand-in gateway, a
            # fake tunnel server): no embedded control plane unless a test asks for one.
            config += "\n[server]\nenabled = false\n"
        h = HostProcess(tmp_path / name, config)
        hosts.append(h)
        return h

    yield make
    for h in hosts:
        if h.proc is not None and h.proc.poll() is None:
            h.proc.kill()
            h.proc.wait(10)
        for pid in processes_of(h.state_dir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def host(host_factory: Callable[..., HostProcess]) -> Iterator[HostProcess]:
    h = host_factory().start()
    yield h
    if h.proc is not None and h.proc.poll() is None:
        h.stop()


def read_json(text: str) -> Any:
    return json.loads(text)


def process_gone(pid: int, started: int | None) -> bool:
    """Whether the process ``pid`` that started at ``started`` no longer runs: gone, reused by
    another process, or a zombie (this machine's init does not reap orphans)."""
    from corral.actors._process import start_time

    if start_time(pid) != started:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"
