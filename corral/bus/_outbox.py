"""Batched stream sends: queue now, send together when the sender next yields.

A send per message costs a trip through the scheduler each; an :class:`Outbox` queues
stream messages and a task of its own sends them with one ``cast_many`` per run of messages
to the same recipient, preserving order. A durable send must call :meth:`Outbox.flush`
first, so nothing queued before it arrives after it. Its owner may ``pack`` each run into
fewer messages (a worker packs deltas, :func:`corral.harnesses.protocol.pack_deltas`).
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from ._messages import Message
from ._peer import Peer

#: Queued messages past which :meth:`Outbox.put` flushes inline.
OUTBOX_MAX = 256


class Outbox:
    """Order-preserving batched stream sends for one peer. Run :meth:`run` in a nursery."""

    def __init__(
        self, peer: Peer, *, pack: Callable[[str, list[Message]], list[Message]] | None = None
    ) -> None:
        self.peer = peer
        #: ``pack(to, run)``: the messages that carry a run of messages to ``to``, in order.
        self._pack = pack
        self._queue: list[tuple[str, Message, str | None]] = []
        self._ready = trio.Event()
        # One flusher at a time: a flush yields between runs of a batch, and a second
        # flusher sending newer messages then would overtake the rest of the first batch.
        self._flushing = trio.Lock()

    async def put(self, to: str, msg: Message, *, session_id: str | None = None) -> None:
        """Queue a stream message; cancellable, but no scheduler trip per message."""
        self._queue.append((to, msg, session_id))
        self._ready.set()
        if len(self._queue) >= OUTBOX_MAX:
            await self.flush()
        else:
            await trio.lowlevel.checkpoint_if_cancelled()

    def put_nowait(self, to: str, msg: Message, *, session_id: str | None = None) -> None:
        """Queue a stream message from synchronous code."""
        self._queue.append((to, msg, session_id))
        self._ready.set()

    async def flush(self) -> None:
        """Send everything queued, in order, batched per (recipient, session)."""
        async with self._flushing:
            while self._queue:
                batch, self._queue = self._queue, []
                start = 0
                for i in range(1, len(batch) + 1):
                    if i == len(batch) or batch[i][0::2] != batch[start][0::2]:
                        to, _, session_id = batch[start]
                        msgs = [msg for _, msg, _ in batch[start:i]]
                        if self._pack is not None:
                            msgs = self._pack(to, msgs)
                        await self.peer.cast_many(to, msgs, session_id=session_id)
                        start = i

    async def run(self) -> None:
        """Send queued messages whenever there are some, until cancelled."""
        while True:
            await self._ready.wait()
            self._ready = trio.Event()
            await self.flush()
