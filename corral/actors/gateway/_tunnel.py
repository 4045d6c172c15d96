"""One runner id's WebSocket tunnel to its server (PROTOCOL_0_19.md §A, §K): :class:`Tunnel`.

The gateway keeps one WebSocket **client** connection per runner id to
``{server}/v1/runners/{runner_id}/tunnel`` and sends ``hello`` first, with the
``session-event-ingest-v1`` capability and a ``connection_id`` new on every attempt; the
server answers ``event.ready``, which is recorded (corral never sends ``event.batch``, so
any ``event.ack`` is counted and ignored). Incoming ``request``
frames each run in a task of their own and are answered through a :class:`Responder`
(``response.head``, ``response.body`` pieces, ``response.end``); one writer task sends every
outgoing frame, so a cancelled request never cuts one in half. A frame sent with ``on_read``
is confirmed by a WebSocket ping sent after it and answered (:class:`_Reads`): what a
returned write handed to the kernel is lost with the socket when either end is killed.

Failure handling. Malformed frames are logged and ignored (a ``request`` frame whose id can
still be read is answered 400, so the server does not wait); frames over ``max_frame_bytes``
are refused (a request gets 413), and ones over four times that close the tunnel. Close codes
4001, 4002, 4004 and 4500 are fatal for that runner (the reason is logged and shown in
``corral status``). A server recycle (close 1001 or 1012, or HTTP 502 on the upgrade) resets
the backoff and reconnects after a uniform delay, so that a restarted server is not hit by
every runner at once; every other drop reconnects with exponential backoff and jitter.
"""

from __future__ import annotations

import base64
import logging
import math
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote, urlsplit, urlunsplit

import msgspec
import trio
from trio_websocket import (
    ConnectionClosed,
    ConnectionRejected,
    HandshakeError,
    WebSocketConnection,
    open_websocket_url,
)

from ... import __version__
from ..._exceptions import CorralError
from ...config import RunnerSettings
from ...routes import HttpResponse, error_response
from ._frames import (
    EVENT_INGEST_CAPABILITY,
    FRAME_PROTOCOL_VERSION,
    OVERSIZED_REQUEST_ID,
    EventAckFrame,
    EventReadyFrame,
    Frame,
    HelloFrame,
    PingFrame,
    PongFrame,
    RequestCancelFrame,
    RequestFrame,
    ResponseBodyFrame,
    ResponseEndFrame,
    ResponseHeadFrame,
    WsCloseFrame,
    WsOpenFrame,
    body_encoding,
    decode_frame,
    encode_frame,
)
from ._wire import MarkedStream, install

if TYPE_CHECKING:
    from ._actor import GatewayActor

log = logging.getLogger("corral.actors.gateway")

ORIGIN = "omnigent://internal"
TOKEN_HEADER = "X-Omnigent-Runner-Tunnel-Token"
#: Close codes after which reconnecting cannot help (§A.2, §K.4), and what each means.
FATAL_CLOSE_CODES = {
    4001: "the server did not get a hello frame first",
    4002: "the server does not speak frame protocol version 1",
    4004: "the runner id does not match the tunnel token (or the server requires a token)",
    4500: "the server failed internally on this tunnel",
}
#: Closes that are a server recycle, not an error (§K.1): reconnect soon, with a fresh backoff.
RECYCLE_CLOSE_CODES = {
    1001: "the server is going away (recycled)",
    1012: "the server is restarting",
}
RECYCLE_HTTP_STATUSES = {502}
#: Other closes worth explaining in the tunnel's status.
CLOSE_MEANINGS = {
    1013: "the server got no hello from this runner within its 30 s limit",
}
#: Response bodies are cut into frames of at most this many bytes (a multiple of 3, so that
#: base64 pieces concatenate).
BODY_PIECE = 512 * 1024


class TunnelFatal(CorralError):
    """The server closed a tunnel with a code that reconnecting cannot fix (4001/4002/4004)."""

    def __init__(self, message: str, *, code: int) -> None:
        super().__init__(message)
        self.code = code


class TunnelDown(CorralError):
    """A frame was sent on a tunnel that is no longer connected."""


