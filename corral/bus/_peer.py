"""The peer side of the bus: what every actor and harness worker uses to talk.

A :class:`Peer` owns one DEALER socket whose identity is the peer's address. It announces
itself with :class:`~corral.bus.Hello` (a fresh incarnation id per process), keeps the broker
informed with heartbeats whenever it has been otherwise silent for an interval, and sends:
casts (stream, or durable once the broker has them), calls (a :class:`~corral.bus.Request`
whose reply is decoded against the type it declares), replies, acks and parks. What it
receives is the job of :mod:`corral.bus._receive`; who waits for what, of
:mod:`corral.bus._waiters`; bundling a run of stream casts, of :mod:`corral.bus._bundle`.

A peer decodes only what it declares: ``accepts`` (a message union, e.g. an actor's
``Inbound``) for what arrives unasked, and each request's reply type for its answer.

Typical use::

    async with open_peer("dispatch", endpoint, accepts=Inbound) as peer:
        reply = await peer.call("journal", JournalSummary(...))    # a JournalSummaryReply
        await peer.cast("gateway", Event(...))                     # stream: fire and forget
        await peer.cast("harness", Turn(...), durable=True)        # returns once durable
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, cast

import trio
import zmq

from .._exceptions import BusClosed, CallTimeout, MessageTooLarge, ProtocolError, UnexpectedReply
from ..config import BusSettings, LivenessSettings
from ._bundle import runs
from ._codec import (
    BodyDecoder,
    decode_envelope,
    encode_body,
    encode_envelope,
    reply_decoder,
    reply_type,
)
from ._inbox import InboxQueue, Incoming
from ._messages import (
    BROKER,
    Ack,
    Bundle,
    Durability,
    Envelope,
    ErrorReply,
    Heartbeat,
    Hello,
    Hold,
    ListParked,
    Message,
    Nack,
    Park,
    R,
    Request,
    Unpark,
    new_id,
    now,
    tag_of,
)
from ._receive import _BUS, Receiving
from ._socket import Socket, configure
from ._waiters import Waiter, Waiters, error_from

log = logging.getLogger("corral.bus.peer")


class Peer(Receiving):
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
        heartbeat: bool = True,
        accepts: object = (),
    ) -> None:
        self.name = name
        #: Whether this peer heartbeats the broker when otherwise silent. A harness worker
        #: does not: its WorkerAlive to the harness actor every interval is its one
        #: heartbeat, and the broker sees that traffic pass too.
        self.heartbeat = heartbeat
        self.endpoint = endpoint
        self.bus = bus
        self.liveness = liveness
        self.incarnation = os.urandom(6).hex()
        self._ctx = ctx or zmq.Context()
        self._own_ctx = ctx is None
        self._socket: Socket | None = None
        #: What this peer decodes of what arrives unasked (see :func:`open_peer`).
        self.inbound = BodyDecoder(accepts)
        self._waiters = Waiters()
        self._acks: list[str] = []
        self._acks_wanted = trio.Event()
        self._last_send = 0.0
        #: Messages for the owner, in arrival order.
        self.inbox: InboxQueue[Incoming] = InboxQueue(inbox_size)
        self._unreachable_logged: dict[str, float] = {}
        self._drops_logged = 0.0
        self._stalled_at = -1
        self.stats = {"sent": 0, "received": 0, "errors": 0, "dropped": 0, "late_replies": 0}

    def traffic(self) -> int:
        """Messages sent, received and taken from the inbox so far: what
        :func:`corral._heap.release_when_quiet` watches for the end of a burst (taken too:
        the owner may work through a backlog long after the last one arrived)."""
        return self.stats["sent"] + self.stats["received"] + self.inbox.taken

    # --- sending ---------------------------------------------------------------------------

    def _envelope(
        self,
        to: str,
        msg: Message,
        *,
        durability: Durability = "stream",
        session_id: str | None = None,
        correlation_id: str | None = None,
        wants_reply: bool = False,
    ) -> tuple[Envelope, bytes]:
        """``msg`` to ``to`` in an envelope, and its frame: by default a stream message that
        is no reply and wants none.

        Raises:
            MessageTooLarge: the frame is over ``bus.max_message_bytes``; nothing was sent.
        """
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
        env, frame = self._envelope(to, msg, session_id=session_id, correlation_id=correlation_id)
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
        env, frame = self._envelope(
            to, msg, durability="durable" if durable else "stream", session_id=session_id
        )
        if not durable:
            await self._send(frame)
            return env.id
        deadline = timeout if timeout is not None else self.bus.request_timeout_s
        with self._waiters.expect([env.id], acceptance=True) as (waiter,):
            with trio.move_on_after(deadline):
                await self._send(frame)
                await waiter.event.wait()
                _refused(waiter)
                return env.id
        raise CallTimeout(f"no reply from {env.recipient!r} to {env.type} within {deadline}s")

    async def cast_many(
        self,
        to: str,
        msgs: Sequence[Message],
        *,
        durable: bool = False,
        session_id: str | None = None,
        session_ids: Sequence[str | None] | None = None,
        timeout: float | None = None,
    ) -> list[str]:
        """Send several messages with one checkpoint (the fast path); returns their ids.

        Stream messages go as :class:`~corral.bus.Bundle` frames. Durable messages are all
        in flight at once and the call returns when every one is durable; the broker
        acknowledges a whole group commit in one message. ``session_ids``, one per message,
        names each message's session where they differ (else ``session_id`` names all).
        """
        durability: Durability = "durable" if durable else "stream"
        if session_ids is None:
            session_ids = [session_id] * len(msgs)
        elif len(session_ids) != len(msgs):
            raise ValueError(f"{len(session_ids)} session ids for {len(msgs)} messages")
        envs = [
            self._envelope(to, msg, durability=durability, session_id=sid)
            for msg, sid in zip(msgs, session_ids, strict=True)
        ]
        ids = [env.id for env, _ in envs]
        if not durable:
            frames = [frame for _, frame in envs]
            if len(frames) > 1:
                frames = [
                    self._bundle(to, run, session_id)
                    for run in runs(frames, self.bus.max_message_bytes)
                ]
            await self._sock().send_many([[frame] for frame in frames])
            self._last_send = time.monotonic()
            self.stats["sent"] += len(envs)
            return ids
        deadline = timeout if timeout is not None else self.bus.request_timeout_s
        with self._waiters.expect(ids, acceptance=True) as waiters:
            with trio.move_on_after(deadline):
                await self._sock().send_many([[frame] for _, frame in envs])
                self._last_send = time.monotonic()
                self.stats["sent"] += len(envs)
                for waiter in waiters:
                    await waiter.event.wait()
                    _refused(waiter)
                return ids
        raise CallTimeout(f"{len(ids)} durable messages to {to!r} not accepted in {deadline}s")

    def _bundle(self, to: str, run: list[bytes], session_id: str | None) -> bytes:
        if len(run) == 1:
            return run[0]
        _, frame = self._envelope(to, Bundle(frames=run), session_id=session_id)
        return frame

    async def call(
        self,
        to: str,
        msg: Request[R],
        *,
        timeout: float | None = None,
        durable: bool = False,
        session_id: str | None = None,
    ) -> R:
        """Send a request and wait for its reply, of the type the request declares.

        Raises:
            CallTimeout: no reply within ``timeout`` (default ``bus.request_timeout_s``).
            Unreachable: the recipient is unknown, down or overloaded.
            RemoteError: the recipient (or broker) answered with a typed error.
            UnexpectedReply: the answer is of another type than the request declares.
            ProtocolError: the recipient could not decode the request, or the reply does not
                decode.
        """
        env, frame = self._envelope(
            to,
            msg,
            durability="durable" if durable else "stream",
            session_id=session_id,
            wants_reply=True,
        )
        deadline = timeout if timeout is not None else self.bus.request_timeout_s
        with self._waiters.expect([env.id], acceptance=False) as (waiter,):
            with trio.move_on_after(deadline):
                await self._send_light(frame)
                await waiter.event.wait()
                assert waiter.env is not None
                return cast("R", _reply_of(type(msg), env, waiter.env))
        raise CallTimeout(f"no reply from {env.recipient!r} to {env.type} within {deadline}s")

    async def reply(self, to: Incoming, msg: Message) -> None:
        """Answer a request (a no-op if the sender did not ask for a reply)."""
        if to.env.wants_reply:
            await self._answer(to.env, msg)

    async def _answer(self, env: Envelope, msg: Message) -> None:
        _, frame = self._envelope(env.sender, msg, session_id=env.session_id, correlation_id=env.id)
        await self._send_light(frame)

    async def _send_light(self, frame: bytes) -> None:
        """Send ``frame`` without the scheduler pass a send ends with: for a call, whose wait
        for the reply is one, and for an answer, after which an actor goes back to its inbox
        (which yields at least every ``FAIR_SHARE`` messages): a round trip then takes one
        pass through each side's scheduler fewer. The checkpoint before still lets a
        cancelled caller out."""
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            self._sock().send_nowait([frame])
        except trio.WouldBlock:
            await self._send(frame)
            return
        self._last_send = time.monotonic()
        self.stats["sent"] += 1

    async def _send(self, frame: bytes) -> None:
        await self._sock().send([frame])
        self._last_send = time.monotonic()
        self.stats["sent"] += 1

    async def _control(self, msg: Message) -> None:
        _, frame = self._envelope(BROKER, msg)
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

    async def hold(self, incoming: Incoming) -> None:
        """Say that this peer's own work on a durable message it keeps in flight is done
        (see :class:`~corral.bus.Hold`)."""
        if incoming.env.durability == "durable":
            await self._control(Hold(id=incoming.env.id))

    async def unpark(self, message_id: str, state: str, reason: str | None = None) -> None:
        """Resolve a parked message (``resolved`` or ``cancelled``)."""
        await self._control(Unpark(id=message_id, state=state, reason=reason))

    async def parked(self, timeout: float | None = None) -> list[tuple[Incoming, float]]:
        """This peer's parked messages (decoded) with their ages, e.g. after a restart."""
        reply = await self.call(BROKER, ListParked(), timeout=timeout)
        out = []
        for row in reply.entries:
            env = decode_envelope(row.frame)
            out.append((Incoming(env, self.inbound.decode(env)), row.age_s))
        return out

    async def _ack_loop(self) -> None:
        while True:
            await self._acks_wanted.wait()
            self._acks_wanted = trio.Event()
            await trio.lowlevel.checkpoint()
            ids, self._acks = self._acks, []
            if ids:
                await self._control(Ack(ids=ids))

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
            if self.heartbeat:
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


