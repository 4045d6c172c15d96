"""The gateway actor: the server's runner tunnels ⇄ the bus (PROTOCOL_0_19.md; PROTOCOL_FACTS.md
§i, §ii, §v.6 for what 0.19 left unchanged).

For every configured runner id the gateway keeps one WebSocket **client** connection to
``{server}/v1/runners/{runner_id}/tunnel``. The server sends HTTP requests down it as
``request`` frames; each runs in a task of its own (requests are multiplexed by id) and is
answered with ``response.head``, ``response.body`` frames and ``response.end``.

What it handles and answers is the table in :mod:`corral.actors.gateway.messages`.

Routes:

==========================================  ==================================================
route                                       answered by
==========================================  ==================================================
``GET /v1/sessions/{id}/stream``            the gateway: the session's events as SSE
``GET .../skills``                          the gateway: ``{"skills":[]}``
``* .../resources[/...]`` (any method)      the tools actor (environments, files, shell,
                                            terminals); while it is down a GET of a list
                                            answers the empty list, anything else 503
                                            ``runner_unavailable``
``POST .../background-title``               the gateway: ``{"status":"unsupported"}``
``POST .../mcp/execute``                    dispatch → policy → tools (never retried: a
                                            tool call must not run twice)
``DELETE /v1/sessions/{id}``                dispatch (durable); on a 2xx the session's open
                                            streams end with ``[DONE]`` (§I.1) and its
                                            undelivered events are forgotten
any other ``/v1/sessions...``               dispatch, as an :class:`~corral.routes.HttpRequest`
anything else                               404
==========================================  ==================================================

Every error the gateway answers itself has the 0.19 shape ``{"error": {"code", "message"}}``.

Runner isolation. Each request carries the runner id of its tunnel. Dispatch answers a session
bound through another runner id of this host as unknown on the routes it answers; on a host of
several runner ids, the gateway asks dispatch which id bound a session before it opens the
session's stream, answers its ``skills`` or ``background-title``, or routes its resources to the
tools actor, and answers the same 404 for another id's (docs/security.md).

Session streams. Dispatch publishes every session event to the gateway, in
:class:`~corral.actors.gateway.messages.SessionEvents` batches, with a per-session ``seq``
that only grows.
The gateway writes each one to a durable per-session buffer (:class:`StreamBuffer`) before
anything else and sends it on the session's newest open ``/stream``; an event leaves the
buffer only once the server is known to have it — by the ``Last-Event-ID`` a stream opens
with (corral's control plane), or by a WebSocket ping answered after its frame (omnigent's
server, which has no acknowledgement for stream events) — not when the kernel took it. So
events published while the tunnel is down, or written to a server that died before reading
them, go out in order and once when the server re-inits the session and re-opens its stream
after a reconnect (§v.6), and a gateway killed with ``kill -9`` does not lose what it had
received — provided the events reach it durably (see ``docs/gateway.md``: dispatch must send
them as durable messages; the gateway acks each message only after the buffer records of its
events are fsynced). Backed-up events
are coalesced: several SSE events share one ``response.body`` frame, while an event that
finds the tunnel idle goes out at once on its own.

Only the types the server's client stream accepts go upstream (:data:`SERVER_STREAM_TYPES`,
§D.2): any other event is left out before it is buffered (its seq still counts, so a
redelivery of it is a duplicate), counted per type in the snapshot and logged once per type.
It stays in the journal, which dispatch feeds separately.

The tunnels themselves (connection, reconnect with backoff, frame limits) are in
:mod:`._tunnel`; the buffer in :mod:`._streams`; the open streams, which hold no task while
idle, in :mod:`._open_streams`.
"""

from __future__ import annotations

import base64
import logging
import math
import uuid
from collections.abc import Mapping
from typing import Any, Final

import msgspec
import trio

