"""A harness whose first worker of a host hangs while it starts (imports), for the test of a
worker killed while it starts: the import leaves a marker, named after the harness actor (the
worker's parent, or the parent of the zygote it was forked from), and sleeps; a worker that
finds the marker starts at once."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from corral.harnesses._turn import TurnContext


def _harness_actor() -> int:
    parent = os.getppid()
    if Path(f"/proc/{parent}/cmdline").read_bytes().startswith(b"corral: zygote"):
        return int(Path(f"/proc/{parent}/stat").read_text().rsplit(")", 1)[1].split()[1])
    return parent


_MARKER = Path(f"/tmp/corral-slow-start-{_harness_actor()}")
if not _MARKER.exists():
    _MARKER.touch()
    time.sleep(60)


class SlowStart:
    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options

    async def run_turn(self, turn: TurnContext) -> None:
        await turn.text("started")