def tunnel_url(server: str, runner_id: str) -> str:
    """``ws(s)://host[/prefix]/v1/runners/{quoted id}/tunnel`` for a server's base URL (§i.1)."""
    parts = urlsplit(server)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    path = f"{parts.path.rstrip('/')}/v1/runners/{quote(runner_id, safe='')}/tunnel"
    return urlunsplit((scheme, parts.netloc, path, "", ""))


def backoff_delay(
    attempt: int, *, base: float, cap: float, rand: Callable[[], float] = random.random
) -> float:
    """Seconds before reconnect attempt ``attempt`` (0-based): ``base·2ⁿ`` up to ``cap``, ±50 %."""
    return min(cap, base * 2 ** min(attempt, 32)) * (0.5 + rand())


def recycle_delay(low: float, high: float, rand: Callable[[], float] = random.random) -> float:
    """Seconds before reconnecting after a server recycle: uniform in ``[low, high]`` (§K.1).

    Spread rather than immediate, so that the runners of a restarted server come back over a
    few seconds instead of all in the same instant.
    """
    return low + (high - low) * rand()


class _Outgoing:
    """A frame queued for a tunnel's writer; ``sent`` is set once it was sent or dropped."""

    __slots__ = ("on_read", "on_sent", "sent", "text")

    def __init__(
        self,
        text: str,
        on_sent: Callable[[], None] | None,
        wait: bool,
        on_read: Callable[[], None] | None = None,
    ) -> None:
        self.text = text
        self.on_sent = on_sent
        self.on_read = on_read
        self.sent = trio.Event() if wait else None


class _Reads:
    """One connection's callbacks of frames sent and not yet proven read by the server.

    A write that returned only means the kernel took the frame; a kernel loses what it holds
    when either end is killed. A WebSocket ping sent after the frame and answered proves the
    server's process read it (it reads its socket in order, and answers a ping when it reads
    it), so :meth:`Tunnel._confirmer` runs these callbacks after such a round trip.
    ``waiting`` are the frames written since the last ping went out, ``pinged`` those the
    ping in flight covers.

    Nothing else proves a frame read, a server's Close frame included: the server read what
    came before its Close went out, not what crossed it on the wire, and omnigent's uvicorn
    sends 1012 and closes the socket at once (``fail_connection``), reading nothing after.
    So however a connection ends, what no ping proved read is sent again on the next stream.
    """

    __slots__ = ("pinged", "waiting", "wanted")

    def __init__(self) -> None:
        self.waiting: list[Callable[[], None]] = []
        self.pinged: list[Callable[[], None]] = []
        self.wanted = trio.Event()

    def add(self, callback: Callable[[], None]) -> None:
        self.waiting.append(callback)
        self.wanted.set()

    def start_ping(self) -> None:
        """A ping goes out: it covers every frame written so far."""
        self.pinged += self.waiting
        self.waiting = []

    def read(self, runner_id: str) -> None:
        """The frames the ping covered were read: run their callbacks (a failing one is
        logged)."""
        callbacks, self.pinged = self.pinged, []
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("tunnel %s: a read-callback failed", runner_id)


class Responder:
    """Writes one request's answer: head, body pieces, end."""

    def __init__(self, tunnel: Tunnel, request_id: str) -> None:
        self.tunnel = tunnel
        self.id = request_id
        self.head_sent = False
        self.ended = False
        self.encoding: Literal["utf-8", "base64"] = "utf-8"

    async def head(self, status: int, headers: list[tuple[str, str]]) -> None:
        self.encoding = body_encoding(headers)
        self.head_sent = True
        await self.tunnel.send(ResponseHeadFrame(id=self.id, status=status, headers=headers))

    async def body(self, data: bytes) -> None:
        if self.encoding == "utf-8":
            try:
                text = data.decode()
            except UnicodeDecodeError:
                self.encoding = "base64"
            else:
                for i in range(0, len(text), BODY_PIECE):
                    await self.text(text[i : i + BODY_PIECE])
                return
        for i in range(0, len(data), BODY_PIECE):
            body = base64.b64encode(data[i : i + BODY_PIECE]).decode("ascii")
            await self.tunnel.send(ResponseBodyFrame(id=self.id, body=body, encoding="base64"))

    async def text(
        self,
        text: str,
        on_sent: Callable[[], None] | None = None,
        on_read: Callable[[], None] | None = None,
    ) -> None:
        """Send a UTF-8 body piece; with ``on_sent``, wait until it was sent (or dropped).

        ``on_read`` runs later, once the server's process is known to have read the frame (a
        ping after it was answered); never if the connection drops first.
        """
        frame = ResponseBodyFrame(id=self.id, body=text, encoding="utf-8")
        await self.tunnel.send(frame, on_sent=on_sent, wait=on_sent is not None, on_read=on_read)

    async def end(self) -> None:
        self.ended = True
        await self.tunnel.send(ResponseEndFrame(id=self.id))

    async def respond(self, response: HttpResponse) -> None:
        await self.head(response.status, list(response.headers))
        if response.body:
            await self.body(response.body)
        await self.end()


