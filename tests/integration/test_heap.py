"""Processes give back what a burst freed once it is over (:mod:`corral._heap`): a real
process's resident set falls, and a real host's processes release after a flood of deltas."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.conftest import FAST_LIVENESS, HostProcess, corral, kill_host

BURST = """
import trio
import trio.testing
from corral import _heap as heap

async def main():
    work = [0]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(heap.release_when_quiet, lambda: work[0])
        await trio.testing.wait_all_tasks_blocked()  # it has looked at the heap before
        # ~64 MB of 1 KiB objects (malloc's, not CPython's pools), one in 64 kept: what a
        # flood of messages leaves, a heap whose free chunks lie between live ones.
        chunks = [bytes(1000) + i.to_bytes(4, "little") for i in range(64_000)]
        kept = chunks[::64]
        work[0] += len(chunks)
        peak = heap.resident_bytes()
        del chunks
        with trio.fail_after(10):
            while heap.stats["releases"] == 0:
                await trio.sleep(0.05)
        print(peak, heap.resident_bytes(), len(kept), flush=True)
        nursery.cancel_scope.cancel()

trio.run(main)
"""


def test_a_process_gives_back_what_a_burst_freed_once_it_is_quiet() -> None:
    done = subprocess.run(
        [sys.executable, "-c", BURST], capture_output=True, text=True, timeout=60, check=True
    )
    peak, after, _ = map(int, done.stdout.split())
    # Without the release, glibc keeps nearly all of the ~63 MB freed between the kept ones.
    assert peak - after > 40 << 20, (peak, after)


#: Each of the three actors grew 2 to 9 MB in a 5,000-delta turn: more, for a margin over
#: MIN_GROWTH (1 MiB) whatever else runs.
FLOOD = 8000
AGENT = f"""
name: flood
executor:
  harness: scripted
  script:
    turns:
      - - {{text: "{"x" * FLOOD}", chunk: 1}}
"""


def test_after_a_flood_of_deltas_the_host_and_the_actors_it_passed_release(
    tmp_path: Path,
) -> None:
    agents = tmp_path / "agents"
    agents.mkdir()
    (agents / "flood.yaml").write_text(textwrap.dedent(AGENT))
    config = FAST_LIVENESS + f"[server]\nagents_dirs = [{json.dumps(str(agents))}]\n"
    host = HostProcess(tmp_path / "state", config)
    try:
        host.start()
        host.wait_for(lambda s: s["server"] and s["server"]["state"] == "running", 30, "plane")
        released = {
            name: host.ask("inspect", actor=name)["state"]["heap_releases"]
            for name in ("dispatch", "gateway", "journal")
        }
        sent = corral(
            "send",
            "--state-dir",
            str(host.state_dir),
            "--agent",
            "flood",
            "go",
            "--json",
            timeout=120,
        )
        assert sent.returncode == 0, sent.stderr
        deltas = [
            e
            for e in json.loads(sent.stdout)["events"]
            if e["type"] == "response.output_text.delta"
        ]
        assert len(deltas) == FLOOD

        def releases() -> tuple[dict[str, int], int]:
            actors = {n: host.ask("inspect", actor=n)["state"]["heap_releases"] for n in released}
            return actors, host.status()["host"]["heap_releases"]

        # Asked once a second: asking is work too, and asked without pause (wait_until's
        # 20 ms) dispatch and the host would never be quiet.
        deadline = time.monotonic() + 20
        while True:
            actors, own = releases()
            if own > 0 and all(actors[n] > before for n, before in released.items()):
                break
            assert time.monotonic() < deadline, f"no release after the flood: {actors}, {own}"
            time.sleep(1)
    finally:
        kill_host(host)
