"""Running the host as a service: systemd's notifications (``sd_notify``) on a real datagram
socket, and the Prometheus endpoint scraped from a real host after turns and after a
``kill -9`` of actors (docs/deploy.md)."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import FAST_LIVENESS, HostProcess, corral, kill_host, wait_until

from ._plane_host import plane_host, start

AGENTS = {
    "talk": """
        name: talk
        executor:
          harness: scripted
          script:
            turns:
              - - {text: "one two three", chunk: 4}
        """,
    "fails": """
        name: fails
        executor:
          harness: scripted
          script:
            turns:
              - - {text: "trying. "}
                - {fail: {code: demo_failure, message: "it did not work"}}
        """,
}


# --- sd_notify ---------------------------------------------------------------------------------


class NotifySocket:
    """The service manager's end: a unix datagram socket, read with deadlines."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.received: list[str] = []

    def until(self, line: str, timeout: float) -> list[str]:
        """Read notifications until one has ``line``; every one read so far."""
        deadline = time.monotonic() + timeout
        while not any(line in n.splitlines() for n in self.received):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {line} within {timeout}s: {self.received}")
            self.sock.settimeout(left)
            self.received.append(self.sock.recv(4096).decode())
        return self.received

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def notify(tmp_path: Path) -> Iterator[NotifySocket]:
    sock = NotifySocket(tmp_path / "notify.sock")
    yield sock
    sock.close()


