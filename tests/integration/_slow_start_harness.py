"""A harness whose first worker of a host hangs while it starts (imports), for the test of a
worker killed while it starts: the import leaves a marker, named after the harness actor (the
worker's parent, the parent of the zygote it was forked from, or the host's harness actor for a
zygote the seed forked), and sleeps; a worker that
finds the marker starts at once."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from corral.harnesses._turn import TurnContext


def _title(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _ancestors(pid: int) -> set[int]:
    found: set[int] = set()
    while pid > 1:
        pid = _ppid(pid)
        found.add(pid)
    return found


def _harness_actor() -> int:
    """The harness actor this worker serves: its parent (an exec'd worker), or its zygote's
    (an exec'd zygote), or the host's one harness actor (a zygote the seed forked)."""
    parent = os.getppid()
    if _title(parent).startswith(b"corral: zygote"):
        parent = _ppid(parent)
    if not _title(parent).startswith(b"corral: seed"):
        return parent
    host = _ppid(parent)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            pid = int(entry.name)
            try:
                if _title(pid).startswith(b"corral: harness") and host in _ancestors(pid):
                    return pid
            except OSError:
                continue
    raise LookupError("no harness actor under the host")


_MARKER = Path(f"/tmp/corral-slow-start-{_harness_actor()}")
if not _MARKER.exists():
    _MARKER.touch()
    time.sleep(60)


class SlowStart:
    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options

    async def run_turn(self, turn: TurnContext) -> None:
        await turn.text("started")
