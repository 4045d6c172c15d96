"""Shared fixtures: a real corral host in a subprocess, a fake omnigent server, a run journal.

``host_factory`` makes hosts on fresh state dirs; ``host`` is one started with the default
test config. A module that sets ``SHARE_HOST = True`` has its tests share one ``host`` for the
whole module, because a ``corral up`` costs ~1.6 s (more under load): its tests only run turns
on it, each with its own session ids. A test that stops, kills or reconfigures processes of
its host is marked ``chaos`` or ``fresh_host`` and gets a host of its own (docs/testing.md).
"""

from __future__ import annotations

import compileall
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from corral.actors._control import request
from corral.config import BUILTIN_ACTORS
from corral.instance import Instance
from corral.journal import RunJournal
from tests.fake_server import FakeOmnigentServer
from tests.fake_tunnel_server import FakeTunnelServer


def pytest_sessionstart(session: pytest.Session) -> None:
    """Compile corral's modules once. The suite starts ~100 hosts of eight interpreters each,
    and with ``PYTHONDONTWRITEBYTECODE`` set (this machine kind sets it) none of them writes
    a ``.pyc``: every one compiled all of corral it imports again, ~0.15 CPU-s a process,
    about a sixth of the fast part's CPU. Up-to-date files are skipped."""
    compileall.compile_dir(Path(__file__).resolve().parents[1] / "corral", quiet=1)


def _all_running(status: dict[str, Any]) -> bool:
    # Actors start one after another: the host says when the last one has.
    return status["host"]["state"] == "running" and all(
        a["state"] == "running" for a in status["actors"]
    )


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


async def wait_for(probe: Callable[[], Awaitable[Any]], what: str, timeout: float = 10.0) -> Any:
    """:func:`wait_until` in a trio test, for an async ``probe`` (a tool call, a file read in
    a thread): poll it every 50 ms until it returns something truthy; fail after ``timeout``.

    Not faster: the terminal tests' tmux probes then miss a short-lived command's output now
    and then (2 of 10 runs of ``test_spec_and_model_strings_never_reach_a_shell`` at 20 ms,
    none of 10 at 50 ms)."""
    with trio.move_on_after(timeout):
        while True:
            value = await probe()
            if value:
                return value
            await trio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


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


def no_drain(config: str) -> str:
    """``config`` with ``supervisor.drain_timeout_s = 0`` unless it sets the key: a test's
    host stops at once, as before hosts drained, even with a turn parked on an approval (the
    drain would wait 30 s for it). The tests of the drain set their own (test_drain.py)."""
    if "drain_timeout_s" in config:
        return config
    if "[supervisor]\n" in config:
        return config.replace("[supervisor]\n", "[supervisor]\ndrain_timeout_s = 0\n", 1)
    return config + "\n[supervisor]\ndrain_timeout_s = 0\n"


class HostProcess:
    """A ``corral up`` subprocess and ways to look at it."""

    def __init__(self, state_dir: Path, config: str = "") -> None:
        self.state_dir = state_dir
        self.instance = Instance(state_dir)
        state_dir.parent.mkdir(parents=True, exist_ok=True)
        self.config_path = state_dir.parent / f"{state_dir.name}.toml"
        self.config_path.write_text(no_drain(config))
        self.log_path = state_dir.parent / f"{state_dir.name}.log"
        self.proc: subprocess.Popen | None = None

    def start(self, *, wait: bool = True, env: dict[str, str] | None = None) -> HostProcess:
        """Start ``corral up`` (with ``env`` added to this process's environment)."""
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
            env={**os.environ, **(env or {})},
        )
        if wait:
            # A host is up in ~1.6 s; 60 s only matters on a VM other test runs load (at a load
            # of 10 on 2 cores, 3 of 1,359 starts took more than 20 s).
            self.wait_for(_all_running, 60, "every actor running")
        return self

    def wait_for(
        self,
        predicate: Callable[[dict[str, Any]], Any],
        timeout: float,
        what: str,
        *,
        op: str = "status",
    ) -> Any:
        """Wait until ``predicate(answer)`` is truthy, where the answer is op ``op``'s
        (``status`` or ``elicitations``), asking the host once per change of what it shows
        itself (the control socket's ``wait``); return what the predicate returned.

        Only for what the host itself shows (its state, its actors' rows, the control
        plane's, the broker's parked elicitations): what actors keep (workers, tunnels) does
        not wake a waiter, so waits on that use :func:`wait_until`. Until the host listens,
        its socket is looked for every 20 ms; a host that exits fails the wait with its log.
        """
        deadline = time.monotonic() + timeout
        after = -1
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"host exited early ({self.proc.returncode}):\n{self.log()}")
            try:
                status = request(
                    self.instance.control_path,
                    "wait",
                    timeout=remaining + 5,
                    then=op,
                    after=after,
                    wait_s=remaining,
                )
            except (OSError, RuntimeError, ValueError):
                time.sleep(0.02)  # not listening yet, or it went away mid-answer
                continue
            value = predicate(status)
            if value:
                return value
            after = status["changes"]

    def wait_actor(
        self, name: str, predicate: Callable[[dict[str, Any]], Any], timeout: float, what: str
    ) -> dict[str, Any]:
        """Wait until actor ``name``'s status row satisfies ``predicate``; return the row."""

        def row(status: dict[str, Any]) -> dict[str, Any] | None:
            found = next(a for a in status["actors"] if a["name"] == name)
            return found if predicate(found) else None

        return self.wait_for(row, timeout, what)

    def restarted(self, name: str, before: dict[str, Any], timeout: float = 20) -> dict[str, Any]:
        """Wait until actor ``name`` runs again, restarted since ``before`` (its status row)."""
        return self.wait_actor(
            name,
            lambda a: a["restarts"] > before["restarts"] and a["state"] == "running",
            timeout,
            f"{name} restarted",
        )

    def client_headers(self) -> dict[str, str]:
        """The embedded control plane's client credential, read from the state dir as the
        CLI reads it (docs/security.md)."""
        token = (self.state_dir / "server" / "client_token").read_text().strip()
        return {"authorization": f"Bearer {token}"}

    def ask(self, op: str, **args: Any) -> Any:
        return request(self.instance.control_path, op, **args)

    def status(self) -> dict[str, Any]:
        return self.ask("status")

    def elicitations(self, *listed: str, timeout: float = 10) -> list[dict[str, Any]]:
        """``corral elicitations``' rows once every elicitation in ``listed`` is among them:
        the worker announces an elicitation once the broker holds its park, which the
        harness actor then records (a moment later, and in no order across sessions) as the
        listing's row."""
        rows: list[dict[str, Any]] = []

        def shown() -> bool:
            rows[:] = self.ask("elicitations")["elicitations"]
            return set(listed) <= {r["elicitation_id"] for r in rows}

        wait_until(shown, timeout, f"elicitations {', '.join(listed)} listed")
        return rows

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


