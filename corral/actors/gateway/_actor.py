"""The gateway actor: the server's runner tunnels ⇄ the bus (PROTOCOL_FACTS.md §i, §ii, §v.6).

For every configured runner id the gateway keeps one WebSocket **client** connection to
``{server}/v1/runners/{runner_id}/tunnel``. The server sends HTTP requests down it as
``request`` frames; each runs in a task of its own (requests are multiplexed by id) and is
answered with ``response.head``, ``response.body`` frames and ``response.end``.

Handles:
    SessionEvents (durable, from dispatch)  events for sessions' ``/stream``, in order
    SessionEvent (durable)                  one event alone (as a mailbox kept from an
                                            older dispatch may still hold them)
    HttpChunk (from the routes' owners)     a piece of a streaming answer to a request

Routes:

==========================================  ==================================================
route                                       answered by
==========================================  ==================================================
``GET /v1/sessions/{id}/stream``            the gateway: the session's events as SSE
``GET .../skills``, ``.../environments``    the gateway: the shapes of the capture
``GET .../resources[/terminals]``           the tools actor (its terminals)
``DELETE .../resources``                    the tools actor: closes them, ``cleaned``
``POST .../background-title``               the gateway: ``{"status":"unsupported"}``
``POST .../mcp/execute``                    dispatch → policy → tools (never retried: a
                                            tool call must not run twice)
any other ``/v1/sessions...``               dispatch, as an :class:`~corral.routes.HttpRequest`
anything else                               404
==========================================  ==================================================

Session streams. Dispatch publishes every session event to the gateway, in
:class:`~corral.routes.SessionEvents` batches, with a per-session ``seq`` that only grows.
The gateway writes each one to a durable per-session buffer (:class:`StreamBuffer`) before
anything else and sends it on the session's newest open ``/stream``; an event leaves the
buffer only once its frame has been handed to the kernel, and that fact is written down at
once. So events
published while the tunnel is down wait in the buffer and go out, in order and once, when the
server re-inits the session and re-opens its stream after a reconnect (§v.6), and a gateway
killed with ``kill -9`` neither loses nor repeats them — provided the events reach it
durably (see ``docs/gateway.md``: dispatch must send them as durable messages; the gateway
acks each message only after the buffer records of its events are fsynced). Backed-up events
are coalesced: several SSE events share one ``response.body`` frame, while an event that
finds the tunnel idle goes out at once on its own.

The tunnels themselves (connection, reconnect with backoff, frame limits) are in
:mod:`._tunnel`; the buffer in :mod:`._streams`.
"""

from __future__ import annotations

import base64
import json
import logging
import math
from typing import Any

import msgspec
import trio

from ..._exceptions import BusError, ConfigError
from ...bus import Incoming
from ...config import check_runners
from ...harnesses import HARNESSES
from ...routes import (
    HttpChunk,
    HttpRequest,
    HttpResponse,
    SessionEvent,
    SessionEvents,
    events_of,
    json_response,
)
from ...runners import resolve_runner_ids
from .._actor import Actor, ActorContext, handles
from ._frames import RequestFrame
from ._options import GatewayOptions
from ._streams import StreamBuffer
from ._tunnel import Responder, Tunnel

log = logging.getLogger("corral.actors.gateway")

SSE_HEADERS = [
    ("cache-control", "no-cache"),
    ("x-accel-buffering", "no"),
    ("content-type", "text/event-stream; charset=utf-8"),
]
HEARTBEAT = 'data: {"type": "session.heartbeat"}\n\n'
_EMPTY_LIST = {"object": "list", "data": [], "first_id": None, "last_id": None, "has_more": False}


def sse_data(event: bytes) -> str:
    """One SSE frame, ``data: <json>\\n\\n``, with ``json.dumps``'s separators (§ii.6)."""
    try:
        text = json.dumps(json.loads(event))
    except ValueError:
        text = event.decode(errors="replace")
    return f"data: {text}\n\n"


