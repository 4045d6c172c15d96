"""The peer side of the bus: what every actor and harness worker uses to talk.

A :class:`Peer` owns one DEALER socket whose identity is the peer's address. It announces
itself with :class:`~corral.bus.Hello` (a fresh incarnation id per process), keeps the broker
informed with heartbeats whenever it has been otherwise silent for an interval, matches
replies to requests by correlation id, and hands every other message to :attr:`Peer.inbox`.

Backpressure without deadlock. Past ``inbox_size`` queued messages the receive loop stops
reading, so a flood backs up into the broker (whose per-peer backlog is bounded too) — unless
the owner has taken nothing from the full inbox for 0.1 s while something awaits a reply or
an acceptance: what it awaits may be queued behind the flood, so the loop reads on until the
owner takes a message again. Past four times ``inbox_size`` (a flood *and* a stalled owner)
a *stream* message is dropped and counted, and a sender that asked for a reply gets an
``unreachable`` error, as when the broker's backlog for a peer is full. Durable messages are
never dropped; the broker's in-flight window bounds them.

Typical use::

    async with open_peer("dispatch", endpoint) as peer:
        reply = await peer.call("journal", Summary(...))
        await peer.cast("gateway", Event(...))                 # stream: fire and forget
        await peer.cast("harness", Turn(...), durable=True)    # returns once durable
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio
import zmq

from .._exceptions import (
    BusClosed,
    BusError,
    CallTimeout,
    MessageTooLarge,
    ProtocolError,
    RemoteError,
    Unreachable,
)
from ..config import BusSettings, LivenessSettings
from ._codec import BodyDecoder, decode_envelope, encode_body, encode_envelope
from ._inbox import InboxQueue
from ._messages import (
    BROKER,
    Accepted,
    Ack,
    Bundle,
    Durability,
    Envelope,
    ErrorReply,
    Heartbeat,
    Hello,
    ListParked,
    Message,
    Nack,
    Park,
    ParkedEntries,
    Reject,
    Unpark,
    new_id,
    now,
    tag_of,
)
from ._socket import Socket, configure

log = logging.getLogger("corral.bus.peer")

_BUNDLE_TAG = tag_of(Bundle)

#: Multiple of ``inbox_size`` past which stream messages are dropped while the owner waits.
_HARD_LIMIT = 4
#: Seconds without a message taken from a full inbox after which the owner counts as stalled.
_STALL_S = 0.1
#: Messages in one :class:`~corral.bus.Bundle` at most.
BUNDLE_MAX = 512
#: Bytes a bundle's envelope and each item's msgpack header add, at most.
_BUNDLE_OVERHEAD = 512
_ITEM_OVERHEAD = 5


class Incoming:
    """A received message: the decoded payload and its envelope."""

    __slots__ = ("deferred", "env", "msg")

    def __init__(self, env: Envelope, msg: Message) -> None:
        self.env = env
        self.msg = msg
        #: Set by a handler that will ack (or park) this message itself, later.
        self.deferred = False

    def __repr__(self) -> str:
        return f"Incoming({self.env.type} from {self.env.sender}, id={self.env.id})"


class _Waiter:
    __slots__ = ("event", "result")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.result: Incoming | None = None


class Peer:
    """One process's connection to the bus. Use :func:`open_peer` to create one."""

    def __init__(
        self,
        name: str,
        endpoint: str,
        *,
        bus: BusSettings,
        liveness: LivenessSettings,
        ctx: zmq.SyncContext | None = None,
        inbox_size: int = 10_000,
    ) -> None:
        self.name = name
        self.endpoint = endpoint
        self.bus = bus
        self.liveness = liveness
        self.incarnation = os.urandom(6).hex()
        self._ctx = ctx or zmq.Context()
        self._own_ctx = ctx is None
        self._socket: Socket | None = None
        self._bodies = BodyDecoder()
        self._waiters: dict[str, _Waiter] = {}
        self._acks: list[str] = []
        self._acks_wanted = trio.Event()
        self._last_send = 0.0
        #: Messages for the owner, in arrival order.
        self.inbox: InboxQueue[Incoming] = InboxQueue(inbox_size)
        self._unreachable_logged: dict[str, float] = {}
        self._drops_logged = 0.0
        self._stalled_at = -1
        self.stats = {"sent": 0, "received": 0, "errors": 0, "dropped": 0, "late_replies": 0}

    # --- sending ---------------------------------------------------------------------------

    def _envelope(
        self,
        to: str,
        msg: Message,
        *,
        durability: Durability,
        session_id: str | None,
        correlation_id: str | None,
        wants_reply: bool,
    ) -> tuple[Envelope, bytes]:
        env = Envelope(
            id=new_id(),
            sender=self.name,
            recipient=to,
            type=tag_of(type(msg)),
            body=encode_body(msg),
            durability=durability,
            correlation_id=correlation_id,
            session_id=session_id,
            created_at=now(),
            wants_reply=wants_reply,
        )
        frame = encode_envelope(env)
        if len(frame) > self.bus.max_message_bytes:
            raise MessageTooLarge(
                f"{env.type} to {to!r} is {len(frame)} bytes; the limit is "
                f"{self.bus.max_message_bytes}"
            )
        return env, frame

    def _sock(self) -> Socket:
        if self._socket is None:
            raise BusClosed(f"peer {self.name!r} is not connected")
        return self._socket

    def send_nowait(
        self,
        to: str,
        msg: Message,
        *,
        session_id: str | None = None,
        correlation_id: str | None = None,
    ) -> str:
        """Send a stream message now or raise :class:`trio.WouldBlock`; returns its id."""
        env, frame = self._envelope(
            to,
            msg,
            durability="stream",
            session_id=session_id,
            correlation_id=correlation_id,
            wants_reply=False,
        )
        self._sock().send_nowait([frame])
        self._last_send = time.monotonic()
        self.stats["sent"] += 1
        return env.id

    async def cast(
        self,
        to: str,
        msg: Message,
        *,
        durable: bool = False,
        session_id: str | None = None,
        timeout: float | None = None,
    ) -> str:
        """Send a message that expects no reply; returns its id.

        A stream cast returns once handed to ZeroMQ. A durable cast returns once the broker
        has made it durable, and raises if the broker refused it.
        """
        if not durable:
            env, frame = self._envelope(
                to,
                msg,
                durability="stream",
                session_id=session_id,
                correlation_id=None,
                wants_reply=False,
            )
            await self._send(frame)
            return env.id
        env, frame = self._envelope(
            to,
            msg,
            durability="durable",
            session_id=session_id,
            correlation_id=None,
            wants_reply=False,
        )
        reply = await self._roundtrip(env, frame, timeout)
        if not isinstance(reply.msg, Accepted):
            raise ProtocolError(f"broker answered a durable send with {reply.env.type!r}")
        return env.id

    async def cast_many(
        self,
        to: str,
        msgs: Sequence[Message],
        *,
        durable: bool = False,
        session_id: str | None = None,
        timeout: float | None = None,
    ) -> list[str]:
        """Send several messages with one checkpoint (the fast path); returns their ids.

        Durable messages are all in flight at once and the call returns when every one is
        durable; the broker acknowledges a whole group commit in one message.
        """
        durability: Durability = "durable" if durable else "stream"
        envs = [
            self._envelope(
                to,
                msg,
                durability=durability,
                session_id=session_id,
                correlation_id=None,
                wants_reply=False,
            )
            for msg in msgs
        ]
        ids = [env.id for env, _ in envs]
        if not durable:
            frames = [frame for _, frame in envs]
            if len(frames) > 1:
                frames = self._bundles(to, frames, session_id)
            await self._sock().send_many([[frame] for frame in frames])
            self._last_send = time.monotonic()
            self.stats["sent"] += len(envs)
            return ids
        waiters = [self._waiters.setdefault(mid, _Waiter()) for mid in ids]
        deadline = timeout if timeout is not None else self.bus.request_timeout_s
        try:
            with trio.move_on_after(deadline):
                await self._sock().send_many([[frame] for _, frame in envs])
                self._last_send = time.monotonic()
                self.stats["sent"] += len(envs)
                for waiter in waiters:
                    await waiter.event.wait()
                    assert waiter.result is not None
                    if isinstance(waiter.result.msg, ErrorReply):
                        raise _error_from(waiter.result)
                return ids
            raise CallTimeout(f"{len(ids)} durable messages to {to!r} not accepted in {deadline}s")
        finally:
            for mid in ids:
                self._waiters.pop(mid, None)

    def _bundles(self, to: str, frames: list[bytes], session_id: str | None) -> list[bytes]:
        """Pack consecutive frames into :class:`Bundle` frames within the size limit."""
        limit = self.bus.max_message_bytes - _BUNDLE_OVERHEAD
        out: list[bytes] = []
        run: list[bytes] = []
        size = 0
        for frame in frames:
            if run and (size + len(frame) + _ITEM_OVERHEAD > limit or len(run) >= BUNDLE_MAX):
                out.append(self._bundle(to, run, session_id))
                run, size = [], 0
            run.append(frame)
            size += len(frame) + _ITEM_OVERHEAD
        if run:
            out.append(self._bundle(to, run, session_id))
        return out

    def _bundle(self, to: str, run: list[bytes], session_id: str | None) -> bytes:
        if len(run) == 1:
            return run[0]
        _, frame = self._envelope(
            to,
            Bundle(frames=run),
            durability="stream",
            session_id=session_id,
            correlation_id=None,
            wants_reply=False,
        )
        return frame

    async def call(
        self,
        to: str,
        msg: Message,
        *,
        timeout: float | None = None,
        durable: bool = False,
        session_id: str | None = None,
    ) -> Message:
        """Send a request and wait for its reply payload.

        Raises:
            CallTimeout: no reply within ``timeout`` (default ``bus.request_timeout_s``).
            Unreachable: the recipient is unknown, down or overloaded.
            RemoteError: the recipient (or broker) answered with a typed error.
        """
        env, frame = self._envelope(
            to,
            msg,
            durability="durable" if durable else "stream",
            session_id=session_id,
            correlation_id=None,
            wants_reply=True,
        )
        reply = await self._roundtrip(env, frame, timeout, skip_accepted=durable)
        return reply.msg

    async def _roundtrip(
        self, env: Envelope, frame: bytes, timeout: float | None, *, skip_accepted: bool = False
    ) -> Incoming:
        waiter = self._waiters[env.id] = _Waiter()
        deadline = timeout if timeout is not None else self.bus.request_timeout_s
        try:
            with trio.move_on_after(deadline):
                await self._send(frame)
                while True:
                    await waiter.event.wait()
                    reply = waiter.result
                    assert reply is not None
                    if isinstance(reply.msg, ErrorReply):
                        raise _error_from(reply)
                    if skip_accepted and isinstance(reply.msg, Accepted):
                        waiter.result = None
                        waiter.event = trio.Event()
                        continue
                    return reply
            raise CallTimeout(f"no reply from {env.recipient!r} to {env.type} within {deadline}s")
        finally:
            del self._waiters[env.id]

    async def reply(self, to: Incoming, msg: Message) -> None:
        """Answer a request (a no-op if the sender did not ask for a reply)."""
        if not to.env.wants_reply:
            return
        _, frame = self._envelope(
            to.env.sender,
            msg,
            durability="stream",
            session_id=to.env.session_id,
            correlation_id=to.env.id,
            wants_reply=False,
        )
        await self._send(frame)

    async def _send(self, frame: bytes) -> None:
        await self._sock().send([frame])
        self._last_send = time.monotonic()
        self.stats["sent"] += 1

    async def _control(self, msg: Message) -> None:
        _, frame = self._envelope(
            BROKER,
            msg,
            durability="stream",
            session_id=None,
            correlation_id=None,
            wants_reply=False,
        )
        await self._send(frame)

    # --- acknowledging ---------------------------------------------------------------------

    def ack(self, incoming: Incoming) -> None:
        """Mark a durable message handled (sent to the broker in batches)."""
        if incoming.env.durability == "durable":
            self._acks.append(incoming.env.id)
            self._acks_wanted.set()

    async def nack(self, incoming: Incoming, error: str) -> None:
        """Report that handling a durable message failed; the broker will retry it."""
        if incoming.env.durability == "durable":
            await self._control(Nack(id=incoming.env.id, error=error))

    async def park(self, incoming: Incoming) -> None:
        """Park a durable message this peer holds: it waits, durably, for :meth:`unpark`."""
        await self._control(Park(id=incoming.env.id))

    async def unpark(self, message_id: str, state: str, reason: str | None = None) -> None:
        """Resolve a parked message (``resolved`` or ``cancelled``)."""
        await self._control(Unpark(id=message_id, state=state, reason=reason))

    async def parked(self, timeout: float | None = None) -> list[tuple[Incoming, float]]:
        """This peer's parked messages (decoded) with their ages, e.g. after a restart."""
        reply = await self.call(BROKER, ListParked(), timeout=timeout)
        assert isinstance(reply, ParkedEntries)
        out = []
        for row in reply.entries:
            env = decode_envelope(row.frame)
            out.append((Incoming(env, self._bodies.decode(env)), row.age_s))
        return out

    async def _ack_loop(self) -> None:
        while True:
            await self._acks_wanted.wait()
            self._acks_wanted = trio.Event()
            await trio.lowlevel.checkpoint()
            ids, self._acks = self._acks, []
            if ids:
                await self._control(Ack(ids=ids))

    # --- receiving -------------------------------------------------------------------------

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
            bundle = self._bodies.decode(env)
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
        try:
            msg = self._bodies.decode(env)
        except ProtocolError as exc:
            self.stats["errors"] += 1
            log.warning("%s: rejecting %s from %s: %s", self.name, env.id, env.sender, exc)
            await self._control(Reject(id=env.id, error=str(exc)))
            if env.wants_reply:
                # The caller is waiting: tell it now rather than let it time out.
                _, frame = self._envelope(
                    env.sender,
                    ErrorReply(code="protocol_error", message=str(exc)),
                    durability="stream",
                    session_id=env.session_id,
                    correlation_id=env.id,
                    wants_reply=False,
                )
                await self._send(frame)
            return
        incoming = Incoming(env, msg)
        if isinstance(msg, Accepted):
            for mid in msg.ids:
                waiter = self._waiters.get(mid)
                # The broker delivers a durable request while its commit runs, so the
                # reply can arrive before the acceptance; it must not be overwritten.
                if waiter is not None and waiter.result is None:
                    waiter.result = incoming
                    waiter.event.set()
            return
        if env.correlation_id is not None:
            waiter = self._waiters.get(env.correlation_id)
            if waiter is not None:
                waiter.result = incoming
                waiter.event.set()
                return
            if isinstance(msg, ErrorReply):
                self._log_error(env, msg)
                return
            # A reply whose caller gave up (timed out, or was cancelled): nobody waits for
            # it, and the owner has no handler for it.
            self.stats["late_replies"] += 1
            log.debug("%s: late reply to %s dropped", self.name, env.correlation_id)
            return
        if env.durability == "stream" and len(self.inbox) >= _HARD_LIMIT * self.inbox.limit:
            await self._refuse(env)
            return
        self.inbox.put(incoming)
        if len(self.inbox) >= self.inbox.limit:
            await self._wait_room()

    async def _wait_room(self) -> None:
        """Backpressure: stop reading while the inbox is full — unless its owner has taken
        nothing for a while and awaits a reply, which may be queued behind the flood; then
        read on until it takes a message again."""
        while len(self.inbox) >= self.inbox.limit:
            if self._waiters and self._stalled_at == self.inbox.taken:
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
            _, frame = self._envelope(
                env.sender,
                ErrorReply(code="unreachable", message=f"peer {self.name!r} is overloaded"),
                durability="stream",
                session_id=env.session_id,
                correlation_id=env.id,
                wants_reply=False,
            )
            await self._send(frame)

    def _log_error(self, env: Envelope, msg: ErrorReply) -> None:
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

    async def _heartbeat_loop(self) -> None:
        interval = self.liveness.interval_s
        while True:
            idle = time.monotonic() - self._last_send
            if idle >= interval:
                await self._control(Heartbeat())
                idle = 0.0
            await trio.sleep(interval - idle)

    # --- lifecycle -------------------------------------------------------------------------

    async def _run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        sock = self._ctx.socket(zmq.DEALER)
        try:
            configure(sock, hwm=self.bus.hwm, linger_ms=self.bus.linger_ms)
            sock.setsockopt(zmq.IDENTITY, self.name.encode())
            sock.connect(self.endpoint)
        except BaseException:
            sock.close(0)  # else close() would wait forever terminating the context
            raise
        self._socket = Socket(sock)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._receive_loop)
            nursery.start_soon(self._ack_loop)
            await self._greet()
            nursery.start_soon(self._heartbeat_loop)
            task_status.started()

    async def _greet(self) -> None:
        """Say hello, and wait until the broker has taken it: a message sent to this peer by
        anyone once it has started is then routed, never refused as to a peer nobody knows.
        A broker that does not answer (not started yet) is not waited for past the request
        timeout; the hello still reaches it once it binds."""
        hello = Hello(name=self.name, pid=os.getpid(), incarnation=self.incarnation)
        try:
            await self.call(BROKER, hello, timeout=self.bus.request_timeout_s)
        except CallTimeout:
            log.warning("%s: the broker did not answer its hello", self.name)

    async def flush(self) -> None:
        """Send pending acks now (before an orderly stop)."""
        ids, self._acks = self._acks, []
        if ids and self._socket is not None:
            await self._control(Ack(ids=ids))

    def close(self) -> None:
        """Close the socket (and the context, if this peer created it)."""
        if self._socket is not None:
            self._socket.close(self.bus.linger_ms)
            self._socket = None
        if self._own_ctx:
            self._ctx.term()


def _error_from(reply: Incoming) -> BusError:
    msg = reply.msg
    assert isinstance(msg, ErrorReply)
    if msg.code == "unreachable":
        return Unreachable(msg.message)
    if msg.code == "too_large":
        return MessageTooLarge(msg.message)
    if msg.code == "protocol_error":
        return ProtocolError(msg.message)
    return RemoteError(msg.message, code=msg.code, sender=reply.env.sender)


@asynccontextmanager
async def open_peer(
    name: str,
    endpoint: str,
    *,
    bus: BusSettings | None = None,
    liveness: LivenessSettings | None = None,
    ctx: zmq.SyncContext | None = None,
    **kwargs: Any,
) -> AsyncIterator[Peer]:
    """Connect a peer to the broker at ``endpoint`` for the duration of the block."""
    peer = Peer(
        name,
        endpoint,
        bus=bus or BusSettings(),
        liveness=liveness or LivenessSettings(),
        ctx=ctx,
        **kwargs,
    )
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(peer._run)
            try:
                yield peer
            finally:
                with trio.CancelScope(shield=True), trio.move_on_after(1):
                    await peer.flush()
                nursery.cancel_scope.cancel()
    finally:
        peer.close()
