"""``corral bench up``: how long a host takes to start (every actor running) and to stop.

Each run is a real ``corral up`` in a fresh state dir, without a server; the clock runs from
the exec to the status that shows every actor ``running``, then from SIGTERM to the host's
exit. Baseline, same run: one process that imports an actor's runtime
(``corral.actors._entry``) and exits — what every actor pays before it can say hello.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Mapping

from ._common import Document, figure, percentile, running_host
from ._progress import step

CONFIG = "[server]\nenabled = false\n"


def _floor(n: int) -> list[float]:
    """Seconds for a process to import the actor runtime and exit, sorted."""
    out = []
    with step("baseline: import the actor runtime", total=n) as progress:
        for _ in range(n):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", "import corral.actors._entry"], check=True)
            out.append(time.perf_counter() - t0)
            progress.advance()
    return sorted(out)


def _cycles(n: int) -> tuple[list[float], list[float], int]:
    """Sorted start and stop times of ``n`` hosts, and how many actors each ran."""
    ups, downs, actors = [], [], 0
    with step("start and stop a host", total=n) as progress:
        for _ in range(n):
            t0 = time.perf_counter()
            with running_host(CONFIG, poll_s=0.005) as inst:
                ups.append(time.perf_counter() - t0)
                actors = len(list(inst.children_dir.glob("*.pid")))
                t1 = time.perf_counter()
            downs.append(time.perf_counter() - t1)
            progress.advance()
    return sorted(ups), sorted(downs), actors


def run(params: Mapping[str, object]) -> Document:
    """Measure and return the result document of docs/contract.md."""
    n = 3 if params.get("quick") else 10
    floor = _floor(n)
    ups, downs, actors = _cycles(n)
    base = percentile(floor, 0.5)
    return {
        "benchmark": "up",
        "baseline": {"name": "one actor runtime import p50", "value": round(base, 4), "unit": "s"},
        "results": [
            figure("host up p50", percentile(ups, 0.5), "s", base),
            figure("host up max", ups[-1], "s", base),
            figure("host stop p50", percentile(downs, 0.5), "s", base),
        ],
        "params": {"runs": n, "actors": actors},
    }