from ..._exceptions import BadInput, BusError, ConfigError, MessageTooLarge
from ..._input import check_session_id
from ...bus import Incoming
from ...config import check_runners
from ...harnesses import HARNESSES, availability
from ...routes import (
    HttpChunk,
    HttpRequest,
    HttpResponse,
    error_response,
    json_response,
    no_session,
)
from ...runners import resolve_runner_ids
from .._actor import Actor, ActorContext, handles
from .._tally import Tally
from ._frames import RequestFrame
from ._open_streams import OpenStreams
from ._options import GatewayOptions
from ._sse import stream_type
from ._streams import StreamBuffer
from ._tunnel import Responder, Tunnel, runner_dispatch_failed
from ._vocabulary import SERVER_STREAM_TYPES
from .messages import SessionEvent, SessionEvents, events_of

log = logging.getLogger("corral.actors.gateway")

#: The page of a list route that has nothing on this runner.
_EMPTY_LIST: Final[Mapping[str, object]] = {
    "object": "list",
    "data": [],
    "first_id": None,
    "last_id": None,
    "has_more": False,
}
#: How often a drain looks whether the events it waits for have been written.
DRAIN_POLL_S = 0.05


class _Bound(msgspec.Struct):
    """Dispatch's answer to ``GET /runner/sessions/{id}``."""

    runner_id: str | None = None


_decode_bound = msgspec.json.Decoder(_Bound).decode


