"""A peer's receive side: frames from the broker to waiting callers or to the inbox.

Each envelope goes one of three ways, decided from its header alone:

* an :class:`~corral.bus.Accepted` wakes the durable casts it names;
* an envelope with a correlation id answers a call: it goes, still encoded, to the caller
  waiting for it, who decodes it against the reply type its request declares
  (:mod:`corral.bus._waiters`); one nobody waits for any more is dropped (an error is
  logged);
* anything else is decoded against the peer's inbound union (``accepts``) and queued in the
  inbox. A body that does not decode — a tag outside the union, a bad field — is rejected
  (the broker dead-letters it) and a sender waiting for a reply gets ``protocol_error``.

Backpressure without deadlock. Past ``inbox_size`` queued messages the loop stops reading,
so a flood backs up into the broker (whose per-peer backlog is bounded too) — unless the
owner has taken nothing from the full inbox for 0.1 s while something awaits a reply or an
acceptance: what it awaits may be queued behind the flood, so the loop reads on until the
owner takes a message again. Past four times ``inbox_size`` (a flood *and* a stalled owner)
a *stream* message is dropped and counted, and a sender that asked for a reply gets an
``unreachable`` error, as when the broker's backlog for a peer is full. Durable messages are
never dropped; the broker's in-flight window bounds them.
"""

from __future__ import annotations

import logging
import time

import trio

from .._exceptions import BusClosed, ProtocolError
from ._codec import BodyDecoder, decode_envelope
from ._inbox import InboxQueue, Incoming
from ._messages import Accepted, Bundle, Envelope, ErrorReply, Message, Reject, tag_of
from ._socket import Socket
from ._waiters import Waiters

log = logging.getLogger("corral.bus.peer")

_ACCEPTED_TAG = tag_of(Accepted)
_BUNDLE_TAG = tag_of(Bundle)
_ERROR_TAG = tag_of(ErrorReply)
#: The bus's own messages a peer reads whatever it declares.
_BUS = BodyDecoder(Accepted, Bundle, ErrorReply)

#: Multiple of ``inbox_size`` past which stream messages are dropped while the owner waits.
_HARD_LIMIT = 4
#: Seconds without a message taken from a full inbox after which the owner counts as stalled.
_STALL_S = 0.1


class Receiving:
    """The receive loop of :class:`~corral.bus.Peer` (which sets these attributes)."""

    name: str
    stats: dict[str, int]
    inbox: InboxQueue[Incoming]
    #: Decodes what may arrive unasked: the owner's declared inbound union.
    inbound: BodyDecoder
    _waiters: Waiters
    _stalled_at: int
    _drops_logged: float
    _unreachable_logged: dict[str, float]

    def _sock(self) -> Socket:
        raise NotImplementedError

    async def _control(self, msg: Message) -> None:
        raise NotImplementedError

    async def _answer(self, env: Envelope, msg: Message) -> None:
        raise NotImplementedError

    async def _receive_loop(self) -> None:
        sock = self._sock()
        while True:
            try:
                batch = await sock.receive_batch(256)
            except BusClosed:
                return
            for frames in batch:
                await self._on_frames(frames)

    async def _on_frames(self, frames: list[bytes]) -> None:
        if len(frames) != 1:
            self.stats["received"] += 1
            log.warning("%s: dropped a %d-frame message from the broker", self.name, len(frames))
            return
        try:
            env = decode_envelope(frames[0])
        except ProtocolError as exc:
            self.stats["received"] += 1
            log.warning("%s: undecodable frame from the broker: %s", self.name, exc)
            return
        if env.type != _BUNDLE_TAG:
            await self._on_envelope(env)
            return
        try:
            bundle = _BUS.decode(env)
            assert isinstance(bundle, Bundle)
            inner = [decode_envelope(frame) for frame in bundle.frames]
        except ProtocolError as exc:
            self.stats["received"] += 1
            log.warning("%s: undecodable bundle from %s: %s", self.name, env.sender, exc)
            return
        for item in inner:
            if item.sender != env.sender or item.durability != "stream":
                self.stats["received"] += 1
                log.warning(
                    "%s: a bundle from %s holds a message from %r (%s); dropped",
                    self.name,
                    env.sender,
                    item.sender,
                    item.durability,
                )
                continue
            await self._on_envelope(item)

    async def _on_envelope(self, env: Envelope) -> None:
        self.stats["received"] += 1
        if env.type == _ACCEPTED_TAG:
            try:
                accepted = _BUS.decode(env)
            except ProtocolError as exc:
                log.warning("%s: undecodable acceptance: %s", self.name, exc)
                return
            assert isinstance(accepted, Accepted)
            self._waiters.accepted(accepted.ids)
            return
        if env.correlation_id is not None:
            if self._waiters.answered(env):
                return
            if env.type == _ERROR_TAG:
                self._log_error(env)
                return
            # A reply whose caller gave up (timed out, or was cancelled): nobody waits for
            # it, and the owner has no handler for it.
            self.stats["late_replies"] += 1
            log.debug("%s: late reply to %s dropped", self.name, env.correlation_id)
            return
        try:
            msg = self.inbound.decode(env)
        except ProtocolError as exc:
            self.stats["errors"] += 1
            log.warning("%s: rejecting %s from %s: %s", self.name, env.id, env.sender, exc)
            await self._control(Reject(id=env.id, error=str(exc), message_type=env.type))
            if env.wants_reply:
                # The caller is waiting: tell it now rather than let it time out.
                await self._answer(env, ErrorReply(code="protocol_error", message=str(exc)))
            return
        if env.durability == "stream" and len(self.inbox) >= _HARD_LIMIT * self.inbox.limit:
            await self._refuse(env)
            return
        self.inbox.put(Incoming(env, msg))
        if len(self.inbox) >= self.inbox.limit:
            await self._wait_room()

    async def _wait_room(self) -> None:
        """Backpressure: stop reading while the inbox is full — unless its owner has taken
        nothing for a while and awaits a reply, which may be queued behind the flood; then
        read on until it takes a message again."""
        while len(self.inbox) >= self.inbox.limit:
            if len(self._waiters) and self._stalled_at == self.inbox.taken:
                return
            taken = self.inbox.taken
            with trio.move_on_after(_STALL_S):
                await self.inbox.wait_room()
            if self.inbox.taken == taken:
                self._stalled_at = taken

    async def _refuse(self, env: Envelope) -> None:
        """Drop a stream message the full inbox cannot take, and say so."""
        self.stats["dropped"] += 1
        t = time.monotonic()
        if t - self._drops_logged > 5:
            self._drops_logged = t
            log.warning(
                "%s: inbox full (%d queued); dropping stream messages (%d so far)",
                self.name,
                len(self.inbox),
                self.stats["dropped"],
            )
        if env.wants_reply:
            message = f"peer {self.name!r} is overloaded"
            await self._answer(env, ErrorReply(code="unreachable", message=message))

    def _log_error(self, env: Envelope) -> None:
        """An error answering a message nobody waits for: logged, at most every 5 s each."""
        try:
            msg = _BUS.decode(env)
        except ProtocolError as exc:
            log.warning("%s: undecodable error reply: %s", self.name, exc)
            return
        assert isinstance(msg, ErrorReply)
        key = msg.code + ":" + msg.message
        last = self._unreachable_logged.get(key, 0.0)
        t = time.monotonic()
        if t - last > 5.0:
            self._unreachable_logged[key] = t
            log.warning(
                "%s: message %s failed: %s: %s",
                self.name,
                env.correlation_id,
                msg.code,
                msg.message,
            )