def test_sd_notify_ready_once_every_actor_runs_watchdog_pings_and_stopping_on_sigterm(
    host_factory, notify: NotifySocket
) -> None:
    host: HostProcess = host_factory(FAST_LIVENESS + "[supervisor]\ndrain_timeout_s = 5\n")
    # A 0.4 s watchdog: pinged every 0.2 s.
    host.start(wait=False, env={"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "400000"})
    notify.until("READY=1", 60)
    status = host.status()
    assert status["host"]["state"] == "running"
    assert status["actors"] and all(a["state"] == "running" for a in status["actors"])
    ready = next(i for i, n in enumerate(notify.received) if "READY=1" in n.splitlines())
    assert "STATUS=running: 6 actors" in notify.received[ready].splitlines()
    # The watchdog keeps being pinged while the host runs.
    pings_before = sum(n == "WATCHDOG=1" for n in notify.received)
    deadline = time.monotonic() + 20
    while sum(n == "WATCHDOG=1" for n in notify.received) < pings_before + 3:
        assert time.monotonic() < deadline, notify.received
        notify.sock.settimeout(max(0.1, deadline - time.monotonic()))
        notify.received.append(notify.sock.recv(4096).decode())
    # No child inherits the variables (its environ block holds none of them).
    dispatch = next(a for a in status["actors"] if a["name"] == "dispatch")
    environ = Path(f"/proc/{dispatch['pid']}/environ").read_bytes()
    assert b"NOTIFY_SOCKET" not in environ and b"WATCHDOG_USEC" not in environ
    assert host.proc is not None
    host.proc.send_signal(signal.SIGTERM)
    notify.until("STOPPING=1", 20)
    notify.until("STATUS=draining: the turns in flight end (up to 5s)", 20)
    assert host.proc.wait(30) == 0
    assert sum("READY=1" in n.splitlines() for n in notify.received) == 1


def test_sd_notify_watchdog_of_another_pid_is_not_pinged(
    host_factory, notify: NotifySocket
) -> None:
    host: HostProcess = host_factory()
    env = {"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "200000", "WATCHDOG_PID": "1"}
    host.start(env=env)
    notify.until("READY=1", 30)
    assert host.proc is not None
    host.proc.send_signal(signal.SIGTERM)
    notify.until("STOPPING=1", 20)
    assert host.proc.wait(30) == 0
    assert "WATCHDOG=1" not in notify.received


# --- metrics -------------------------------------------------------------------------------


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the endpoint: (name, sorted labels) → value."""
    answer = httpx.get(url, timeout=10)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(answer.text)
        for s in family.samples
    }


def value(samples: dict[Any, float], name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


METRICS_CONFIG = '[metrics]\nlisten = "127.0.0.1:0"\n'


@pytest.fixture(scope="module")
def shared_metrics_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostProcess]:
    """A host with metrics for the tests that only run turns and scrape."""
    host = plane_host(tmp_path_factory.mktemp("metrics"), AGENTS, METRICS_CONFIG)
    yield start(host)
    kill_host(host)


@pytest.fixture
def metrics_host(tmp_path: Path) -> Iterator[HostProcess]:
    """A host with metrics of its own, for a test that kills its actors."""
    host = plane_host(tmp_path, AGENTS, METRICS_CONFIG)
    yield start(host)
    kill_host(host)


def _send(host: HostProcess, agent: str) -> dict[str, Any]:
    done = corral("send", "--state-dir", str(host.state_dir), "--agent", agent, "hi", "--json")
    return json.loads(done.stdout)


def _runner(host: HostProcess) -> str:
    return str(next(t["runner_id"] for t in host.status()["tunnels"]))


def test_metrics_after_turns(shared_metrics_host: HostProcess) -> None:
    host = shared_metrics_host
    url = host.status()["host"]["metrics"]
    assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
    assert _send(host, "talk")["status"] == "idle"
    assert _send(host, "fails")["status"] == "failed"
    seen = scrape(url)
    assert value(seen, "corral_turns_total", outcome="completed", error="") == 1
    assert value(seen, "corral_turns_total", outcome="failed", error="demo_failure") == 1
    assert value(seen, "corral_turn_first_delta_seconds_count") == 2
    assert value(seen, "corral_turn_first_delta_seconds_bucket", le="+Inf") == 2
    runner = _runner(host)
    assert value(seen, "corral_deltas_relayed_total", runner_id=runner) == 5  # 4 + 1
    assert value(seen, "corral_tunnel_state", runner_id=runner, state="connected") == 1
    assert value(seen, "corral_tunnel_state", runner_id=runner, state="reconnecting") == 0
    assert value(seen, "corral_host_state", state="running") == 1
    assert value(seen, "corral_actor_up", actor="dispatch") == 1
    assert value(seen, "corral_actor_up", actor="server") == 1
    assert value(seen, "corral_mailbox_depth", actor="dispatch") == 0
    assert value(seen, "corral_parked_elicitations") == 0
    assert value(seen, "corral_harness_workers") == 2
    assert not [k for k in seen if k[0] == "corral_actor_restarts_total"]


@pytest.mark.chaos  # kill -9 of two actors
def test_metrics_after_kill9_of_dispatch_and_the_gateway_keep_their_counts(
    metrics_host: HostProcess,
) -> None:
    host = metrics_host
    url = host.status()["host"]["metrics"]
    assert _send(host, "talk")["status"] == "idle"
    runner = _runner(host)
    assert value(scrape(url), "corral_deltas_relayed_total", runner_id=runner) == 4
    for name in ("dispatch", "gateway"):
        row = host.actor(name)
        os.kill(row["pid"], signal.SIGKILL)
        host.restarted(name, row)
    wait_until(lambda: any(t["state"] == "connected" for t in host.status()["tunnels"]), 30)
    after = scrape(url)
    for name in ("dispatch", "gateway"):
        assert value(after, "corral_actor_restarts_total", actor=name, cause="SIGKILL") == 1
        assert value(after, "corral_actor_up", actor=name) == 1
    # What the killed incarnations counted is kept ...
    assert value(after, "corral_turns_total", outcome="completed", error="") == 1
    assert value(after, "corral_deltas_relayed_total", runner_id=runner) == 4
    assert value(after, "corral_turn_first_delta_seconds_count") == 1
    # ... and the new ones count on top.
    assert _send(host, "talk")["status"] == "idle"
    again = scrape(url)
    assert value(again, "corral_turns_total", outcome="completed", error="") == 2
    assert value(again, "corral_deltas_relayed_total", runner_id=runner) == 8


def test_metrics_endpoint_serves_only_get_metrics(shared_metrics_host: HostProcess) -> None:
    url = shared_metrics_host.status()["host"]["metrics"]
    base = url.removesuffix("/metrics")
    assert httpx.get(base + "/", timeout=10).status_code == 404
    assert httpx.post(url, timeout=10).status_code == 405
    head = httpx.head(url, timeout=10)
    assert head.status_code == 200 and head.content == b""
    open_metrics = httpx.get(url, headers={"accept": "application/openmetrics-text"}, timeout=10)
    assert open_metrics.headers["content-type"].startswith("application/openmetrics-text")
    assert open_metrics.text.rstrip().endswith("# EOF")
    # Keep-alive: two scrapes on one connection.
    with httpx.Client(timeout=10) as client:
        assert client.get(url).status_code == client.get(url).status_code == 200


def test_metrics_off_by_default_and_a_bad_or_busy_address_stops_the_host(
    host_factory, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[metrics]\nlisten = "localhost"\n')
    done = corral("up", "--state-dir", str(tmp_path / "s1"), "--config", str(bad))
    assert done.returncode == 2
    assert "metrics.listen" in done.stderr or "metrics listen 'localhost'" in done.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        config = tmp_path / "busy.toml"
        config.write_text(f'[metrics]\nlisten = "127.0.0.1:{port}"\n[server]\nenabled = false\n')
        done = corral("up", "--state-dir", str(tmp_path / "s2"), "--config", str(config))
    assert done.returncode == 1, done.stderr
    assert f"cannot serve metrics on 127.0.0.1:{port}" in done.stderr
    plain: HostProcess = host_factory().start()
    assert plain.status()["host"]["metrics"] is None
