"""``corral bench up``: real hosts started and stopped, timed against a process start."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys

import pytest

from corral.config import BUILTIN_ACTORS


@pytest.mark.chaos
def test_bench_up_times_real_hosts_against_an_actor_runtime_import() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "corral", "bench", "up", "--quick", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stderr == "", "no progress bar where no terminal watches"
    out = done.stdout
    doc = json.loads(out)
    assert doc["benchmark"] == "up"
    assert doc["baseline"]["unit"] == "s" and doc["baseline"]["value"] > 0
    rows = {r["name"]: r for r in doc["results"]}
    assert set(rows) == {"host up p50", "host up max", "host stop p50"}
    # A host starts several actors, each paying at least the runtime import.
    assert rows["host up p50"]["ratio_to_baseline"] > 1
    assert rows["host up p50"]["value"] <= rows["host up max"]["value"]
    # Every built-in actor: a production host (the test-only echo actor is not among them).
    assert doc["params"] == {"runs": 3, "actors": len(BUILTIN_ACTORS)}


@pytest.mark.chaos
def test_bench_shows_progress_bars_on_a_terminal_and_keeps_stdout_clean() -> None:
    """stderr on a pseudo-terminal, as a user runs it: the steps show while they run (rich
    redraws them, so they are read from the raw bytes); stdout holds the one document."""
    main, child = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "corral", "bench", "up", "--quick", "--json"],
        stdout=subprocess.PIPE,
        stderr=child,
        env={**os.environ, "COLUMNS": "120", "TERM": "xterm"},
    )
    os.close(child)
    screen = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: the child side closed, the run is over
            break
        if not chunk:
            break
        screen += chunk
    os.close(main)
    assert proc.stdout is not None
    doc = json.loads(proc.stdout.read())
    assert proc.wait(120) == 0
    assert doc["benchmark"] == "up"
    text = screen.decode(errors="replace")
    for step in ("baseline: import the actor runtime", "start and stop a host", "starting a host"):
        assert step in text, text[-2000:]
    assert re.search(r"[12]/3", text), "a step that counts shows how far it is"
