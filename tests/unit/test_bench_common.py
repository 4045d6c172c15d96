"""Benchmark helpers: waiting for a host to go quiet before a light-load phase."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import trio

from corral.bench._common import _tree_cpu_s, quiet


def test_tree_cpu_counts_children() -> None:
    # The child burns 0.3 s of CPU, says so, and waits (alive) until its stdin closes.
    burn = (
        "import sys, time\n"
        "while time.process_time() < 0.3: pass\n"
        "print('burnt', flush=True)\n"
        "sys.stdin.read()\n"
    )
    before = _tree_cpu_s(os.getpid())
    child = subprocess.Popen(
        [sys.executable, "-c", burn], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "burnt"
        assert _tree_cpu_s(os.getpid()) - before >= 0.25, "a busy child's CPU was not counted"
    finally:
        child.kill()
        child.wait()


async def test_quiet_waits_for_a_busy_child_to_stop() -> None:
    spin = "import time\nt = time.time()\nwhile time.time() - t < 1: pass"
    async with trio.open_nursery() as nursery:
        child = await nursery.start(trio.run_process, [sys.executable, "-c", spin])
        t0 = time.monotonic()
        with trio.fail_after(10):
            await quiet(os.getpid())
        assert child.poll() is not None, "quiet returned while the child still spun"
        assert time.monotonic() - t0 >= 0.5
