"""Loads that concurrent callers share, with nothing older than the call returned.

The control plane re-reads its agent directories on every use, so an edited agent reaches
the next turn. Under a burst — fifty tool calls evaluated at once after a policy restart —
one re-read per call, each behind the last, made the fiftieth wait a second and a half for a
verdict on files that had not changed. Here a caller is answered by a load that *started
after it called*: callers that arrive during a load share the one after it, so a burst costs
at most two loads and no caller sees files older than its call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

import trio

__all__ = ["Coalesced"]

T = TypeVar("T")


class Coalesced(Generic[T]):
    """``await coalesced()`` → the result of a run of ``load`` that began after the call."""

    def __init__(self, load: Callable[[], Awaitable[T]]) -> None:
        self._load = load
        self._started = 0  # runs begun
        self._done = 0  # the run whose result is kept
        self._result: T | None = None
        self._running: trio.Event | None = None

    async def __call__(self) -> T:
        wanted = self._started + 1  # the first run that begins from now on
        while self._done < wanted:
            if self._running is not None:
                await self._running.wait()
                continue
            self._started += 1
            run, self._running = self._started, trio.Event()
            try:
                self._result = await self._load()
                self._done = run
            finally:
                self._running.set()
                self._running = None
        assert self._result is not None
        return self._result
