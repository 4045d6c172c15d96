"""A peer's inbox: the messages its owner has yet to take, in arrival order, as
:class:`Incoming` (the decoded payload with its envelope).

Not a trio memory channel, for two reasons. The peer's receive loop decides for itself when
to wait for room (see :class:`~corral.bus.Peer`): it must keep reading while its owner awaits
a reply, or the reply would sit behind the very messages the owner is not consuming. And a
consumer that finds messages waiting should take them without a trip through the scheduler
each; a memory channel yields on every receive, which at tens of thousands of messages a
second was most of a busy actor's CPU. Here a receive yields only when the inbox is empty and
once every :data:`FAIR_SHARE` messages, so the owner's other tasks still run during a flood.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

import trio

from ._messages import Envelope, Message

T = TypeVar("T")

#: Messages a consumer takes in a row before it yields to the owner's other tasks.
FAIR_SHARE = 64


class Incoming:
    """A received message: the decoded payload and its envelope."""

    __slots__ = ("env", "msg")

    def __init__(self, env: Envelope, msg: Message) -> None:
        self.env = env
        self.msg = msg

    def __repr__(self) -> str:
        return f"Incoming({self.env.type} from {self.env.sender}, id={self.env.id})"


class InboxQueue(Generic[T]):
    """A FIFO with an async receive. :meth:`put` never blocks; a producer that wants to
    respect ``limit`` awaits :meth:`wait_room` after it."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._items: deque[T] = deque()
        self._nonempty = trio.Event()
        self._room = trio.Event()
        self._streak = 0
        #: Messages taken so far (a producer tells a stalled consumer from a busy one).
        self.taken = 0

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: T) -> None:
        """Queue ``item``."""
        self._items.append(item)
        self._nonempty.set()

    def receive_nowait(self) -> T:
        """The oldest message, or :class:`trio.WouldBlock` if there is none."""
        if not self._items:
            raise trio.WouldBlock
        return self._take()

    async def receive(self) -> T:
        """The oldest message, waiting for one if needed (cancellable: nothing is lost)."""
        if self._items and self._streak < FAIR_SHARE:
            self._streak += 1
            await trio.lowlevel.checkpoint_if_cancelled()
            return self._take()
        self._streak = 0
        if self._items:
            await trio.lowlevel.checkpoint()  # a full streak: the owner's other tasks go first
        while not self._items:
            self._nonempty = trio.Event()
            await self._nonempty.wait()
        return self._take()

    async def wait_room(self) -> None:
        """Return once fewer than ``limit`` messages are queued."""
        while len(self._items) >= self.limit:
            self._room = trio.Event()
            await self._room.wait()

    def _take(self) -> T:
        self.taken += 1
        item = self._items.popleft()
        if len(self._items) < self.limit:
            self._room.set()
        return item

    def __aiter__(self) -> InboxQueue[T]:
        return self

    async def __anext__(self) -> T:
        return await self.receive()
