"""The fault hook of crash tests: an actor option ``crash_at = <step>`` makes the actor exit
at that point of its work, at once and without cleanup, as ``kill -9`` would stop it.

A crash test needs the kill to land *between* two steps that no outside signal can aim at
(a publish and the commit that follows it, a save and the send after it). The hook fires once
per data directory: a marker file keeps the restarted incarnation from dying at the same
point, so the test sees what recovery does.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

__all__ = ["CRASH_EXIT", "crash_point"]

#: The exit code of a crash the ``crash_at`` option asked for (as ``kill -9`` leaves it).
CRASH_EXIT = 137


def crash_point(data_dir: Path, step: str, wanted: str, log: logging.Logger) -> None:
    """Exit now if ``step`` is the ``wanted`` one and this data directory has not crashed
    there before."""
    if step != wanted:
        return
    marker = data_dir / f"crashed-at-{step}"
    if marker.exists():
        return
    fd = os.open(marker, os.O_WRONLY | os.O_CREAT, 0o600)
    os.fsync(fd)
    os.close(fd)
    log.warning("crash_at %s: exiting now", step)
    os._exit(CRASH_EXIT)
