"""deploy/compose.yaml's two services, run as their files say but outside a container (no
container engine here): the real omnigent server with the entry point of
``deploy/omnigent.Containerfile``, and ``corral`` with the compose file's command and
``deploy/corral.toml``, its runner token shaped as the StatefulSet makes it (a secret joined
with the pod's name). Only what a container changes is changed: loopback instead of
``0.0.0.0``, free ports, the data and state dirs under the test's directory."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from corral.actors._control import request
from corral.bench._omnigent import isolated_env
from corral.instance import Instance
from tests.conftest import processes_of, wait_until

from ._stack import REPO, free_port, runner_id_for, runner_online

DEPLOY = REPO / "deploy"


def _entrypoint(path: Path) -> list[str]:
    text = path.read_text().replace("\\\n", " ")
    line = next(ln for ln in text.splitlines() if ln.startswith("ENTRYPOINT"))
    return list(json.loads(line.split(" ", 1)[1]))


@pytest.fixture
def server(omnigent_venv: Path, tmp_path: Path) -> Iterator[str]:
    data, port = tmp_path / "data", free_port()
    data.mkdir()
    args = [
        {"0.0.0.0": "127.0.0.1", "8000": str(port)}.get(a, a.replace("/data", str(data)))
        for a in _entrypoint(DEPLOY / "omnigent.Containerfile")
    ]
    env = isolated_env(data)
    out = open(tmp_path / "server.out", "ab")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [str(omnigent_venv / "bin" / args[0]), *args[1:]],
        env=env,
        stdout=out,
        stderr=out,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, (tmp_path / "server.out").read_text()[-3000:]
        try:
            return httpx.get(f"{url}/api/version", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(up, 90, "the omnigent server")
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
        out.close()


def test_the_compose_commands_bind_a_host_to_the_real_server_with_a_pod_shaped_token(
    server: str, tmp_path: Path
) -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]["corral"]
    command = [server if a == "http://omnigent:8000" else a for a in compose["command"]]
    config = tmp_path / "corral.toml"
    config.write_text(
        (DEPLOY / "corral.toml")
        .read_text()
        .replace("/var/lib/corral", str(tmp_path / "state"))
        .replace('"0.0.0.0:9464"', '"127.0.0.1:0"')
    )
    token = "5ecret-from-the-secret.corral-0"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")},
        "CORRAL_CONFIG": str(config),
        "CORRAL_RUNNER_TOKEN": token,
    }
    log = open(tmp_path / "host.log", "ab")  # noqa: SIM115 - closed below
    host = subprocess.Popen(
        [sys.executable, "-m", "corral", *command],
        env=env,
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    state = Instance(tmp_path / "state")
    try:
        runner_id = runner_id_for(token)
        wait_until(lambda: runner_online(server, runner_id), 60, "the runner online")
        status = request(state.control_path, "status")
        assert status["server"] is None, "--server: no embedded control plane"
        assert [t["runner_id"] for t in status["tunnels"]] == [runner_id]
        metrics = httpx.get(status["host"]["metrics"], timeout=10).text
        assert f'corral_tunnel_state{{runner_id="{runner_id}",state="connected"}} 1.0' in metrics
        host.send_signal(signal.SIGTERM)
        assert host.wait(90) == 0
        wait_until(lambda: not runner_online(server, runner_id), 30, "the runner offline")
    finally:
        if host.poll() is None:
            host.kill()
            host.wait(10)
        log.close()
        for pid in processes_of(state.state_dir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert "drained" in (tmp_path / "host.log").read_text()