def _refused(waiter: Waiter) -> None:
    """Raise the broker's refusal of a durable cast (a no-op once it was accepted)."""
    if waiter.env is None:
        return
    msg = _BUS.decode(waiter.env)
    if not isinstance(msg, ErrorReply):
        raise ProtocolError(f"broker answered a durable send with {waiter.env.type!r}")
    raise error_from(msg, waiter.env.sender)


def _reply_of(kind: type[Request[Any]], request: Envelope, reply: Envelope) -> Message:
    """A call's answer, decoded against the reply type its request declares."""
    decoder = reply_decoder(kind)
    if not decoder.knows(reply.type):
        expected = tag_of(reply_type(kind))
        raise UnexpectedReply(
            f"{reply.sender!r} answered {request.type!r} with {reply.type!r}, not {expected!r}"
        )
    msg = decoder.decode(reply)
    if isinstance(msg, ErrorReply):
        raise error_from(msg, reply.sender)
    return msg


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
    """Connect a peer to the broker at ``endpoint`` for the duration of the block.

    ``accepts`` (passed on to :class:`Peer`, like ``inbox_size`` and ``heartbeat``) is what
    the peer decodes of what arrives unasked: a message union, a class, or a tuple of them.
    A peer that only calls and casts declares nothing; replies are decoded per request.
    """
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
