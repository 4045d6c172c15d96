"""Worker threads for the tools' blocking file work, at most :data:`MAX_FILE_THREADS` at once.

Reading, writing and editing files, and looking a process group up in ``/proc``, block; each
runs in a worker thread so that the tools actor's trio loop keeps serving. The threads are
shared by every session and every tool, so one session's large read cannot take them all.
A module of its own because the file tools, the shell and the environments all use it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import trio

#: Worker threads the file tools use at most, all sessions together.
MAX_FILE_THREADS = 4

_T = TypeVar("_T")

# One limiter per trio run: a module-level limiter would outlive the run that made it.
_LIMITER: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("corral_os_tools")


async def in_thread(fn: Callable[..., _T], *args: Any) -> _T:
    """Run blocking file work in a worker thread, at most :data:`MAX_FILE_THREADS` at once."""
    try:
        limiter = _LIMITER.get()
    except LookupError:
        limiter = trio.CapacityLimiter(MAX_FILE_THREADS)
        _LIMITER.set(limiter)
    return await trio.to_thread.run_sync(fn, *args, limiter=limiter)
