"""Giving a process's freed memory back to the system once a burst of work is over.

A flood of deltas passes through every process of a turn's path, and each ends it with its
heap at the flood's high-water mark: the messages are freed, but glibc's malloc keeps the
freed chunks for the next burst instead of unmapping them, and CPython collects reference
cycles only when its counters say so. After a 100,000-delta turn through the real server the
host's tree held 249 MB of PSS, 224 MB with this module (docs/supervision.md, "Memory after
a burst").

So each process — the host, every actor, every worker — watches a count of its own work
(messages sent, received and taken from its inbox, or routed). Whenever it is not in a burst
(the count grew by at most :data:`QUIET_WORK` in the last :data:`QUIET_S`: heartbeats and the
odd request never stop) and its resident set grew by :data:`MIN_GROWTH` since it last
released, it collects its cycles and trims its heap (:func:`release`). Work is counted in
messages but grows memory by their size (one answer may carry a run of 5,000 events), hence
the resident set; and a process that spent :data:`BUSY_CPU` of a core since it last looked
is in a burst whatever its count says (the journal takes a flood in a few large appends a
second, few enough to pass for quiet, and a full collection of its heap cost 8 % of its time
in one). An idle process looks once every :data:`IDLE_S`; a busy one is never interrupted.

What this cannot give back: CPython's own pools (``pymalloc`` arenas) go back only when every
object in them is freed, and a long-lived object left among a burst's keeps its arena.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import time
from collections.abc import Callable

import trio

#: Seconds without work after a burst before the process looks at what it holds.
QUIET_S = 0.2
#: Seconds between looks while nothing happens.
IDLE_S = 1.0
#: Work within :data:`QUIET_S` that still counts as quiet: heartbeats and the odd request
#: never stop, a burst is hundreds of messages.
QUIET_WORK = 16
#: Growth of the resident set since the last release that makes one worth it. A heartbeat
#: is work too, but grows nothing: an idle process is left alone.
MIN_GROWTH = 1 << 20
#: Share of one core spent within a look that makes it a burst, however few its messages.
BUSY_CPU = 0.25

_PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes() -> int:
    """This process's resident set (``/proc/self/statm``)."""
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[1]) * _PAGE


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``; None where the C library has none (musl, macOS)."""
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_TRIM = _malloc_trim()


#: This process's releases so far (``heap_releases`` in ``corral status --json`` and in an
#: actor's inspection).
stats = {"releases": 0}


def release() -> None:
    """Collect this process's garbage cycles, then hand its heap's free pages back."""
    gc.collect()
    if _TRIM is not None:
        _TRIM(0)
    stats["releases"] += 1


async def release_when_quiet(
    work: Callable[[], int],
    *,
    on_release: Callable[[], None] = release,
    resident: Callable[[], int] = resident_bytes,
    cpu: Callable[[], float] = time.process_time,
) -> None:
    """Run until cancelled: whenever the process is not in a burst — ``work``, a count that
    grows with what it does, grew by at most :data:`QUIET_WORK` in the last :data:`QUIET_S`
    (or in proportion over :data:`IDLE_S`), and it spent less than :data:`BUSY_CPU` of a
    core (``cpu``, its CPU seconds) — :func:`release` (``on_release``) if the resident set
    grew by :data:`MIN_GROWTH` or more since the last release."""
    floor = resident()
    busy = False
    while True:
        seen, spent = work(), cpu()
        look = QUIET_S if busy else IDLE_S
        await trio.sleep(look)
        busy = work() - seen > QUIET_WORK * look / QUIET_S or cpu() - spent > BUSY_CPU * look
        if not busy and resident() - floor >= MIN_GROWTH:
            on_release()
            floor = resident()
