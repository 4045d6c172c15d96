"""The tools actor's call log: which tool calls started and what each one returned.

A tool call reaches the tools actor as a durable message, so a crash redelivers it to the
next incarnation. Running it again could repeat a side effect (a shell command, a write), so
every call is written down before it runs and again with its result:

* a call with a result is answered from the log (a redelivered or re-sent call, same id);
* a call that started but has no result was cut off by a crash: it is answered with an error
  saying so, never re-run.

Format: JSON lines ``{"id", "state": "started"|"done", "output", "status", "at"}`` in a
:class:`~corral._jsonlines.JsonLinesLog`, written before the call runs or is answered. A
write survives a ``kill -9`` of the actor (the page cache is the kernel's), which is the crash
this log is for; ``fsync=True`` also survives a power cut, at a thread hop and an fsync per
record. The log keeps the newest ``keep`` finished calls and is rewritten once it holds twice
that many lines.
"""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
import trio

from .._jsonlines import JsonLinesLog


class CallRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One line of the log."""

    id: str
    state: str
    output: str | None = None
    status: str | None = None
    at: float = 0.0


class CallLog:
    """Durable started/done marks of tool calls, keyed by call id."""

    def __init__(self, path: Path, *, keep: int = 10_000, fsync: bool = False) -> None:
        self.keep = keep
        self.records: dict[str, CallRecord] = {}
        self._lines = 0
        self._log = JsonLinesLog(path, trio.CapacityLimiter(1), fsync=fsync)

    async def load(self) -> None:
        """Read the log (call once, before anything else)."""
        for raw in await self._log.load():
            try:
                record = msgspec.convert(raw, CallRecord)
            except msgspec.ValidationError:
                continue
            self.records[record.id] = record
            self._lines += 1

    def get(self, call_id: str) -> CallRecord | None:
        """The last record of a call, if any."""
        return self.records.get(call_id)

    async def started(self, call_id: str) -> None:
        """Write down that a call is about to run."""
        await self._write(CallRecord(id=call_id, state="started", at=time.time()))

    async def done(self, call_id: str, output: str, status: str) -> None:
        """Write down a call's result."""
        await self._write(
            CallRecord(id=call_id, state="done", output=output, status=status, at=time.time())
        )

    async def _write(self, record: CallRecord) -> None:
        self.records[record.id] = record
        self._lines += 1
        await self._log.append([msgspec.to_builtins(record)])
        if self._lines > 2 * self.keep:
            await self._compact()

    async def _compact(self) -> None:
        # Unfinished calls always stay: they decide the answer to a redelivery.
        done = sorted((r for r in self.records.values() if r.state == "done"), key=lambda r: r.at)[
            -self.keep :
        ]
        kept = [r for r in self.records.values() if r.state != "done"] + done
        await self._log.rewrite([msgspec.to_builtins(r) for r in kept])
        self.records = {r.id: r for r in kept}
        self._lines = len(kept)
