"""The broker: one ZeroMQ ROUTER that routes every message and keeps durable mailboxes.

Peers (actors, harness workers) are DEALERs whose identity is their address. The broker
validates envelopes only: it routes on the header and never decodes a body it forwards, so
it needs no message type but its own. A body its recipient cannot decode (an unknown tag, a
bad field) is rejected by the recipient, and the broker dead-letters it on that
:class:`~corral.bus.Reject`. The bodies it does decode are the control messages addressed to
it, :data:`~corral.bus.BrokerInbound`.

Stream messages go straight through; if the recipient is unknown or gone the sender gets an
:class:`~corral.bus.ErrorReply` (``unreachable``) — never a silent drop. Durable messages
are kept by the :class:`~corral.bus._durable.DurableStore` (mailboxes, the group-committed
log, dead letters) until their recipient acks them. The broker delivers them up to the
in-flight window and takes them back from a recipient that restarted; past
``max_attempts`` deliveries the store dead-letters them. The broker owns the socket: the
store answers senders only through :meth:`Broker._reply`.

Handles (from peers, addressed to ``broker``)::

    Hello       → Welcome (when the peer waits for it)
    ListParked  → ParkedEntries
    Heartbeat, Ack, Nack, Reject, Park, Hold, Unpark (no reply)

A control message it cannot decode is dead-lettered, and a sender that waits for a reply
gets ``protocol_error``.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import trio
import zmq

from .._exceptions import BusClosed, ProtocolError
from ..config import BusSettings
from ._codec import BodyDecoder, decode_envelope, encode_body, encode_envelope
from ._durable import DurableStore
from ._mailbox import Mailbox
from ._messages import (
    BROKER,
    Ack,
    BrokerInbound,
    Envelope,
    ErrorReply,
    Heartbeat,
    Hello,
    Hold,
    ListParked,
    Message,
    Nack,
    Park,
    ParkedEntries,
    Reject,
    Unpark,
    Welcome,
    new_id,
    tag_of,
)
from ._socket import Socket, configure

log = logging.getLogger("corral.bus.broker")

_ERROR_TAG = tag_of(ErrorReply)
#: Unanswered stream calls remembered per peer (the oldest are forgotten first).
_MAX_CALLS_TRACKED = 65536


@dataclass(slots=True)
class PeerState:
    """What the broker knows of one connected (or once connected) peer."""

    name: str
    ident: bytes
    pid: int = 0
    incarnation: str | None = None
    connected: bool = False
    last_seen: float = 0.0
    backlog: deque[list[bytes]] = field(default_factory=deque)


class Broker:
    """The bus broker. Create it, then ``await nursery.start(broker.run)``.

    Args:
        endpoints: addresses to bind (``ipc://...``, ``tcp://...``, ``inproc://...``).
        log_path: the durable mailbox log.
        settings: limits from ``[bus]`` in corral.toml.
        ctx: the process's zmq context (one per process, never inherited by fork).
    """

    def __init__(
        self,
        endpoints: list[str],
        log_path: Path,
        settings: BusSettings,
        *,
        ctx: zmq.SyncContext,
    ) -> None:
        self.endpoints = endpoints
        self.settings = settings
        self._ctx = ctx
        self._store = DurableStore(log_path, settings, reply=self._reply)
        self._socket: Socket | None = None
        self._inbound = BodyDecoder(BrokerInbound)
        self._peers: dict[str, PeerState] = {}
        #: Stream messages for actors being started, held until each says hello.
        self._held: dict[str, deque[tuple[Envelope, bytes]]] = {}
        self._flush_wanted = trio.Event()
        self._blocked: set[str] = set()
        #: Called with a peer's name when it says hello (the supervisor marks it running).
        self.on_hello: Callable[[str, int], None] | None = None
        #: Called when an entry is parked or unparked (what ``corral elicitations`` shows).
        self.on_parked: Callable[[], None] = lambda: None
        #: Gives the last exit of an actor, for dead-letter errors.
        self.exit_reason: Callable[[str], str | None] = lambda name: None
        self._stats = {"routed": 0, "durable": 0}
        #: Stream calls routed to each peer and not answered yet: request id → caller. A peer
        #: that exits takes them with it, and their callers are told at once instead of
        #: waiting out their deadline (a GET that met a dying dispatch waited 60 s).
        self._calls: dict[str, dict[str, str]] = {}

    # --- lifecycle -------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Recover the log, bind, and serve until cancelled."""
        await self._store.open()
        sock = self._ctx.socket(zmq.ROUTER)
        configure(sock, hwm=self.settings.hwm, linger_ms=self.settings.linger_ms)
        sock.setsockopt(zmq.MAXMSGSIZE, self.settings.max_message_bytes * 4)
        for endpoint in self.endpoints:
            sock.bind(endpoint)
        self._socket = Socket(sock)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._store.commit_loop)
                nursery.start_soon(self._flush_loop)
                task_status.started()
                await self._receive_loop()
        finally:
            self._socket.close(self.settings.linger_ms)
            with trio.CancelScope(shield=True):
                await self._store.commit_once()
            self._store.close()

    # --- registry and inspection -----------------------------------------------------------

    @property
    def stats(self) -> dict[str, int]:
        """Counters: messages routed and made durable, commits, compactions."""
        return {**self._stats, **self._store.stats}

    def register(self, name: str) -> None:
        """Declare an actor name: durable messages to it are kept even while it is down."""
        self._store.register(name)

    def mailbox(self, name: str) -> Mailbox:
        """The mailbox of ``name`` (created empty if needed)."""
        return self._store.mailbox(name)

    def last_seen(self, name: str) -> float | None:
        """Monotonic time of the last traffic from ``name``, or None if never seen."""
        peer = self._peers.get(name)
        return peer.last_seen if peer and peer.last_seen else None

    def mailboxes(self, actor: str | None = None, *, peek: int = 0) -> list[dict[str, Any]]:
        """Rows for ``corral mailboxes``."""
        return self._store.mailboxes(actor, peek=peek)

    def dead_letters(self) -> list[dict[str, Any]]:
        """Rows for ``corral dead-letters``, oldest first."""
        return self._store.dead_letters()

    def purge_dead(self, ids: list[str]) -> list[str]:
        """Drop these dead letters for good (``corral dead-letters purge``); returns the ids
        that were dead letters."""
        return self._store.purge_dead(ids)

    def requeue_dead(self, mid: str) -> None:
        """Deliver dead letter ``mid`` again (``corral dead-letters requeue``): it goes back
        to the end of its recipient's mailbox with a fresh count of attempts.

        Raises:
            KeyError: ``mid`` is not a dead letter.
            ValueError: it cannot be delivered again (the message says why).
        """
        self._pump(self._store.requeue_dead(mid))

    def parked(self) -> list[dict[str, Any]]:
        """Every parked entry and the recently resolved ones, for ``corral elicitations``.

        Each row: ``id``, ``owner``, ``type``, ``state`` (parked/resolved/cancelled),
        ``reason``, ``age_s`` and ``frame`` (the envelope, for the caller to decode).
        """
        return self._store.parked()

    def starting(self, name: str) -> None:
        """The supervisor is spawning ``name`` (first start or restart): hold stream
        messages to it until it says hello.

        Actors start together, so one may call another whose process is still importing;
        and a restart must not lose what a worker streams meanwhile (a turn's deltas). Such
        a message waits, as a durable one would in the mailbox, rather than failing. Replies
        are not held: their caller was the incarnation that died. At most ``max_backlog``
        messages are held, and all are refused if the actor exits before its hello.
        """
        self.register(name)
        self._held.setdefault(name, deque())

    def peer_down(self, name: str) -> None:
        """The supervisor saw ``name``'s process exit: take back what it had in flight."""
        for env, _ in self._held.pop(name, ()):
            self._error_reply(env, "unreachable", f"peer {name!r} exited before it started")
        reason = self.exit_reason(name)
        for request_id, caller in self._calls.pop(name, {}).items():
            why = f"peer {name!r} exited before it answered" + (f" ({reason})" if reason else "")
            self._reply(caller, request_id, ErrorReply(code="unreachable", message=why))
        peer = self._peers.get(name)
        if peer is not None:
            peer.connected = False
            peer.incarnation = None
        box = self._store.boxes.get(name)
        if box is not None:
            self._requeue(box, incarnation=None)

    # --- receiving -------------------------------------------------------------------------

    async def _receive_loop(self) -> None:
        assert self._socket is not None
        while True:
            try:
                batch = await self._socket.receive_batch(512)
            except BusClosed:
                return
            now = time.monotonic()
            for frames in batch:
                self._on_frames(frames, now)

    def _on_frames(self, frames: list[bytes], now: float) -> None:
        ident = frames[0]
        name = ident.decode("utf-8", "replace")
        peer = self._peers.get(name)
        if peer is None:
            peer = self._peers[name] = PeerState(name=name, ident=ident)
        peer.last_seen = now
        # Whoever just sent can be answered, hello or not.
        peer.connected = True
        if len(frames) != 2:
            self._dead_letter_raw(name, b"".join(frames[1:]), "expected exactly one frame")
            return
        frame = frames[1]
        if len(frame) > self.settings.max_message_bytes:
            self._refuse_oversized(name, frame)
            return
        try:
            env = decode_envelope(frame)
        except ProtocolError as exc:
            self._dead_letter_raw(name, frame, str(exc))
            return
        if env.sender != name:
            self._dead_letter_env(env, frame, f"sender {env.sender!r} is not the peer {name!r}")
            return
        if env.recipient == BROKER:
            self._on_control(peer, env)
            return
        if env.durability == "durable":
            self._on_durable(env, frame)
        else:
            self._on_stream(env, frame)

    def _on_control(self, peer: PeerState, env: Envelope) -> None:
        try:
            msg = self._inbound.decode(env)
        except ProtocolError as exc:
            self._dead_letter_env(env, b"", str(exc))
            return
        if isinstance(msg, Heartbeat):
            return
        if isinstance(msg, Ack):
            box = self._store.ack(peer.name, msg.ids)
            if box is not None:
                self._pump(box)
        elif isinstance(msg, Hello):
            self._on_hello(peer, msg)
            if env.wants_reply:
                self._reply(peer.name, env.id, Welcome())
        elif isinstance(msg, Nack):
            box = self._store.nack(peer.name, msg)
            if box is not None:
                self._pump(box)
        elif isinstance(msg, Reject):
            box = self._store.reject(peer.name, msg)
            if box is not None:
                self._pump(box)
        elif isinstance(msg, Park):
            box = self._store.park(peer.name, msg.id)
            self.on_parked()
            if box is not None:
                self._pump(box)
        elif isinstance(msg, Hold):
            self._store.hold(peer.name, msg.id)
        elif isinstance(msg, Unpark):
            self._store.unpark(peer.name, msg)
            self.on_parked()
        elif isinstance(msg, ListParked):
            entries = self._store.parked_entries(peer.name)
            self._reply(peer.name, env.id, ParkedEntries(entries=entries))

    def _on_hello(self, peer: PeerState, msg: Hello) -> None:
        restarted = peer.incarnation is not None and peer.incarnation != msg.incarnation
        peer.pid = msg.pid
        peer.incarnation = msg.incarnation
        peer.connected = True
        self._store.known.add(peer.name)
        box = self._store.mailbox(peer.name)
        if restarted or box.in_flight:
            self._requeue(box, incarnation=msg.incarnation)
        log.debug("hello from %s pid=%d restarted=%s", peer.name, msg.pid, restarted)
        for env, frame in self._held.pop(peer.name, ()):
            self._route(peer, env, frame)
        if self.on_hello is not None:
            self.on_hello(peer.name, msg.pid)
        self._pump(box)

    def _requeue(self, box: Mailbox, *, incarnation: str | None) -> None:
        # Actors handle messages in delivery order, so only the oldest unacked one its
        # recipient had not declared held can have been in the handler when the recipient
        # died; the rest merely sat in its inbox, or waited on another process. Counting
        # the attempt against that one alone is what finds a poison message without
        # dead-lettering the innocent ones queued behind it (or a turn's start held through
        # the whole turn, across every restart of its actor).
        stale = box.requeue_from(incarnation)
        box.redelivered += len(stale)
        handled = next((entry for entry, held in stale if not held), None)
        if handled is not None:
            self._store.retry_or_bury(box, handled, self._restart_error(box.name))

    def _restart_error(self, name: str) -> str:
        reason = self.exit_reason(name)
        return f"recipient {name!r} stopped while handling it" + (f" ({reason})" if reason else "")

    # --- routing ---------------------------------------------------------------------------

    def _on_stream(self, env: Envelope, frame: bytes) -> None:
        peer = self._peers.get(env.recipient)
        if peer is None or not peer.connected:
            held = self._held.get(env.recipient)
            if held is None or env.correlation_id is not None:
                self._error_reply(env, "unreachable", f"no running peer named {env.recipient!r}")
            elif len(held) >= self.settings.max_backlog:
                why = f"peer {env.recipient!r} is starting and {len(held)} messages wait for it"
                self._error_reply(env, "unreachable", why)
            else:
                held.append((env, frame))
            return
        self._route(peer, env, frame)

    def _route(self, peer: PeerState, env: Envelope, frame: bytes) -> None:
        if env.correlation_id is not None:
            self._calls.get(env.sender, {}).pop(env.correlation_id, None)
        if not self._send(peer, frame):
            why = "is overloaded" if peer.connected else "has gone away"
            self._error_reply(env, "unreachable", f"peer {env.recipient!r} {why}")
        elif env.wants_reply and env.correlation_id is None:
            calls = self._calls.setdefault(peer.name, {})
            calls[env.id] = env.sender
            if len(calls) > _MAX_CALLS_TRACKED:
                # Callers that gave up long ago: their deadline told them already.
                del calls[next(iter(calls))]
        self._stats["routed"] += 1

    def _on_durable(self, env: Envelope, frame: bytes) -> None:
        if env.recipient not in self._store.known:
            self._error_reply(env, "unreachable", f"no actor named {env.recipient!r}")
            return
        # Delivered at once, while its commit runs (see DurableStore.put).
        box = self._store.put(env, frame)
        self._stats["durable"] += 1
        self._pump(box)

    def _send(self, peer: PeerState, frame: bytes) -> bool:
        """Send (or backlog) one frame to a peer. False if it had to be refused."""
        if peer.backlog:
            if len(peer.backlog) >= self.settings.max_backlog:
                return False
            peer.backlog.append([peer.ident, frame])
            return True
        return self._send_now(peer, [peer.ident, frame], backlog=True)

    def _send_now(self, peer: PeerState, frames: list[bytes], *, backlog: bool) -> bool:
        assert self._socket is not None
        try:
            self._socket.send_nowait(frames)
        except trio.WouldBlock:
            if not backlog:
                return False
            peer.backlog.append(frames)
            self._blocked.add(peer.name)
            self._flush_wanted.set()
            return True
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EHOSTUNREACH:
                raise
            peer.connected = False
            return False
        except BusClosed:
            return False
        return True

    def _pump(self, box: Mailbox) -> None:
        """Deliver queued durable messages up to the in-flight window."""
        peer = self._peers.get(box.name)
        if peer is None or not peer.connected or peer.backlog:
            return
        window = self.settings.inflight_window
        while box.queued and len(box.in_flight) < window:
            entry = box.queued[0]
            frame = entry.frame if entry.attempt == 1 else _with_attempt(entry.frame, entry.attempt)
            if not self._send_now(peer, [peer.ident, frame], backlog=False):
                if peer.connected:
                    self._blocked.add(peer.name)
                    self._flush_wanted.set()
                return
            box.queued.popleft()
            entry.delivered_to = peer.incarnation
            entry.delivered_at = time.monotonic()
            box.in_flight[entry.id] = entry

    async def _flush_loop(self) -> None:
        """Retry peers whose high-water mark was reached."""
        while True:
            await self._flush_wanted.wait()
            self._flush_wanted = trio.Event()
            while self._blocked:
                await trio.sleep(0.001)
                for name in list(self._blocked):
                    peer = self._peers[name]
                    while peer.backlog and peer.connected:
                        if not self._send_now(peer, peer.backlog[0], backlog=False):
                            break
                        peer.backlog.popleft()
                    if not peer.connected:
                        self._fail_backlog(peer)
                    if not peer.backlog:
                        self._blocked.discard(name)
                        box = self._store.boxes.get(name)
                        if box is not None:
                            self._pump(box)

    def _fail_backlog(self, peer: PeerState) -> None:
        lost = len(peer.backlog)
        peer.backlog.clear()
        if lost:
            log.warning("peer %s went away with %d stream messages unsent", peer.name, lost)

    # --- errors and dead letters -----------------------------------------------------------

    def _dead_letter_raw(self, sender: str, frame: bytes, error: str) -> None:
        self._store.record_dead(
            new_id(), sender, "<malformed>", 1, f"from {sender!r}: {error}", frame
        )

    def _dead_letter_env(self, env: Envelope, frame: bytes, error: str) -> None:
        self._store.record_dead(env.id, env.recipient, env.type, env.attempt, error, frame)
        self._error_reply(env, "protocol_error", error)

    def _refuse_oversized(self, sender: str, frame: bytes) -> None:
        error = (
            f"message of {len(frame)} bytes exceeds the limit of {self.settings.max_message_bytes}"
        )
        try:
            env = decode_envelope(frame)
        except ProtocolError:
            self._dead_letter_raw(sender, frame, error)
            return
        self._store.record_dead(env.id, env.recipient, env.type, env.attempt, error, frame)
        self._error_reply(env, "too_large", error)

    def _error_reply(self, env: Envelope, code: str, message: str) -> None:
        if env.sender == BROKER or env.type == _ERROR_TAG:
            return
        self._reply(env.sender, env.id, ErrorReply(code=code, message=message))

    def _reply(self, to: str, correlation_id: str | None, msg: Message) -> None:
        peer = self._peers.get(to)
        if peer is None or not peer.connected:
            return
        env = Envelope(
            id=new_id(),
            sender=BROKER,
            recipient=to,
            type=tag_of(type(msg)),
            body=encode_body(msg),
            correlation_id=correlation_id,
        )
        self._send(peer, encode_envelope(env))


def _with_attempt(frame: bytes, attempt: int) -> bytes:
    env = decode_envelope(frame)
    return encode_envelope(msgspec.structs.replace(env, attempt=attempt))
