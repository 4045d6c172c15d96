"""A change counter that a waiter can wait past, with a deadline.

The host bumps one on everything its own status shows (a child spawning, saying hello,
exiting or failing for good, the host's state, the control plane's address): that is how
``corral status --wait`` and the tests learn that its status changed without asking it every
few milliseconds. The gateway's stream buffer bumps one whenever a stream sends or confirms
events, and a worker's held events whenever dispatch confirms some: what flow control waits
on. A bump between reading the version and waiting past it is never missed.
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