class GatewayActor(Actor):
    """Bridges every configured runner tunnel to the bus."""

    def __init__(self, ctx: ActorContext, peer: Any) -> None:
        super().__init__(ctx, peer)
        try:
            self.options = msgspec.convert(ctx.options, GatewayOptions)
        except msgspec.ValidationError as exc:
            raise ConfigError(
                f"invalid gateway options: {exc}", key="actors.gateway.options"
            ) from None
        check_runners(self.options.runners)
        self.harnesses = sorted(self.options.harnesses or HARNESSES)
        self.buffer = StreamBuffer(
            ctx.data_dir / "streams.log",
            max_events=self.options.max_buffered_events,
            compact_bytes=self.options.compact_bytes,
        )
        self.tunnels: list[Tunnel] = []
        #: The newest open /stream of each session (only it takes events).
        self._streams: dict[str, object] = {}
        self._stream_locks: dict[str, trio.Lock] = {}
        self._changed: dict[str, trio.Event] = {}
        self._chunks: dict[str, trio.MemorySendChannel[HttpChunk]] = {}

    async def setup(self) -> None:
        assert self.nursery is not None
        await trio.to_thread.run_sync(self.buffer.load)
        self.nursery.start_soon(self.buffer.run, self.peer.ack)
        ids = await trio.to_thread.run_sync(self._runner_ids)
        for runner, runner_id in zip(self.options.runners, ids, strict=True):
            tunnel = Tunnel(self, runner, runner_id)
            self.tunnels.append(tunnel)
            self.nursery.start_soon(tunnel.run)

    async def terminate(self) -> None:
        self.buffer.close()

    def snapshot(self) -> dict[str, Any]:
        return {
            **super().snapshot(),
            "tunnels": [t.status() for t in self.tunnels],
            "streams": len(self._streams),
            "pending_events": self.buffer.pending_count(),
            "buffer": dict(self.buffer.stats),
        }

    def _runner_ids(self) -> list[str]:
        """Each runner's id (the host passes them resolved; a bare gateway resolves here)."""
        return [r.id for r in resolve_runner_ids(list(self.options.runners), self.ctx.data_dir)]

    # --- bus messages ----------------------------------------------------------------------

    @handles(SessionEvents, SessionEvent)
    async def session_events(self, msg: SessionEvents | SessionEvent, incoming: Incoming) -> None:
        """Keep a message's events in the buffer; ack it once they are fsynced.

        A message whose events are all duplicates (a redelivery of what the buffer already
        has) is acked at once.
        """
        touched: set[str] = set()
        for event in events_of(msg):
            if self.buffer.add(event.session_id, event.seq, event.event):
                touched.add(event.session_id)
        if touched:
            incoming.deferred = True
            self.buffer.ack_when_synced(incoming)
            for session_id in touched:
                self._notify(session_id)

    @handles(HttpChunk)
    async def chunk(self, msg: HttpChunk, incoming: Incoming) -> None:
        queue = self._chunks.get(msg.request_id)
        if queue is not None:
            queue.send_nowait(msg)

    def _notify(self, session_id: str) -> None:
        event = self._changed.pop(session_id, None)
        if event is not None:
            event.set()

    # --- requests --------------------------------------------------------------------------

    async def handle(self, tunnel: Tunnel, frame: RequestFrame, responder: Responder) -> None:
        """Answer one tunnelled request (§ii)."""
        parts = frame.path.strip("/").split("/")
        if parts[:2] != ["v1", "sessions"]:
            await responder.respond(_not_found(frame))
            return
        method, rest = frame.method.upper(), parts[3:]
        session_id = parts[2] if len(parts) > 2 else ""
        if session_id:
            if method == "GET" and rest == ["stream"]:
                await self._session_stream(responder, session_id)
                return
            local = _local_answer(method, rest, session_id)
            if local is not None:
                await responder.respond(local)
                return
        try:
            body = _request_body(frame)
        except ValueError:
            detail = "The request body is not valid base64."
            await responder.respond(
                json_response(400, {"error": "invalid_request", "detail": detail})
            )
            return
        await self._forward(tunnel, frame, responder, body, session_id or None, rest)

    async def _forward(
        self,
        tunnel: Tunnel,
        frame: RequestFrame,
        responder: Responder,
        body: bytes,
        session_id: str | None,
        rest: list[str],
    ) -> None:
        key = f"{tunnel.runner_id}/{frame.id}"
        send, chunks = trio.open_memory_channel[HttpChunk](math.inf)
        self._chunks[key] = send
        try:
            request = HttpRequest(
                request_id=key,
                method=frame.method,
                path=frame.path,
                query=frame.query_string,
                headers=list(frame.headers),
                body=body,
                runner_id=tunnel.runner_id,
                reply_to=self.peer.name,
            )
            owner, durable, timeout = self._owner(frame.method.upper(), rest)
            try:
                reply = await self.peer.call(
                    owner, request, durable=durable, timeout=timeout, session_id=session_id
                )
            except BusError as exc:
                log.warning("%s %s: %s did not answer: %s", frame.method, frame.path, owner, exc)
                reply = None
            if reply is None and owner == self.options.tools:
                reply = _resources_fallback(frame.method.upper(), rest, session_id or "")
            if not isinstance(reply, HttpResponse):
                await responder.respond(json_response(500, {"error": "runner_dispatch_failed"}))
                return
            await responder.head(reply.status, list(reply.headers))
            if reply.body:
                await responder.body(reply.body)
            if reply.streaming:
                async for chunk in chunks:
                    if chunk.data:
                        await responder.body(chunk.data)
                    if chunk.end:
                        break
            await responder.end()
        finally:
            del self._chunks[key]

    def _owner(self, method: str, rest: list[str]) -> tuple[str, bool, float]:
        """Who answers a forwarded route, whether the request is durable, and its deadline."""
        opts = self.options
        if rest[:1] == ["resources"] and method in ("GET", "DELETE"):
            return opts.tools, False, opts.dispatch_timeout_s
        if method == "POST" and rest == ["mcp", "execute"]:
            return opts.dispatch, False, opts.tool_timeout_s
        return opts.dispatch, method == "POST", opts.dispatch_timeout_s

    async def _session_stream(self, responder: Responder, session_id: str) -> None:
        """``GET /v1/sessions/{id}/stream``: buffered then live events; never ends by itself."""
        opts = self.options
        me = object()
        self._streams[session_id] = me  # the newest stream of a session takes its events
        self._notify(session_id)
        lock = self._stream_locks.setdefault(session_id, trio.Lock())
        try:
            await responder.head(200, SSE_HEADERS)
            await responder.text(HEARTBEAT)
            quiet_since = trio.current_time()
            while True:
                changed = self._changed.setdefault(session_id, trio.Event())
                if self._streams.get(session_id) is me and self.buffer.has_pending(session_id):
                    async with lock:
                        if self._streams.get(session_id) is me:
                            await self._send_batch(responder, session_id)
                            quiet_since = trio.current_time()
                    continue
                with trio.move_on_at(quiet_since + opts.heartbeat_s):
                    await changed.wait()
                    continue
                await responder.text(HEARTBEAT)
                quiet_since = trio.current_time()
        finally:
            if self._streams.get(session_id) is me:
                del self._streams[session_id]

    async def _send_batch(self, responder: Responder, session_id: str) -> None:
        opts = self.options
        # Busy: events already on their way in (queued in our inbox) join this frame. Each
        # checkpoint lets the actor loop take more messages; an idle inbox stops at once,
        # so a lone event is never held back.
        inbox = self.peer.inbox
        for _ in range(opts.sse_batch_events):
            if not inbox:
                break
            if self.buffer.pending_in(session_id) >= opts.sse_batch_events:
                break
            await trio.lowlevel.cancel_shielded_checkpoint()
        batch = self.buffer.take(session_id, opts.sse_batch_events, opts.sse_batch_bytes)
        if not batch:
            return
        last = batch[-1][0]
        text = "".join(sse_data(event) for _, event in batch)
        await responder.text(text, on_sent=lambda: self.buffer.delivered(session_id, last))


def _request_body(frame: RequestFrame) -> bytes:
    if frame.body is None:
        return b""
    if frame.encoding == "base64":
        return base64.b64decode(frame.body, validate=True)
    return frame.body.encode()


def _local_answer(method: str, rest: list[str], session_id: str) -> HttpResponse | None:
    """The routes the gateway answers itself (§ii.4, ii.8, ii.10)."""
    if method == "GET" and rest == ["skills"]:
        return json_response(200, {"skills": []})
    if method == "GET" and rest == ["resources", "environments"]:
        return json_response(200, _EMPTY_LIST)
    if method == "POST" and rest == ["background-title"]:
        return json_response(200, {"status": "unsupported", "title": None})
    return None


def _resources_fallback(method: str, rest: list[str], session_id: str) -> HttpResponse | None:
    """What the resource routes answer while the tools actor is down: nothing is open."""
    if method == "GET":
        return json_response(200, _EMPTY_LIST)
    cleaned = {"session_id": session_id, "object": "session.resources.cleaned", "cleaned": True}
    return json_response(200, cleaned)


def _not_found(frame: RequestFrame) -> HttpResponse:
    detail = f"No route {frame.method} {frame.path} on this runner."
    return json_response(404, {"error": "not_found", "detail": detail})