class Tunnel:
    """One runner id's connection to its server, reconnected until it is fatal or stopped."""

    def __init__(self, gateway: GatewayActor, runner: RunnerSettings, runner_id: str) -> None:
        self.gateway = gateway
        self.options = gateway.options
        self.runner = runner
        self.runner_id = runner_id
        self.url = tunnel_url(runner.server, runner_id)
        self.state = "connecting"
        self.since = time.time()
        self.error: str | None = None
        self.close_code: int | None = None
        self.next_attempt_at: float | None = None
        self.connects = 0
        #: The current (or last) connection attempt's id, as sent in its hello.
        self.connection_id: str | None = None
        #: The server sent ``event.ready`` on the current connection.
        self.event_ready = False
        self.requests: dict[str, trio.CancelScope] = {}
        #: Responses left open after their request's task returned (a session's stream), by
        #: request id: what ends each when the server cancels it or the connection goes.
        self.detached: dict[str, Callable[[], None]] = {}
        #: The current connection's nursery: the tasks of its requests and open responses.
        self._nursery: trio.Nursery | None = None
        self.stats = dict.fromkeys(
            (
                "frames_in",
                "frames_out",
                "requests",
                "malformed",
                "oversized",
                "event_acks",
                "read_confirmations",
            ),
            0,
        )
        self._out: trio.MemorySendChannel[_Outgoing] | None = None
        self._drop_reason: str | None = None
        self._malformed_logged = -math.inf

    def status(self) -> dict[str, Any]:
        """This tunnel's state for ``corral status``."""
        now = time.time()
        return {
            "runner_id": self.runner_id,
            "server": self.runner.server,
            "url": self.url,
            "state": self.state,
            "since": self.since,
            "error": self.error,
            "close_code": self.close_code,
            "next_attempt_at": self.next_attempt_at,
            "next_attempt_in_s": (
                max(0.0, round(self.next_attempt_at - now, 3)) if self.next_attempt_at else None
            ),
            "connects": self.connects,
            "connection_id": self.connection_id,
            "event_ready": self.event_ready,
            "requests_in_flight": len(self.requests),
            "responses_open": len(self.detached),
            **self.stats,
        }

    def _set_state(self, state: str, error: str | None = None) -> None:
        self.state = state
        self.error = error
        self.since = time.time()

    # -- the connection loop ---------------------------------------------------------------

    async def run(self) -> None:
        """Connect, serve, and reconnect with backoff until a fatal close."""
        opts = self.options
        attempt = 0
        while True:
            connected_for = 0.0
            recycled = False
            try:
                connected_for = await self._connect_and_serve()
                error = self._drop_reason or "the server closed the tunnel"
                recycled = self.close_code in RECYCLE_CLOSE_CODES
            except TunnelFatal as exc:
                self.close_code = exc.code
                self._set_state("fatal", str(exc))
                log.error("tunnel %s: %s; not reconnecting", self.runner_id, exc)
                return
            except ConnectionRejected as exc:
                error = f"the server refused the tunnel upgrade with HTTP {exc.status_code}"
                recycled = exc.status_code in RECYCLE_HTTP_STATUSES
            except HandshakeError as exc:
                cause = exc.__cause__ or exc
                error = f"cannot connect to {self.url}: {cause or type(cause).__name__}"
            except (ConnectionClosed, OSError, trio.BrokenResourceError) as exc:
                error = f"the tunnel broke: {type(exc).__name__}: {exc}"
            except Exception as exc:
                log.exception("tunnel %s: unexpected failure", self.runner_id)
                error = f"internal error: {type(exc).__name__}: {exc}"
            if recycled:
                attempt = 0
                delay = recycle_delay(opts.recycle_min_s, opts.recycle_max_s)
            else:
                if connected_for >= opts.backoff_cap_s:
                    attempt = 0
                delay = backoff_delay(attempt, base=opts.backoff_base_s, cap=opts.backoff_cap_s)
                attempt += 1
            self._set_state("reconnecting", error)
            self.next_attempt_at = time.time() + delay
            log.warning("tunnel %s: %s; reconnecting in %.2fs", self.runner_id, error, delay)
            await trio.sleep(delay)
            self.next_attempt_at = None
            self.state = "connecting"

    async def _connect_and_serve(self) -> float:
        """One connection, from handshake to close; returns how long it was up."""
        opts = self.options
        headers = [(b"Origin", ORIGIN.encode())]
        if self.runner.token:
            headers.append((TOKEN_HEADER.encode(), self.runner.token.encode()))
        self._drop_reason = None
        self.close_code = None
        self.connection_id = uuid.uuid4().hex
        self.event_ready = False
        started = time.monotonic()
        async with open_websocket_url(
            self.url,
            extra_headers=headers,
            max_message_size=4 * opts.max_frame_bytes,
            connect_timeout=opts.connect_timeout_s,
            disconnect_timeout=2.0,
            receive_buffer_size=64 * 1024,
        ) as ws:
            try:
                await self._serve(ws, install(ws))
            finally:
                if ws.closed is None:
                    # Stopping (or dropping the connection on our side): close it cleanly.
                    with trio.CancelScope(shield=True), trio.move_on_after(1):
                        why = (self._drop_reason or "runner shutting down")[:120]
                        await ws.aclose(1000, why)
        reason = ws.closed
        if reason is not None:
            self.close_code = reason.code
            if reason.code in FATAL_CLOSE_CODES:
                raise TunnelFatal(
                    f"the server closed the tunnel with {reason.code} "
                    f"({reason.reason or 'no reason given'}): {FATAL_CLOSE_CODES[reason.code]}",
                    code=reason.code,
                )
            if self._drop_reason is None:
                closed = f"the tunnel closed with {reason.code} ({reason.reason or reason.name})"
                meaning = RECYCLE_CLOSE_CODES.get(reason.code) or CLOSE_MEANINGS.get(reason.code)
                self._drop_reason = f"{closed}: {meaning}" if meaning else closed
        return time.monotonic() - started

    async def _serve(self, ws: WebSocketConnection, marked: MarkedStream) -> None:
        from ..._child_env import bwrap_path  # the sandbox, as omnigent's runner names it

        hello = HelloFrame(
            runner_version=__version__,
            frame_protocol_version=FRAME_PROTOCOL_VERSION,
            harnesses=self.gateway.harnesses,
            envs=["os_sandbox"] if bwrap_path() else [],
            telemetry_opt_out=True,
            capabilities=[EVENT_INGEST_CAPABILITY],
            connection_id=self.connection_id,
        )
        try:
            await ws.send_message(encode_frame(hello).decode())
        except ConnectionClosed:
            return  # closed right after the upgrade (4004 comes so); the caller reads why
        self.connects += 1
        self._set_state("connected")
        log.info(
            "tunnel %s: connected to %s (connection %s)",
            self.runner_id,
            self.url,
            self.connection_id,
        )
        out, queue = trio.open_memory_channel[_Outgoing](self.options.send_queue)
        self._out = out
        reads = _Reads()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._writer, ws, marked, queue, reads, nursery.cancel_scope)
                nursery.start_soon(self._pinger, ws, nursery.cancel_scope)
                nursery.start_soon(self._confirmer, ws, reads, nursery.cancel_scope)
                await self._reader(ws, nursery)
                nursery.cancel_scope.cancel()
        finally:
            self._out = None
            self._nursery = None
            self.requests.clear()
            # The responses still open went with the connection.
            while self.detached:
                self.detached.popitem()[1]()

    def detach(self, request_id: str, on_end: Callable[[], None]) -> None:
        """Keep the response of ``request_id`` open after its request's task returns:
        ``on_end`` runs when the server cancels it or the connection goes (not after
        :meth:`forget`)."""
        self.detached[request_id] = on_end

    def forget(self, request_id: str) -> None:
        """The detached response of ``request_id`` ended on its own."""
        self.detached.pop(request_id, None)

    def start_soon(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        """Run ``fn(*args)`` in a task of the current connection, cancelled with it.

        Raises:
            TunnelDown: no connection is up.
        """
        if self._nursery is None:
            raise TunnelDown(f"tunnel {self.runner_id} is not connected")
        self._nursery.start_soon(fn, *args)

    async def _writer(
        self,
        ws: WebSocketConnection,
        marked: MarkedStream,
        queue: trio.MemoryReceiveChannel[_Outgoing],
        reads: _Reads,
        scope: trio.CancelScope,
    ) -> None:
        # The only task that writes frames, so a cancelled request never cuts one in half.
        item: _Outgoing | None = None
        try:
            async for item in queue:
                # ``on_sent`` runs in the very step that wrote the frame (:mod:`._wire`): a
                # kill -9 then leaves no frame written and unmarked for a whole round.
                marked.armed = item.on_sent
                try:
                    await ws.send_message(item.text)
                finally:
                    marked.armed = None
                self.stats["frames_out"] += 1
                if item.on_read is not None:
                    reads.add(item.on_read)
                if item.sent is not None:
                    item.sent.set()
                item = None
        except ConnectionClosed:
            scope.cancel()
        finally:
            # Whatever was not sent never will be: release everyone waiting on it, then close
            # (no checkpoint in between, so nothing slips into the queue unseen).
            if item is not None and item.sent is not None:
                item.sent.set()
            while True:
                try:
                    left = queue.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
                if left.sent is not None:
                    left.sent.set()
            queue.close()

    async def _pinger(self, ws: WebSocketConnection, scope: trio.CancelScope) -> None:
        timeout = self.options.ping_timeout_s
        while True:
            await trio.sleep(self.options.ping_interval_s)
            with trio.move_on_after(timeout) as waited:
                try:
                    await ws.ping()
                except ConnectionClosed:
                    scope.cancel()
                    return
            if waited.cancelled_caught:
                self._drop_reason = f"no pong from the server within {timeout:g}s"
                scope.cancel()
                return

    async def _confirmer(
        self, ws: WebSocketConnection, reads: _Reads, scope: trio.CancelScope
    ) -> None:
        """Prove frames read: one ping round trip for every frame sent since the last one."""
        rounds = 0
        while True:
            await reads.wanted.wait()
            reads.wanted = trio.Event()
            reads.start_ping()
            rounds += 1
            try:
                # A payload of our own: the pinger's random ones can never clash with it.
                await ws.ping(b"read %d" % rounds)
            except ConnectionClosed:
                scope.cancel()
                return
            self.stats["read_confirmations"] += 1
            reads.read(self.runner_id)

    async def send(
        self,
        frame: Frame,
        *,
        on_sent: Callable[[], None] | None = None,
        wait: bool = False,
        on_read: Callable[[], None] | None = None,
    ) -> None:
        """Queue a frame for the writer; with ``wait``, return once it was sent or dropped.

        ``on_read`` runs once a ping sent after the frame was answered (see :class:`_Reads`).
        """
        out = self._out
        if out is None:
            raise TunnelDown(f"tunnel {self.runner_id} is not connected")
        item = _Outgoing(encode_frame(frame).decode(), on_sent, wait, on_read)
        try:
            await out.send(item)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise TunnelDown(f"tunnel {self.runner_id} went down") from None
        if item.sent is not None:
            # Shielded: once queued, the frame's fate must be known before anyone else takes
            # the same events (the writer or its teardown always sets ``sent``).
            with trio.CancelScope(shield=True):
                await item.sent.wait()

    # -- incoming frames -------------------------------------------------------------------

    async def _reader(self, ws: WebSocketConnection, nursery: trio.Nursery) -> None:
        limit = self.options.max_frame_bytes
        while True:
            try:
                raw = await ws.get_message()
                await self._on_frame(raw, nursery, limit)
            except (ConnectionClosed, TunnelDown):
                return

    async def _on_frame(self, raw: str | bytes, nursery: trio.Nursery, limit: int) -> None:
        self.stats["frames_in"] += 1
        if not isinstance(raw, str):
            self._malformed("a binary frame (frames are text)", raw[:80])
            return
        if len(raw) > limit:
            await self._refuse_oversized(raw)
            return
        try:
            frame = decode_frame(raw)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self._malformed(str(exc), raw[:200])
            await self._refuse_malformed(raw, exc)
            return
        if isinstance(frame, RequestFrame):
            if frame.id in self.requests or frame.id in self.detached:
                self._malformed(f"request id {frame.id!r} is already in flight", raw[:200])
                return
            scope = self.requests[frame.id] = trio.CancelScope()
            nursery.start_soon(self._request, frame, scope)
        elif isinstance(frame, PingFrame):
            await self.send(PongFrame(ts=frame.ts))
        elif isinstance(frame, RequestCancelFrame):
            # A cancel may name a request that already ended (the server cancels a /stream
            # right after its [DONE], §A.5): only one still in flight has anything to stop.
            cancelled = self.requests.get(frame.id)
            on_end = self.detached.pop(frame.id, None)
            if cancelled is not None or on_end is not None:
                log.info(
                    "tunnel %s: request %s cancelled (%s)", self.runner_id, frame.id, frame.reason
                )
            if cancelled is not None:
                cancelled.cancel()
            if on_end is not None:
                on_end()
        elif isinstance(frame, EventReadyFrame):
            if not self.event_ready:
                log.info("tunnel %s: the server accepts session event batches", self.runner_id)
            self.event_ready = True
        elif isinstance(frame, EventAckFrame):
            # This runner sends no event.batch, so no ack answers anything of ours.
            self.stats["event_acks"] += 1
        elif isinstance(frame, WsOpenFrame):
            reason = "terminal attach is not supported by this runner"
            await self.send(WsCloseFrame(ch_id=frame.ch_id, code=1011, reason=reason))
        # ws.frame / ws.close: only for channels this runner never opens.

    def _malformed(self, why: str, preview: str | bytes) -> None:
        self.stats["malformed"] += 1
        now = time.monotonic()
        if self.stats["malformed"] <= 10 or now - self._malformed_logged > 5:
            self._malformed_logged = now
            log.warning(
                "tunnel %s: ignoring a malformed frame (%d so far): %s: %r",
                self.runner_id,
                self.stats["malformed"],
                why,
                preview,
            )

    async def _refuse_malformed(self, raw: str, why: object) -> None:
        """Answer 400 to a ``request`` frame that does not decode, if its id can be found:
        the server would otherwise wait for an answer until its own timeout."""
        match = OVERSIZED_REQUEST_ID.search(raw[:2048])
        if match is None or match.group(1) in self.requests or match.group(1) in self.detached:
            return
        message = f"The request frame is not valid: {why}."
        await Responder(self, match.group(1)).respond(error_response(400, "invalid_input", message))

    async def _refuse_oversized(self, raw: str) -> None:
        self.stats["oversized"] += 1
        limit = self.options.max_frame_bytes
        match = OVERSIZED_REQUEST_ID.search(raw[:2048])
        log.warning(
            "tunnel %s: refusing a %d-character frame (limit %d)%s",
            self.runner_id,
            len(raw),
            limit,
            f" for request {match.group(1)}" if match else "",
        )
        if match:
            response = error_response(
                413,
                "payload_too_large",
                f"The request frame is larger than this runner's limit of {limit}.",
            )
            await Responder(self, match.group(1)).respond(response)

    async def _request(self, frame: RequestFrame, scope: trio.CancelScope) -> None:
        self.stats["requests"] += 1
        responder = Responder(self, frame.id)
        try:
            with scope:
                try:
                    await self.gateway.handle(self, frame, responder)
                except TunnelDown:
                    pass
                except Exception:
                    log.exception(
                        "tunnel %s: request %s %s failed", self.runner_id, frame.method, frame.path
                    )
                    if not responder.head_sent:
                        await responder.respond(runner_dispatch_failed())
                    elif not responder.ended:
                        await responder.end()
        except TunnelDown:
            pass
        finally:
            if self.requests.get(frame.id) is scope:
                del self.requests[frame.id]


def runner_dispatch_failed() -> HttpResponse:
    message = "The runner failed to handle the request; see its logs."
    return error_response(500, "runner_dispatch_failed", message)
