"""``corral bench journal``: what durability costs, and what group commit buys back.

All figures come from one run on one directory (a temp dir, or ``params["dir"]``; it must be
on the disk you care about: on tmpfs every fsync is free):

* baseline: plain appends, one run, no fsync (``RunJournal`` with the ``terminal`` policy);
* ``write+fsync`` per record, one run (``every`` policy, synchronous);
* group commit through ``JournalWriter`` (``every``) across ``runs`` concurrent runs, each
  run one producer that awaits every append before the next;
* the same, each producer keeping up to ``in_flight`` appends pipelined (``submit`` then
  ``wait``), as a relay of a live stream does; every append still waits until fsynced;
* replay: ``RunJournal.read`` of a ``replay_events``-record run.

Run ``python -m corral.bench.journal`` (or ``corral bench journal --json``) to print the
JSON document.
"""

from __future__ import annotations

import collections
import json
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TypedDict, cast

import trio

from corral.journal import JournalWriter, PendingAppend, RunJournal

from ._common import Document, figure


class JournalParams(TypedDict):
    """The journal benchmark's parameters (:data:`DEFAULTS`, overridden by the caller's)."""

    runs: int
    events_per_run: int
    in_flight: int
    payload_bytes: int
    plain_events: int
    fsync_events: int
    replay_events: int
    fsync_threads: int
    window_s: float
    #: Where the runs are written; None: a temporary directory.
    dir: str | None
    quick: bool


class _Payload(TypedDict):
    text: str
    i: int


class _Commit(TypedDict):
    events_per_s: float
    appends: int
    fsync_rounds: int
    fsyncs: int
    appends_per_fsync_round: float


DEFAULTS: JournalParams = {
    "runs": 50,
    "events_per_run": 400,
    "in_flight": 16,
    "payload_bytes": 100,
    "plain_events": 20_000,
    "fsync_events": 2_000,
    "replay_events": 100_000,
    "fsync_threads": 8,
    "window_s": 0.0,
    "dir": None,
    "quick": False,
}

# What ``quick`` (smoke runs, CI) shrinks, unless the caller sets it explicitly.
QUICK: Mapping[str, int] = {
    "events_per_run": 100,
    "plain_events": 5_000,
    "fsync_events": 500,
    "replay_events": 20_000,
}


def _payload(size: int, index: int) -> _Payload:
    return {"text": "x" * size, "i": index}


def _sync_appends(root: Path, policy: str, events: int, size: int) -> float:
    with RunJournal(root, fsync=policy) as journal:
        journal.append("bench", "warmup", "token", _payload(size, 0))
        started = time.perf_counter()
        for index in range(events):
            journal.append("bench", "run", "token", _payload(size, index))
        elapsed = time.perf_counter() - started
    return events / elapsed


async def _group_commit(root: Path, params: JournalParams, in_flight: int) -> _Commit:
    journal = RunJournal(root, fsync="every")
    runs, per_run, size = params["runs"], params["events_per_run"], params["payload_bytes"]

    async def producer(writer: JournalWriter, run_id: str) -> None:
        window: collections.deque[PendingAppend] = collections.deque()
        for index in range(per_run):
            window.append(writer.submit("bench", run_id, "token", _payload(size, index)))
            if len(window) >= in_flight:
                await window.popleft().wait()
        while window:
            await window.popleft().wait()

    async with JournalWriter(
        journal, fsync_threads=params["fsync_threads"], window=params["window_s"]
    ) as writer:
        # Open every run first, so the timed part is appends only.
        async with trio.open_nursery() as nursery:
            for run in range(runs):
                nursery.start_soon(writer.append, "bench", f"run-{run}", "start", None)
        before = writer.statistics()
        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for run in range(runs):
                nursery.start_soon(producer, writer, f"run-{run}")
        elapsed = time.perf_counter() - started
        after = writer.statistics()
    appends = runs * per_run
    fsync_rounds = after.fsync_rounds - before.fsync_rounds
    return {
        "events_per_s": appends / elapsed,
        "appends": appends,
        "fsync_rounds": fsync_rounds,
        "fsyncs": after.fsyncs - before.fsyncs,
        "appends_per_fsync_round": appends / max(1, fsync_rounds),
    }


def _replay(root: Path, events: int, size: int) -> tuple[float, int]:
    with RunJournal(root, fsync="terminal") as journal:
        for index in range(events):
            journal.append("bench", "replay", "token", _payload(size, index))
    started = time.perf_counter()
    replayed = RunJournal(root).read("bench", "replay")
    elapsed = time.perf_counter() - started
    return elapsed, len(replayed["events"])


def run(params: Mapping[str, object]) -> Document:
    """Run the journal benchmark and return the ``corral bench`` JSON document.

    ``params`` overrides :data:`DEFAULTS` (unknown keys raise ``ValueError``); with
    ``quick`` the workloads shrink to :data:`QUICK`. The document's ``params`` holds the
    values used.
    """
    unknown = sorted(set(params) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"unknown journal bench params: {unknown}")
    # The keys are checked above; the values are the caller's, as given.
    used = cast(JournalParams, {**DEFAULTS, **(QUICK if params.get("quick") else {}), **params})
    root = Path(tempfile.mkdtemp(prefix="corral-bench-journal-", dir=used["dir"]))
    size = used["payload_bytes"]
    try:
        plain = _sync_appends(root / "plain", "terminal", used["plain_events"], size)
        fsynced = _sync_appends(root / "fsync", "every", used["fsync_events"], size)
        serial = trio.run(_group_commit, root / "serial", used, 1)
        piped = trio.run(_group_commit, root / "piped", used, used["in_flight"])
        replay_s, replayed = _replay(root / "replay", used["replay_events"], size)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    runs = used["runs"]
    results = [
        figure("write+fsync per record", fsynced, "events/s", plain),
        figure(
            f"group commit, {runs} runs, 1 in flight per run",
            serial["events_per_s"],
            "events/s",
            plain,
        ),
        figure(
            f"group commit, {runs} runs, {used['in_flight']} in flight per run",
            piped["events_per_s"],
            "events/s",
            plain,
        ),
        figure(
            "group commit appends per fsync round (pipelined)",
            piped["appends_per_fsync_round"],
            "appends/round",
            None,
        ),
        figure(f"replay of a {replayed}-event run", replay_s, "s", None),
        figure("replay throughput", replayed / replay_s, "events/s", plain),
    ]
    return {
        "benchmark": "journal",
        "baseline": {
            "name": "plain append, no fsync",
            "value": round(plain, 4),
            "unit": "events/s",
        },
        "results": results,
        "params": {**used, "dir": str(used["dir"]) if used["dir"] else None},
    }


if __name__ == "__main__":
    print(json.dumps(run({}), indent=2))
