"""Idempotent handling: remember which durable message ids were already handled.

Delivery is at-least-once — a recipient killed after handling a message but before its ack
reached the broker gets it again. A handler whose effect must happen once records the
message id with :meth:`Dedup.mark` as the commit point of that effect. When the effect is
itself a small durable record, put it in ``note``: the id and the effect then become durable
in one fsynced line, and no crash can separate them.

File format: one ``<id>\\t<note>\\n`` line per handled message; a torn last line (no
newline, left by a crash mid-write) is ignored and cut off on load.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path

import trio

from .._jsonlines import write_atomically


class Dedup:
    """A durable set of handled message ids, bounded to the newest ``keep``.

    Args:
        path: a file owned by one actor.
        keep: ids remembered; redeliveries arrive within seconds, so thousands are plenty.
    """

    def __init__(self, path: Path, *, keep: int = 50_000) -> None:
        self.path = path
        self.keep = keep
        self._ids: OrderedDict[str, str] = OrderedDict()
        self._limiter = trio.CapacityLimiter(1)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            data = path.read_bytes()
            complete = data[: data.rfind(b"\n") + 1]
            if len(complete) != len(data):
                with open(path, "r+b") as f:
                    f.truncate(len(complete))
            for line in complete.decode(errors="replace").splitlines():
                mid, _, note = line.partition("\t")
                if mid:
                    self._ids[mid] = note
            self._trim()

    def seen(self, message_id: str) -> bool:
        """Whether ``message_id`` was already handled."""
        return message_id in self._ids

    def notes(self) -> list[str]:
        """The notes of the remembered ids, oldest first."""
        return list(self._ids.values())

    async def mark(self, message_id: str, note: str = "") -> bool:
        """Durably record ``message_id`` (with ``note``) as handled.

        Returns False, writing nothing, if it was already recorded.
        """
        if message_id in self._ids:
            return False
        if "\n" in note or "\t" in message_id or "\n" in message_id:
            raise ValueError("dedup ids and notes are single-line")
        self._ids[message_id] = note
        await trio.to_thread.run_sync(
            self._append, f"{message_id}\t{note}\n", limiter=self._limiter
        )
        if len(self._ids) > 2 * self.keep:
            self._trim()
            await trio.to_thread.run_sync(self._rewrite, limiter=self._limiter)
        return True

    def _trim(self) -> None:
        while len(self._ids) > self.keep:
            self._ids.popitem(last=False)

    def _append(self, line: str) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def _rewrite(self) -> None:
        write_atomically(self.path, "".join(f"{i}\t{n}\n" for i, n in self._ids.items()).encode())
