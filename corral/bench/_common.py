"""Helpers shared by the benchmarks: result shapes, percentiles, child processes."""

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
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import trio

from .._jsonlines import JsonObject
from ..instance import Instance
from ._progress import step


class NotRunnable(RuntimeError):
    """The benchmark cannot run on this machine (what it needs is missing); the message says
    what and how to install it."""


class Figure(TypedDict):
    """One result row of a benchmark."""

    name: str
    value: float
    unit: str
    #: value / baseline; None without a baseline.
    ratio_to_baseline: float | None


class Baseline(TypedDict):
    """What a benchmark's figures are compared with, measured in the same run."""

    name: str
    value: float
    unit: str


class Document(TypedDict):
    """What ``run(params)`` of every benchmark returns and ``corral bench --json`` prints
    (docs/contract.md); ``figures`` and ``ok`` only for the chaos benchmark."""

    benchmark: str
    baseline: Baseline
    results: list[Figure]
    #: The parameters the run used: each benchmark has its own.
    params: JsonObject
    figures: NotRequired[JsonObject]
    ok: NotRequired[bool]


def figure(name: str, value: float, unit: str, baseline: float | None = None) -> Figure:
    """One result row; ``ratio_to_baseline`` is value / baseline when one is given."""
    return {
        "name": name,
        "value": round(value, 4),
        "unit": unit,
        "ratio_to_baseline": round(value / baseline, 4) if baseline else None,
    }


def percentile(sorted_values: list[float], q: float) -> float:
    """The q-quantile (0..1) of already sorted values."""
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, round(q * (len(sorted_values) - 1)))
    return sorted_values[index]


def start_role(module: str, *args: str) -> subprocess.Popen:
    """Start a benchmark role in its own process (by exec, with its own zmq context)."""
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


@contextlib.contextmanager
def running_host(config_text: str, *, poll_s: float = 0.05) -> Iterator[Instance]:
    """A real ``corral up`` in a temporary state dir, for the duration of the block: it
    starts once every actor runs (asked every ``poll_s``).

    Its log goes to ``$CORRAL_BENCH_LOG`` when set (else nowhere).
    """
    from ..actors._control import request

    tmp = Path(tempfile.mkdtemp(prefix="corral-bench-"))
    inst = Instance(tmp / "state")
    config = tmp / "corral.toml"
    config.write_text(config_text)
    log_file = open(os.environ.get("CORRAL_BENCH_LOG", os.devnull), "ab")  # noqa: SIM115
    argv = [
        sys.executable,
        "-m",
        "corral",
        "up",
        "--state-dir",
        str(inst.state_dir),
        "--config",
        str(config),
    ]
    host = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=log_file, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 30
        with step("starting a host"):
            while True:
                try:
                    status = request(inst.control_path, "status")
                    if status["host"]["state"] == "running" and all(
                        a["state"] == "running" for a in status["actors"]
                    ):
                        break
                except (OSError, RuntimeError, ValueError):
                    pass
                if time.monotonic() > deadline or host.poll() is not None:
                    raise RuntimeError("the benchmark host did not start")
                time.sleep(poll_s)
        yield inst
    finally:
        host.send_signal(signal.SIGTERM)
        try:
            host.wait(20)
        except subprocess.TimeoutExpired:
            host.kill()
        log_file.close()
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.asynccontextmanager
async def _sending_role(*args: str) -> AsyncIterator[None]:
    """A sender from ``corral.bench._bus_roles``, connected and told to go; killed on exit."""
    tx = start_role("corral.bench._bus_roles", *args)
    try:
        assert tx.stdout is not None and tx.stdout.readline().strip() == "ready"
        assert tx.stdin is not None
        tx.stdin.write("go\n")
        tx.stdin.flush()
        yield
    finally:
        tx.kill()
        tx.wait()


async def raw_stream_rate(endpoint: str, peer: Any, n: int) -> float:
    """The baseline of host benchmarks: stream messages/s from a peer process to ``peer``
    through the host's broker, received one by one like the benchmark's own consumer."""
    async with _sending_role("stream", endpoint, str(n), "256"):
        got = 0
        first = last = 0.0
        with trio.move_on_after(60):
            while got < n:
                await peer.inbox.receive()
                last = time.perf_counter()
                if got == 0:
                    first = last
                got += 1
    if got < n:
        raise RuntimeError(f"raw stream: {got} of {n} messages arrived")
    return (got - 1) / max(last - first, 1e-9)


async def raw_paced_latency(endpoint: str, peer: Any, n: int, interval_ms: float) -> list[float]:
    """The latency baseline of host benchmarks: sorted send → arrival times of stream
    messages sent one at a time, ``interval_ms`` apart, from a peer process to ``peer``
    through the host's broker."""
    out: list[float] = []
    async with _sending_role("paced", endpoint, str(n), str(interval_ms)):
        with trio.move_on_after(60):
            while len(out) < n:
                incoming = await peer.inbox.receive()
                out.append(time.time() - incoming.env.created_at)
    if len(out) < n:
        raise RuntimeError(f"raw paced stream: {len(out)} of {n} messages arrived")
    return sorted(out)


def host_pid(inst: Instance) -> int:
    """The pid of the running host of ``inst``."""
    return int(json.loads(inst.host_file.read_text())["pid"])


def _tree_cpu_s(root: int) -> float:
    """CPU seconds used so far by ``root`` and every process below it."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    total = 0.0
    for pid in cpu:
        p = pid
        while p > 1 and p != root:
            p = parents.get(p, 0)
        if p == root:
            total += cpu[pid]
    return total


async def quiet(root: int, *, share: float = 0.05, timeout: float = 30.0) -> None:
    """Wait until the processes under ``root`` use less than ``share`` of a core (over a
    quarter second): a phase measured "at light load" must not start while the host still
    digests the previous one (the journal writing a flood, say)."""
    with trio.move_on_after(timeout):
        before = _tree_cpu_s(root)
        while True:
            await trio.sleep(0.25)
            after = _tree_cpu_s(root)
            if after - before < share * 0.25:
                return
            before = after
