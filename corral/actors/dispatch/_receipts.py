"""Who has which published event: what dispatch learns once every receiver of an event has it.

Two things wait on that. A *tracked* event (a runner event saved in its session's record
before it is sent) leaves the record once every receiver has it (``on_delivered``). A worker
event may be forgotten by its worker once every receiver has it and every event before it
(``on_sent``): until then the worker holds it, to send again to a dispatch that died holding
it. The receivers are the subscribers (the gateway) and the journal, each of which takes a
session's events in order, so the events all of them have are a prefix of the session's, and
its top is the worker sequence number ``on_sent`` hears.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

#: An event by (session id, seq in the session's stream).
Key = tuple[str, int]


class Receipts:
    """Receivers still owed each tracked and each worker event, and what that tells."""

    def __init__(self) -> None:
        #: Told ``(session_id, seq)`` of a tracked event once every receiver has it.
        self.on_delivered: Callable[[str, int], None] | None = None
        #: Told ``(session_id, k)`` once every receiver has the session's worker events up
        #: to sequence number ``k`` (one call per session and round).
        self.on_sent: Callable[[str, int], None] | None = None
        self._tracked: dict[Key, int] = {}
        #: Worker events: their worker sequence number and the receivers that lack them.
        self._worker: dict[Key, tuple[int, int]] = {}
        #: Per session, the highest worker sequence number every receiver has, not yet told.
        self._confirmable: dict[str, int] = {}

    def expect(self, key: Key, receivers: int, *, track: bool, k: int | None) -> None:
        """``key`` is on its way to ``receivers`` receivers (tracked, or a worker's ``k``)."""
        if track:
            if receivers:
                self._tracked[key] = receivers
            elif self.on_delivered is not None:
                self.on_delivered(*key)
        if k is not None and receivers:
            self._worker[key] = (k, receivers)

    def received(self, keys: Iterable[Key]) -> None:
        """One more receiver has each of ``keys``."""
        if not (self._tracked or self._worker):
            return
        for key in keys:
            left = self._tracked.get(key)
            if left is not None:
                if left > 1:
                    self._tracked[key] = left - 1
                else:
                    del self._tracked[key]
                    if self.on_delivered is not None:
                        self.on_delivered(*key)
            entry = self._worker.get(key)
            if entry is None:
                continue
            k, left = entry
            if left > 1:
                self._worker[key] = (k, left - 1)
                continue
            del self._worker[key]
            top = self._confirmable.get(key[0])
            if top is None or k > top:
                self._confirmable[key[0]] = k

    def lost(self, keys: Iterable[Key]) -> None:
        """A receiver may not have ``keys``: stop counting them. A tracked event stays in its
        record, which the next incarnation sends again; a worker's stays with its worker."""
        for key in keys:
            self._tracked.pop(key, None)
            self._worker.pop(key, None)

    def tell_sent(self, failed: Iterable[str] = ()) -> None:
        """Tell ``on_sent`` each session's new confirmable top, but not a session some of
        whose events may not have gone this round (its worker keeps them)."""
        ready, self._confirmable = self._confirmable, {}
        if self.on_sent is None:
            return
        skip = set(failed)
        for session_id, k in ready.items():
            if session_id not in skip:
                self.on_sent(session_id, k)
