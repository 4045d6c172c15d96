"""Append to a journal in a burst until killed, reporting each durable record.

Usage: ``python _journal_burst.py ROOT RUNS [TEXT_BYTES]``. Every run gets a producer that
keeps 8 appends in flight through a JournalWriter (policy ``every``); as each one is
confirmed durable the script prints ``<run_id> <seq>`` and flushes stdout, so whatever the
parent read was on disk before it was printed. It never stops by itself: the parent kills
it with SIGKILL.
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import trio

from corral.journal import JournalWriter, PendingAppend, RunJournal


async def producer(writer: JournalWriter, run_id: str, size: int) -> None:
    in_flight: collections.deque[PendingAppend] = collections.deque()
    index = 0
    while True:
        # Multi-page records make multi-page writes, which a kill can tear.
        in_flight.append(writer.submit("crash", run_id, "token", {"text": "x" * size, "i": index}))
        index += 1
        if len(in_flight) >= 8:
            record = await in_flight.popleft().wait()
            sys.stdout.write(f"{run_id} {record['seq']}\n")
            sys.stdout.flush()


async def main(root: Path, runs: int, size: int) -> None:
    journal = RunJournal(root, fsync="every")
    async with JournalWriter(journal) as writer, trio.open_nursery() as nursery:
        for run in range(runs):
            nursery.start_soon(producer, writer, f"run-{run}", size)


if __name__ == "__main__":
    size = int(sys.argv[3]) if len(sys.argv) > 3 else 3000
    trio.run(main, Path(sys.argv[1]), int(sys.argv[2]), size)
