"""The callers a peer's receive loop wakes: who waits for which reply or acceptance.

A :meth:`~corral.bus.Peer.call` waits for the envelope that answers it (its correlation id is
the request's id); a durable :meth:`~corral.bus.Peer.cast` waits for the broker's
:class:`~corral.bus.Accepted` naming it, or for the broker's error answering it. The receive
loop hands the envelope over undecoded: the caller decodes it against the reply type its
request declares, so a reply of another type fails the call that asked, and only that call.

The broker delivers a durable request while its commit runs, so a reply can arrive before
the acceptance of its request; a call's waiter ignores acceptances, so the reply is never
overwritten.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import trio

from .._exceptions import BusError, MessageTooLarge, ProtocolError, RemoteError, Unreachable
from ._messages import Envelope, ErrorReply


class Waiter:
    """One caller's wait: for a reply (a call) or for an acceptance (a durable cast)."""

    __slots__ = ("acceptance", "accepted", "env", "event")

    def __init__(self, *, acceptance: bool) -> None:
        self.event = trio.Event()
        #: Whether an :class:`~corral.bus.Accepted` ends this wait (durable casts only).
        self.acceptance = acceptance
        self.accepted = False
        #: The envelope that answered, still encoded; None after an acceptance.
        self.env: Envelope | None = None


class Waiters:
    """The waits of one peer, by the id of the message each waits on."""

    def __init__(self) -> None:
        self._by_id: dict[str, Waiter] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, message_id: str) -> bool:
        return message_id in self._by_id

    @contextmanager
    def expect(self, ids: Iterable[str], *, acceptance: bool) -> Iterator[list[Waiter]]:
        """Wait on ``ids`` for the duration of the block (a wait outlives no caller)."""
        ids = list(ids)
        waiters = [self._by_id.setdefault(mid, Waiter(acceptance=acceptance)) for mid in ids]
        try:
            yield waiters
        finally:
            for mid in ids:
                self._by_id.pop(mid, None)

    def accepted(self, ids: Iterable[str]) -> None:
        """The broker made ``ids`` durable: wake the durable casts waiting on them."""
        for mid in ids:
            waiter = self._by_id.get(mid)
            if waiter is not None and waiter.acceptance and not waiter.event.is_set():
                waiter.accepted = True
                waiter.event.set()

    def answered(self, env: Envelope) -> bool:
        """Hand ``env`` to the caller its correlation id names; False if nobody waits."""
        waiter = self._by_id.get(env.correlation_id or "")
        if waiter is None or waiter.event.is_set():
            return False
        waiter.env = env
        waiter.event.set()
        return True


def error_from(msg: ErrorReply, sender: str) -> BusError:
    """The typed error an :class:`~corral.bus.ErrorReply` stands for."""
    if msg.code == "unreachable":
        return Unreachable(msg.message)
    if msg.code == "too_large":
        return MessageTooLarge(msg.message)
    if msg.code == "protocol_error":
        return ProtocolError(msg.message)
    return RemoteError(msg.message, code=msg.code, sender=sender)