#: The tests' hosts: a heartbeat every 0.2 s, and a 2 s window before a silent actor or
#: worker is killed. The window tolerates a process starved of CPU for a second, which two
#: hosts starting at once on two cores do (``make test-fast`` runs a module per core); with
#: the 0.6 s window, a dispatch was killed mid-request there.
FAST_LIVENESS = """
[liveness]
interval_s = 0.2
liveness = 10
"""

#: For the tests whose point is how soon a hung process is found (all marked ``chaos``,
#: which runs one test at a time): a 0.6 s window.
DETECT_LIVENESS = """
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


class Hosts:
    """The hosts a fixture made under ``base``; :meth:`cleanup` kills what is left of them.

    A test module may set ``RUNS_ECHO = True`` (its hosts run the echo actor as well) and
    ``HOST_ACTORS`` (a frozenset: the only built-in actors its hosts run).
    """

    def __init__(self, base: Path, module: Any) -> None:
        self.base = base
        self.module_echo = getattr(module, "RUNS_ECHO", False)
        self.module_actors: frozenset[str] | None = getattr(module, "HOST_ACTORS", None)
        self.hosts: list[HostProcess] = []

    def make(
        self, config: str = FAST_LIVENESS, name: str = "state", *, echo: bool | None = None
    ) -> HostProcess:
        config += os.environ.get("CORRAL_TEST_EXTRA_CONFIG", "")
        if self.module_echo if echo is None else echo:
            config += ECHO_ACTOR
        if self.module_actors is not None:
            # A module that drives one actor directly (a stand-in for its callers) starts
            # none of the built-ins it does not use: each is an interpreter's start-up and
            # heartbeats, a third of a host's CPU for the rest. One the config sets up stays.
            for actor in sorted(BUILTIN_ACTORS.keys() - self.module_actors):
                if f"[actors.{actor}" not in config:
                    config += f"\n[actors.{actor}]\nenabled = false\n"
        if "[server]" not in config:
            # Tests of the host and its actors drive them directly (a stand-in gateway, a
            # fake tunnel server): no embedded control plane unless a test asks for one.
            config += "\n[server]\nenabled = false\n"
        h = HostProcess(self.base / name, config)
        self.hosts.append(h)
        return h

    def cleanup(self) -> None:
        for h in self.hosts:
            kill_host(h)


def kill_host(h: HostProcess) -> None:
    """Kill what is left of ``h``: its host process, and every process of its state dir."""
    if h.proc is not None and h.proc.poll() is None:
        h.proc.kill()
        h.proc.wait(10)
    for pid in processes_of(h.state_dir):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


#: Exit code of ``.ci/install-clis`` on a machine with no npm.
NO_NPM = 3


@pytest.fixture(scope="session")
def cli_bin() -> Path:
    """The directory holding the pinned ``claude``, ``codex`` and ``pi`` CLIs (and a Node.js
    22 beside them), for a host's ``CORRAL_CLI_PATH``: what ``.ci/install-clis`` installs and
    caches (``make test`` runs it first, so this only looks it up). Only a machine with no
    npm skips the tests that need them, loudly; a failed install is an error."""
    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [str(repo / ".ci" / "install-clis"), sys.executable],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode == NO_NPM:
        reason = "CLI HARNESS TESTS SKIPPED: no npm on this machine to install the CLIs"
        warnings.warn(reason, stacklevel=1)
        pytest.skip(reason)
    if done.returncode != 0:
        pytest.fail(f".ci/install-clis failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def host_factory(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., HostProcess]]:
    hosts = Hosts(tmp_path, request.module)
    yield hosts.make
    hosts.cleanup()


@pytest.fixture(scope="module")
def module_host_factory(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Callable[..., HostProcess]]:
    """Like ``host_factory``, for hosts a module's tests share (module-scoped fixtures)."""
    hosts = Hosts(
        tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1]), request.module
    )
    yield hosts.make
    hosts.cleanup()


