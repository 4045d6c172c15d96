"""Process titles through a real host: ``ps`` shows ``corral: host <state dir>``,
``corral: server <state dir>``, ``corral: <actor>`` and ``corral: worker <session>``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.conftest import FAST_LIVENESS, HostProcess, corral
from tests.integration.test_e2e import _start


def _ps(pid: int) -> str:
    return subprocess.run(
        ["ps", "-ww", "-o", "args=", "-p", str(pid)], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_ps_shows_what_each_process_of_a_host_is(tmp_path: Path) -> None:
    host = _start(HostProcess(tmp_path / "state", FAST_LIVENESS + "[server]\nenabled = true\n"))
    try:
        sent = corral(
            "send",
            "--agent",
            "demo",
            "--approve",
            "hi",
            "--json",
            "--state-dir",
            str(host.state_dir),
        )
        assert sent.returncode == 0, sent
        session = json.loads(sent.stdout)["session_id"]
        status = host.status()
        assert host.proc is not None
        assert _ps(host.proc.pid) == f"corral: host {host.state_dir}"
        assert _ps(status["server"]["pid"]) == f"corral: server {host.state_dir}"
        for actor in status["actors"]:
            assert _ps(actor["pid"]) == f"corral: {actor['name']}", actor
        [worker] = [w for w in status["workers"] if w["session_id"] == session]
        assert _ps(worker["pid"]) == f"corral: worker {session}"
        # The thread name (top, ps -o comm) too, cut to 15 bytes by the kernel.
        assert Path(f"/proc/{host.proc.pid}/comm").read_text() == "corral: host /t\n"
    finally:
        host.stop()