def _bound_of(reply: HttpResponse | None) -> _Bound | None:
    """Dispatch's 200 to ``GET /runner/sessions/{id}`` read, or None for any other answer."""
    if reply is None or reply.status != 200:
        return None
    try:
        return _decode_bound(reply.body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def _upstream(event: bytes) -> bool:
    return stream_type(event) in SERVER_STREAM_TYPES


def stream_cursor(headers: list[tuple[str, str]]) -> int | None:
    """A stream request's ``Last-Event-ID``: the server has every event up to it (a
    server that stores events by ``seq`` sends it; omnigent's sends none).

    Raises:
        BadInput: 400 for a value that is not a non-negative integer.
    """
    for name, value in headers:
        if name.lower() != "last-event-id":
            continue
        text = value.strip()
        if not (text.isascii() and text.isdigit() and len(text) <= 18):
            message = f"Last-Event-ID must be an event seq (a non-negative integer), not {value!r}."
            raise BadInput(400, "invalid_input", message)
        return int(text)
    return None


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
        self.harnesses = _runnable(self.options.harnesses)
        self.buffer = StreamBuffer(
            ctx.data_dir / "streams.log",
            max_events=self.options.max_buffered_events,
            compact_bytes=self.options.compact_bytes,
        )
        self.tunnels: list[Tunnel] = []
        self.streams = OpenStreams(self.buffer, self.options, peer.inbox)
        #: The runner id each session was bound through, as dispatch said (:meth:`_kept_out`).
        self._bound: dict[str, str] = {}
        #: Sessions the server deleted (through this gateway): their later events go nowhere.
        self._deleted: set[str] = set()
        #: Events kept off the server's stream, per type; events dropped after a delete.
        self.off_stream: dict[str, int] = {}
        self.after_delete = 0
        #: What ``/metrics`` shows of the relay (``corral_deltas_relayed_total``).
        self.tally = Tally()
        self._chunks: dict[str, trio.MemorySendChannel[HttpChunk]] = {}

    async def setup(self) -> None:
        assert self.nursery is not None
        await trio.to_thread.run_sync(self.buffer.load, _upstream)
        self.nursery.start_soon(self.buffer.run)
        self.nursery.start_soon(self.streams.run_heartbeats)
        ids = await trio.to_thread.run_sync(self._runner_ids)
        for runner, runner_id in zip(self.options.runners, ids, strict=True):
            tunnel = Tunnel(self, runner, runner_id)
            self.tunnels.append(tunnel)
            self.nursery.start_soon(tunnel.run)

    async def drain(self, wait_s: float) -> int:
        """The host is stopping: wait up to ``wait_s`` for the events not yet written to
        the streams the server holds open (the end of a turn the drain let finish); the
        number left. None is lost either way: the buffer is durable, and the next host's
        gateway sends what is left. Events of a session whose stream the server does not hold
        open, or with no tunnel up, are not waited for: nothing would send them now."""
        with trio.move_on_after(wait_s):
            while self._unsent_on_streams():
                await trio.sleep(DRAIN_POLL_S)
        return self._unsent_on_streams()

    def _unsent_on_streams(self) -> int:
        if not any(t.state == "connected" for t in self.tunnels):
            return 0
        return sum(self.buffer.pending_in(session_id) for session_id in self.streams.newest)

    async def terminate(self) -> None:
        self.buffer.close()

    def snapshot(self) -> dict[str, Any]:
        return {
            **super().snapshot(),
            "tunnels": [t.status() for t in self.tunnels],
            "harnesses": self.harnesses,
            "streams": len(self.streams.newest),
            "stream_sessions": self.streams.sessions_held(),
            "pending_events": self.buffer.pending_count(),
            "unsent_events": self.buffer.unsent_count(),
            "buffer": dict(self.buffer.stats),
            "off_stream": dict(self.off_stream),
            "after_delete": self.after_delete,
            "tally": self.tally.snapshot(),
        }

    def _runner_ids(self) -> list[str]:
        """Each runner's id (the host passes them resolved; a bare gateway resolves here)."""
        resolved = resolve_runner_ids(list(self.options.runners), self.ctx.data_dir)
        return [r.id for r in resolved if r.id is not None]

    # --- bus messages ----------------------------------------------------------------------

    @handles(SessionEvents, SessionEvent)
    async def session_events(self, msg: SessionEvents | SessionEvent, incoming: Incoming) -> None:
        """Keep a message's events in the buffer; ack it once they are fsynced.

        Events the server's stream does not accept, and events of a deleted session, are
        left out (only their seq is noted). A message with nothing to keep (all duplicates,
        all left out) is acked at once.
        """
        touched: set[str] = set()
        relayed: dict[str, int] = {}  # deltas by runner, counted once per message
        for event in events_of(msg):
            session_id = event.session_id
            if session_id in self._deleted:
                if self.buffer.skip(session_id, event.seq):
                    self.after_delete += 1
                continue
            kind = stream_type(event.event)
            if kind not in SERVER_STREAM_TYPES:
                if self.buffer.skip(session_id, event.seq):
                    self._off_stream(kind)
                continue
            if self.buffer.full(session_id):
                await self.streams.room(session_id)
            if self.buffer.add(session_id, event.seq, event.event):
                touched.add(session_id)
                if kind == "response.output_text.delta":
                    runner = event.runner_id or ""
                    relayed[runner] = relayed.get(runner, 0) + 1
        for runner, n in relayed.items():
            self.tally.count("deltas_relayed", n, runner_id=runner)
        if touched:
            self.buffer.ack_when_synced(self.defer(incoming))
            for session_id in touched:
                self.streams.notify(session_id)

    @handles(HttpChunk)
    async def chunk(self, msg: HttpChunk, incoming: Incoming) -> None:
        queue = self._chunks.get(msg.request_id)
        if queue is not None:
            queue.send_nowait(msg)

    def _off_stream(self, kind: str | None) -> None:
        key = kind if kind is not None else "(no type)"
        count = self.off_stream[key] = self.off_stream.get(key, 0) + 1
        if count == 1:
            log.info(
                "session events of type %s stay off the server's stream (its client stream "
                "does not accept them); they are counted in the gateway's off_stream",
                key,
            )

    # --- requests --------------------------------------------------------------------------

    async def handle(self, tunnel: Tunnel, frame: RequestFrame, responder: Responder) -> None:
        """Answer one tunnelled request (§ii)."""
        parts = frame.path.strip("/").split("/")
        if parts[:2] != ["v1", "sessions"]:
            await responder.respond(_not_found(frame))
            return
        method, rest = frame.method.upper(), parts[3:]
        session_id = parts[2] if len(parts) > 2 else ""
        if len(parts) > 2:
            try:
                check_session_id(session_id)
            except BadInput as exc:
                await responder.respond(refused(frame, exc))
                return
        if session_id and _beside_dispatch(method, rest):
            refusal = await self._kept_out(tunnel, session_id)
            if refusal is not None:
                await responder.respond(refusal)
                return
        if session_id:
            if method == "GET" and rest == ["stream"]:
                try:
                    cursor = stream_cursor(frame.headers)
                except BadInput as exc:
                    await responder.respond(refused(frame, exc))
                    return
                await self.streams.serve(tunnel, responder, session_id, cursor)
                return
            local = _local_answer(method, rest)
            if local is not None:
                await responder.respond(local)
                return
        try:
            body = _request_body(frame)
        except ValueError:
            bad = BadInput(400, "invalid_input", "The request body is not valid base64.")
            await responder.respond(refused(frame, bad))
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
            method = frame.method.upper()
            owner, durable, timeout = self._owner(method, rest)
            reply: HttpResponse | None
            try:
                reply = await self.peer.call(
                    owner, request, durable=durable, timeout=timeout, session_id=session_id
                )
            except MessageTooLarge:
                # Refused before it was sent: the owner gets nothing, the session is as it was.
                limit = self.peer.bus.max_message_bytes
                message = (
                    f"The request body of {len(body)} bytes does not fit in a message on "
                    f"this runner's bus (the limit is {limit} bytes, [bus] max_message_bytes)."
                )
                too_large = BadInput(413, "payload_too_large", message)
                await responder.respond(refused(frame, too_large))
                return
            except BusError as exc:
                log.warning("%s %s: %s did not answer: %s", frame.method, frame.path, owner, exc)
                reply = None
            if reply is None and owner == self.options.tools:
                reply = resources_fallback(method, rest)
            if reply is None:
                await responder.respond(runner_dispatch_failed())
                return
            if method == "DELETE" and session_id and not rest and 200 <= reply.status < 300:
                await self._session_deleted(session_id)
            await responder.head(reply.status, list(reply.headers))
            if reply.body:
                await responder.body(reply.body)
            if reply.streaming:
                relayed = 0  # the highest numbered piece relayed: a restarted owner resends
                async for chunk in chunks:
                    fresh = chunk.seq is None or chunk.seq > relayed
                    if chunk.seq is not None:
                        relayed = max(relayed, chunk.seq)
                    if chunk.data and fresh:
                        await responder.body(chunk.data)
                    if chunk.end:
                        break
            await responder.end()
        finally:
            del self._chunks[key]

    async def _kept_out(self, tunnel: Tunnel, session_id: str) -> HttpResponse | None:
        """None if a request through ``tunnel`` may reach the session on a route dispatch does
        not answer (its stream, its resources, the gateway's own answers); else its answer:
        an unknown session's 404, or 503 while dispatch cannot say.

        Dispatch holds the runner id each session was bound through and keeps every other id
        out of the routes it answers; for these the gateway asks it, once per session (a
        binding never changes), on a host of one runner id too: a session bound through a
        runner id the host no longer serves (its ``[[runners]]`` entry removed) must not be
        reached through the one that remains. A session dispatch does not know is not found
        on a host of several ids (the server inits a session before it opens its stream or
        asks for its resources, §B.3); on a host of one there is no other runner it could
        belong to, and it is let through as it always was. So is every session of a host of
        one while dispatch cannot answer (it restarts): only a removed runner id's session
        could be reached then, and failing every stream and resource for those seconds
        would cost each session of the host far more.
        """
        bound = self._bound.get(session_id)
        if bound is None:
            request = HttpRequest(
                request_id=f"bound_{uuid.uuid4().hex}",
                method="GET",
                path=f"/runner/sessions/{session_id}",
            )
            try:
                reply = await self.peer.call(
                    self.options.dispatch, request, timeout=self.options.dispatch_timeout_s
                )
            except BusError as exc:
                log.warning("no runner id known for session %s: %s", session_id, exc)
                reply = None
            if reply is not None and reply.status == 404:
                return no_session(session_id) if len(self.tunnels) > 1 else None
            answer = _bound_of(reply)
            if answer is None and len(self.tunnels) < 2:
                return None
            if answer is None:
                message = "The runner cannot serve this session right now; try again shortly."
                return error_response(503, "runner_unavailable", message)
            bound = answer.runner_id
            if bound is None:
                return None  # bound through no runner id yet: dispatch binds it on first use
            self._bound[session_id] = bound
        return None if bound == tunnel.runner_id else no_session(session_id)

    def _owner(self, method: str, rest: list[str]) -> tuple[str, bool, float]:
        """Who answers a forwarded route, whether the request is durable, and its deadline."""
        opts = self.options
        if rest[:1] == ["resources"]:
            # Not durable: a shell command or a file write must not run again after a crash.
            timeout = opts.dispatch_timeout_s if method == "GET" else opts.tool_timeout_s
            return opts.tools, False, timeout
        if method == "POST" and rest == ["mcp", "execute"]:
            return opts.dispatch, False, opts.tool_timeout_s
        return opts.dispatch, method in ("POST", "DELETE"), opts.dispatch_timeout_s

    async def _session_deleted(self, session_id: str) -> None:
        """Dispatch deleted the session: forget its undelivered events, end its streams."""
        self._deleted.add(session_id)
        self._bound.pop(session_id, None)
        forgotten = self.buffer.forget(session_id)
        ended = await self.streams.finish(session_id)
        log.info(
            "session %s deleted: %d undelivered events forgotten, %d streams ended",
            session_id,
            forgotten,
            ended,
        )


def refused(frame: RequestFrame, exc: BadInput) -> HttpResponse:
    """The 4xx of a request the gateway refuses itself, logged once (no traceback)."""
    log.warning("refused %s %s: %d %s: %s", frame.method, frame.path, exc.status, exc.code, exc)
    return error_response(exc.status, exc.code, str(exc))


def _request_body(frame: RequestFrame) -> bytes:
    if frame.body is None:
        return b""
    if frame.encoding == "base64":
        return base64.b64decode(frame.body, validate=True)
    return frame.body.encode()


def _beside_dispatch(method: str, rest: list[str]) -> bool:
    """A session route dispatch does not answer (so does not check the runner id of):
    the stream, the gateway's own answers, and the resources the tools actor serves."""
    return (
        rest[:1] == ["resources"]
        or (method == "GET" and rest == ["stream"])
        or _local_answer(method, rest) is not None
    )


def _local_answer(method: str, rest: list[str]) -> HttpResponse | None:
    """The routes the gateway answers itself (§ii.4, ii.10)."""
    if method == "GET" and rest == ["skills"]:
        return json_response(200, {"skills": []})
    if method == "POST" and rest == ["background-title"]:
        return json_response(200, {"status": "unsupported", "title": None})
    return None


def resources_fallback(method: str, rest: list[str]) -> HttpResponse:
    """What ``.../resources[/...]`` answers while the tools actor is down.

    A list of resources (``resources``, ``resources/terminals``, ...) is empty: nothing is
    open. Anything else — a file, a directory, a search, a shell, a change — cannot be
    answered honestly, so it is 503 and the server's client can try again.
    """
    if method == "GET" and len(rest) <= 2:
        return json_response(200, _EMPTY_LIST)
    message = "The runner's tools are not available right now; try again shortly."
    return error_response(503, "runner_unavailable", message)


def _runnable(configured: list[str] | None) -> list[str]:
    """The harness kinds to advertise: those configured (default: all) this host can run.

    Advertising a kind the host cannot run would attract sessions it can only fail (the
    server routes by ``hello.harnesses``, PROTOCOL_0_19.md §L); the ones left out are logged.
    """
    wanted = list(dict.fromkeys(configured or sorted(HARNESSES)))
    why = availability(wanted)
    left_out = {name: reason for name, reason in why.items() if reason}
    if left_out:
        log.warning(
            "hello leaves out harness kinds this host cannot run: %s",
            "; ".join(f"{name} ({reason})" for name, reason in left_out.items()),
        )
    return sorted(name for name in wanted if name not in left_out)


def _not_found(frame: RequestFrame) -> HttpResponse:
    message = f"No route {frame.method} {frame.path} on this runner."
    return error_response(404, "not_found", message)