@pytest.fixture(scope="module")
def shared_host(module_host_factory: Callable[..., HostProcess]) -> Iterator[HostProcess]:
    """One host with the default test config for a whole module (see the module docstring)."""
    h = module_host_factory().start()
    yield h
    if h.proc is not None and h.proc.poll() is None:
        h.stop()


def needs_fresh_host(request: pytest.FixtureRequest) -> bool:
    """Whether the test stops, kills or reconfigures its host's processes (its markers say)."""
    node = request.node
    return bool(node.get_closest_marker("chaos") or node.get_closest_marker("fresh_host"))


def shared_or_fresh(
    request: pytest.FixtureRequest, shared: str, fresh: Callable[[], HostProcess]
) -> Iterator[HostProcess]:
    """The body of a host fixture: the module-scoped fixture named ``shared``, or for a test
    that needs its own (:func:`needs_fresh_host`) one that ``fresh`` starts and this stops."""
    if not needs_fresh_host(request):
        h: HostProcess = request.getfixturevalue(shared)
        assert h.proc is not None
        if h.proc.poll() is not None:
            raise AssertionError(f"the module's shared host exited:\n{h.log()}")
        yield h
        return
    h = fresh()
    yield h
    if h.proc is not None and h.proc.poll() is None:
        h.stop()


@pytest.fixture
def host(
    host_factory: Callable[..., HostProcess], request: pytest.FixtureRequest
) -> Iterator[HostProcess]:
    if getattr(request.module, "SHARE_HOST", False):
        yield from shared_or_fresh(request, "shared_host", lambda: host_factory().start())
        return
    h = host_factory().start()
    yield h
    if h.proc is not None and h.proc.poll() is None:
        h.stop()


@pytest.fixture(scope="module")
def module_server() -> Iterator[FakeOmnigentServer]:
    """The module's fake omnigent server (tests/fake_server.py), on its own thread."""
    fake = FakeOmnigentServer()
    with fake.serve_in_thread():
        yield fake


@pytest.fixture
def server(module_server: FakeOmnigentServer) -> FakeOmnigentServer:
    """A fake omnigent server for a host to talk to: the module's one (a host the module
    shares points at it), with a fresh server's behaviour (policy, tool, ask, token, faults)
    and no requests recorded yet. What tests add to it (agents, sessions) has unique ids.
    Async tests that drive a server themselves start one in their nursery."""
    defaults = FakeOmnigentServer()
    for name in ("policy", "tool", "ask", "token", "token_mode"):
        setattr(module_server, name, getattr(defaults, name))
    module_server.faults.clear()
    module_server.requests.clear()
    return module_server


@pytest.fixture
async def tunnels(request: pytest.FixtureRequest) -> AsyncIterator[FakeTunnelServer]:
    """A fake omnigent server's runner-tunnel endpoint (tests/fake_tunnel_server.py) in the
    test's nursery, under the module's ``TUNNEL_PREFIX`` (default: none)."""
    fake = FakeTunnelServer(prefix=getattr(request.module, "TUNNEL_PREFIX", ""))
    async with trio.open_nursery() as nursery:
        await fake.start(nursery)
        yield fake
        nursery.cancel_scope.cancel()


@pytest.fixture
def journal(tmp_path: Path) -> RunJournal:
    """An empty run journal in a fresh directory."""
    return RunJournal(tmp_path / "journal")


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


@contextlib.contextmanager
def plain_up(state_dir: Path) -> Iterator[subprocess.Popen]:
    """``corral up --state-dir DIR`` as a user first types it: no ``--config`` and none in the
    environment, so it writes and reads the state dir's fresh ``corral.toml``. Its output goes
    to ``<state dir>.up.log``; it is running once ``status --wait`` says so, and is stopped
    (what is left of it killed) after the block."""
    log_path = state_dir.parent / f"{state_dir.name}.up.log"
    log = log_path.open("ab")
    env = {k: v for k, v in os.environ.items() if k not in ("CORRAL_CONFIG", "CORRAL_STATE_DIR")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "corral", "up", "--state-dir", str(state_dir)],
        stdout=log,
        stderr=log,
        start_new_session=True,
        env=env,
    )
    try:
        up = corral("status", "--wait", "60", "--json", "--state-dir", str(state_dir), timeout=90)
        assert up.returncode == 0, log_path.read_text()
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        finally:
            if proc.poll() is None:
                proc.kill()
            for pid in processes_of(state_dir):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            log.close()
