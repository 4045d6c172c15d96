"""Benchmark helpers: waiting for a host to go quiet before a light-load phase."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import trio

from corral.bench._common import _tree_cpu_s, quiet


def test_tree_cpu_counts_children() -> None:
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        before = _tree_cpu_s(os.getpid())
        deadline = time.monotonic() + 10
        while _tree_cpu_s(os.getpid()) - before < 0.2:
            assert time.monotonic() < deadline, "a busy child's CPU was not counted"
            time.sleep(0.05)
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
