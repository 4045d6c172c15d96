"""The ``GET /v1/sessions/{id}/stream`` responses the server holds open, and what sends on them.

The server opens one stream per bound session and keeps it open for as long as the session
lives (PROTOCOL_0_19.md §K.2), so a host that knows 1,000 sessions holds ~1,000 of them,
nearly all idle. An open stream is a record here and nothing more (issue #20): no task, no
channel. A task runs for a stream only while it has something to send — events that arrived
for its session, a heartbeat that is due, the ``[DONE]`` of a deleted session — and ends
when that is sent; one task (:meth:`OpenStreams.run_heartbeats`) looks for due heartbeats
for all of them.

A stream's response belongs to the tunnel connection it came on, and its tasks run in that
connection's nursery: the tunnel forgets it here (:meth:`OpenStreams.close`) when the server
cancels the request or the connection goes, and a connection that goes takes its tasks with
it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sized

import trio

from ._options import GatewayOptions
from ._sse import DONE, HEARTBEAT, SSE_HEADERS, sse_data
from ._streams import StreamBuffer
from ._tunnel import Responder, Tunnel, TunnelDown

log = logging.getLogger("corral.actors.gateway")

#: How long a session's deletion waits for its streams to send their [DONE].
END_WAIT_S = 5.0
#: How long a full session waits for its open stream to send or confirm something before the
#: bound drops its oldest events (:meth:`OpenStreams.room`).
STALLED_S = 10.0


class OpenStream:
    """One open ``GET .../stream``.

    A stream opened with ``Last-Event-ID`` (``cursors``) tags each event with its ``seq``
    and leaves ``keep`` read events unconfirmed (see :meth:`StreamBuffer.received`); one
    opened without is the 0.19 wire format exactly. ``finish`` asks it to end with
    ``[DONE]``; ``sending`` says a task sends on it now (never more than one), ``scope``
    is that task's.
    """

    __slots__ = (
        "cursors",
        "ended",
        "finish",
        "keep",
        "quiet_since",
        "responder",
        "scope",
        "sending",
        "session_id",
        "tunnel",
    )

    def __init__(
        self, tunnel: Tunnel, responder: Responder, session_id: str, cursors: bool, keep: int
    ) -> None:
        self.tunnel = tunnel
        self.responder = responder
        self.session_id = session_id
        self.cursors = cursors
        self.keep = keep if cursors else 0
        self.finish = False
        self.sending = False
        self.scope: trio.CancelScope | None = None
        self.quiet_since = trio.current_time()
        self.ended = trio.Event()


class OpenStreams:
    """Every open stream of the gateway, by session; the newest of each takes its events.

    Args:
        buffer: the gateway's durable event buffer.
        options: the gateway's options (heartbeat, batch limits, replay window).
        inbox: the gateway's inbox: a batch waits while it holds more events (below).
    """

    def __init__(self, buffer: StreamBuffer, options: GatewayOptions, inbox: Sized) -> None:
        self.buffer = buffer
        self.options = options
        self._inbox = inbox
        #: The newest open stream of each session: only it takes the session's events.
        self.newest: dict[str, OpenStream] = {}
        self.open: dict[str, set[OpenStream]] = {}
        #: One per session with a stream open: a new stream's rewind waits for any frame an
        #: older one of the session has in flight.
        self._locks: dict[str, trio.Lock] = {}
        #: Full sessions whose stream stalled, with their progress mark then (:meth:`room`).
        self._stalled: dict[str, int] = {}

    def sessions_held(self) -> int:
        """Sessions any stream state is kept for: those with a stream open, no more."""
        return len(self.open.keys() | self._locks.keys())

    async def serve(
        self, tunnel: Tunnel, responder: Responder, session_id: str, cursor: int | None
    ) -> None:
        """Open a session's stream, in its request's task: send the head, a first heartbeat
        and what is pending, then return and leave the response open (the tunnel keeps it,
        :meth:`Tunnel.detach`).

        The stream starts after ``cursor`` (its ``Last-Event-ID``) if it has one, else after
        the last event a ping proved read: what an earlier stream wrote and the server may
        not have goes again.
        """
        me = OpenStream(
            tunnel, responder, session_id, cursor is not None, self.options.replay_window_events
        )
        me.sending = True  # nothing is sent on it before its head
        self.newest[session_id] = me
        self.open.setdefault(session_id, set()).add(me)
        lock = self._locks.setdefault(session_id, trio.Lock())
        try:
            async with lock:
                self.buffer.rewind(session_id, cursor)
            await responder.head(200, SSE_HEADERS)
            await responder.text(HEARTBEAT)
            me.quiet_since = trio.current_time()
            # Once this task returns, the tunnel ends it: a request.cancel, a lost connection.
            tunnel.detach(responder.id, lambda: self.close(me))
            await self._send_due(me)
        except BaseException:  # cancelled with its request, or failed: forgotten here
            self.close(me)
            raise

    def notify(self, session_id: str) -> None:
        """Events of ``session_id`` arrived: its newest stream sends them."""
        me = self.newest.get(session_id)
        if me is not None:
            self._kick(me)

    async def room(self, session_id: str) -> None:
        """Flow control: a session holding ``max_buffered_events`` events not yet confirmed
        while the server holds its stream open waits for that stream to send or confirm
        some, and every message after it waits in the inbox (then in the broker's durable
        mailbox): a turn that outruns the server is slowed, not cut. The bound drops the
        oldest only for a session the server holds no stream of (the tunnel down, say), or
        whose stream has moved nothing for :data:`STALLED_S` — and then without waiting
        again until it moves something, so that one stalled stream does not hold up every
        other session."""
        moves = self.buffer.moves(session_id)
        if self._stalled.get(session_id) == moves:
            return
        self._stalled.pop(session_id, None)
        self.notify(session_id)
        deadline = trio.current_time() + STALLED_S
        while self.buffer.full(session_id) and session_id in self.newest:
            seen = self.buffer.progress.version
            await self.buffer.progress.wait_past(seen, max(0.0, deadline - trio.current_time()))
            if self.buffer.moves(session_id) != moves:
                moves, deadline = self.buffer.moves(session_id), trio.current_time() + STALLED_S
            elif trio.current_time() >= deadline:
                self._stalled[session_id] = moves
                log.warning(
                    "session %s: its stream sent and confirmed nothing for %.0f s with %d "
                    "events unsent; past the bound the oldest are dropped",
                    session_id,
                    STALLED_S,
                    self.buffer.pending_in(session_id),
                )
                return

    async def finish(self, session_id: str) -> int:
        """The session was deleted: end each of its streams with ``[DONE]``, waiting up to
        :data:`END_WAIT_S` for them; how many there were."""
        self._stalled.pop(session_id, None)
        streams = list(self.open.get(session_id, ()))
        for me in streams:
            me.finish = True
            self._kick(me)
        with trio.move_on_after(END_WAIT_S):
            for me in streams:
                await me.ended.wait()
        return len(streams)

    async def run_heartbeats(self) -> None:
        """Send a heartbeat on every stream quiet for ``heartbeat_s``: one task for all of
        them, so that an idle stream needs none."""
        every = self.options.heartbeat_s
        tick = min(1.0, every / 4)
        while True:
            await trio.sleep(tick)
            due = trio.current_time() - every
            for streams in list(self.open.values()):
                for me in list(streams):
                    if me.quiet_since <= due:
                        self._kick(me)

    def close(self, me: OpenStream) -> None:
        """Forget ``me`` (ended, cancelled by the server, or its connection gone) and stop
        whatever sends on it."""
        if me.ended.is_set():
            return
        me.ended.set()
        if me.scope is not None:
            me.scope.cancel()
        session_id = me.session_id
        streams = self.open.get(session_id)
        if streams is not None:
            streams.discard(me)
            if not streams:
                del self.open[session_id]
                self._locks.pop(session_id, None)
        if self.newest.get(session_id) is me:
            del self.newest[session_id]
            self.buffer.nudge()  # a full session waiting for this stream (:meth:`room`)
        me.tunnel.forget(me.responder.id)

    # --- sending --------------------------------------------------------------------------

    def _kick(self, me: OpenStream) -> None:
        """Start a task that sends what is due on ``me``, unless one already runs (it looks
        again before it ends, with no checkpoint in between)."""
        if me.sending or me.ended.is_set():
            return
        me.sending = True
        try:
            me.tunnel.start_soon(self._sender, me)
        except TunnelDown:
            me.sending = False
            self.close(me)

    async def _sender(self, me: OpenStream) -> None:
        """A task of ``me``'s connection: what is due, sent. A failure ends this stream (the
        server opens it again) and nothing else of the connection."""
        try:
            with trio.CancelScope() as me.scope:
                await self._send_due(me)
        except Exception:
            log.exception("session %s: its stream failed; ending it", me.session_id)
            self.close(me)
            with contextlib.suppress(TunnelDown):
                await me.responder.end()
        finally:
            me.scope = None

    async def _send_due(self, me: OpenStream) -> None:
        """Send what is due on ``me`` (``sending`` is set), then clear ``sending``: the
        session's pending events while ``me`` is its newest stream, a heartbeat once it has
        been quiet for ``heartbeat_s``, and ``[DONE]`` and the end once asked to finish."""
        session_id = me.session_id
        try:
            while not me.ended.is_set():
                if me.finish:
                    await me.responder.text(DONE)
                    await me.responder.end()
                    self.close(me)
                    return
                lock = self._locks.get(session_id)
                if lock is not None and self._takes(me) and self.buffer.has_pending(session_id):
                    async with lock:
                        if self._takes(me):
                            await self._send_batch(me)
                            me.quiet_since = trio.current_time()
                    continue
                if trio.current_time() - me.quiet_since >= self.options.heartbeat_s:
                    await me.responder.text(HEARTBEAT)
                    me.quiet_since = trio.current_time()
                    continue
                return
        except TunnelDown:
            self.close(me)
        finally:
            me.sending = False

    def _takes(self, me: OpenStream) -> bool:
        return self.newest.get(me.session_id) is me

    async def _send_batch(self, me: OpenStream) -> None:
        opts = self.options
        session_id = me.session_id
        # Busy: events already on their way in (queued in our inbox) join this frame. Each
        # checkpoint lets the actor loop take more messages; an idle inbox stops at once,
        # so a lone event is never held back.
        for _ in range(opts.sse_batch_events):
            if not self._inbox:
                break
            if self.buffer.pending_in(session_id) >= opts.sse_batch_events:
                break
            await trio.lowlevel.cancel_shielded_checkpoint()
        batch = self.buffer.take(session_id, opts.sse_batch_events, opts.sse_batch_bytes)
        if not batch:
            return
        last = batch[-1][0]
        text = "".join(sse_data(event, seq if me.cursors else None) for seq, event in batch)
        keep, mark = me.keep, not me.cursors
        await me.responder.text(
            text,
            on_sent=lambda: self.buffer.sent(session_id, last, mark=mark),
            on_read=lambda: self.buffer.received(session_id, last, keep=keep),
        )
