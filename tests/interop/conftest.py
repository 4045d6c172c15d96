"""Fixtures of the interop suite: the real omnigent server per module, corral as its runner.

The server starts once per run (it takes 6 to 12 s), with every agent of ``agents/`` loaded,
and one corral host is bound to it; a module that stops or kills them (``test_restarts``)
brings its own. Each test gets a client of the server's public API and a
watch on the server's log: a test fails when the server logged a problem caused by corral
while it ran (see ``_stack.py``), even if everything the test asserted held.

The server comes from the venv ``.ci/omnigent-venv`` builds and caches. Only a machine with
no Python >= 3.12 skips the suite, loudly; a failed install is an error.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import warnings
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import HostProcess, processes_of, wait_until

from ._stack import (
    REPO,
    Client,
    FakeLLM,
    LogWatch,
    OmnigentServer,
    corral_config,
    new_token,
    open_client,
    runner_id_for,
    runner_online,
)

NO_PYTHON_312 = 3


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.interop)


@pytest.fixture(scope="session")
def omnigent_venv() -> Path:
    done = subprocess.run(
        [str(REPO / ".ci" / "omnigent-venv")], capture_output=True, text=True, timeout=900
    )
    if done.returncode == NO_PYTHON_312:
        reason = "INTEROP SUITE SKIPPED: no Python >= 3.12 on this machine to run omnigent 0.19.1"
        warnings.warn(reason, stacklevel=1)
        pytest.skip(reason)
    if done.returncode != 0:
        pytest.fail(f".ci/omnigent-venv failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


@dataclass
class Stack:
    llm: FakeLLM
    server: OmnigentServer
    host: HostProcess
    runner_id: str
    workspace: Path

    def start_corral(self) -> None:
        self.host.start()
        wait_until(
            lambda: runner_online(self.server.url, self.runner_id), 30, "corral's runner online"
        )


def build_stack(root: Path, venv: Path, corral_extra: str = "") -> Stack:
    llm = FakeLLM(root)
    server = OmnigentServer(venv, root, llm)
    workspace = root / "workspace"
    workspace.mkdir()
    (workspace / "hello.txt").write_text("hello from the workspace file\n")
    token = new_token()
    host = HostProcess(
        root / "corral" / "state", corral_config(server.url, token, workspace, corral_extra)
    )
    return Stack(llm, server, host, runner_id_for(token), workspace)


def teardown_stack(stack: Stack) -> None:
    host = stack.host
    if host.proc is not None and host.proc.poll() is None:
        host.stop()
    for pid in processes_of(host.state_dir):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    stack.server.stop()
    stack.llm.stop()


@contextlib.contextmanager
def running_stack(venv: Path, root: Path) -> Iterator[Stack]:
    """A started stack under ``root``, torn down (every process of it) on the way out."""
    s = build_stack(root, venv)
    try:
        s.server.start()
        s.start_corral()
        yield s
    finally:
        teardown_stack(s)


@pytest.fixture(scope="session")
def shared_stack(omnigent_venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(omnigent_venv, tmp_path_factory.mktemp("interop")) as s:
        yield s


@pytest.fixture(scope="module")
def stack(shared_stack: Stack) -> Stack:
    """The stack a module's tests use: one for the whole run (each test makes its own
    sessions), unless a module that stops or kills its parts brings its own."""
    return shared_stack


@pytest.fixture
def server_log(stack: Stack) -> Iterator[LogWatch]:
    """Fails the test if the server logged a problem while it ran, or corral an error."""
    watch = LogWatch(stack.server)
    watch.mark()
    corral_start = len(stack.host.log())
    yield watch
    problems = watch.problems()
    assert not problems, "the omnigent server logged problems:\n" + "\n---\n".join(problems)
    errors = [
        line
        for line in stack.host.log()[corral_start:].splitlines()
        if "level=error" in line or line.startswith("Traceback")
    ]
    assert not errors, "corral logged errors:\n" + "\n".join(errors)


@pytest.fixture
async def client(stack: Stack, server_log: LogWatch) -> AsyncIterator[Client]:
    async with open_client(stack.server.url, stack.runner_id) as c:
        yield c
    broken = [(s.session_id, s.broken) for s in c.streams if s.broken]
    assert not broken, f"client streams broke: {broken}"
