"""A change counter that a waiter can wait past: how ``corral status --wait`` and the tests
learn that the host's status changed without asking it every few milliseconds.

The host bumps it on everything its own status shows: a child spawning, saying hello,
exiting or failing for good, the host's state, the control plane's address. What actors keep
themselves (workers, parked elicitations) is not host state and does not bump it; a waiter on
that still has to ask.
"""

from __future__ import annotations

import trio


class Changes:
    """A version number and the event of its next bump."""

    def __init__(self) -> None:
        self.version = 0
        self._next = trio.Event()

    def bump(self) -> None:
        self.version += 1
        self._next.set()
        self._next = trio.Event()

    async def wait_past(self, version: int, timeout_s: float) -> int:
        """Return the version once it is past ``version``, or after ``timeout_s``."""
        with trio.move_on_after(timeout_s):
            while self.version <= version:
                await self._next.wait()
        return self.version
