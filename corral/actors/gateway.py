"""The gateway actor: the server's runner tunnels ⇄ the bus (PROTOCOL_FACTS.md §i, §ii, §v.6).

For every configured runner id the gateway keeps one WebSocket **client** connection to
``{server}/v1/runners/{runner_id}/tunnel``. The server sends HTTP requests down it as
``request`` frames; each runs in a task of its own (requests are multiplexed by id) and is
answered with ``response.head``, ``response.body`` frames and ``response.end``:

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

Session streams. Dispatch publishes every session event to the gateway as a
:class:`~corral.routes.SessionEvent` with a per-session ``seq`` that only grows. The gateway
writes each one to a durable per-session buffer (:class:`StreamBuffer`) before anything else
and sends it on the session's newest open ``/stream``; an event leaves the buffer only once
its frame has been handed to the kernel, and that fact is written down at once. So events
published while the tunnel is down wait in the buffer and go out, in order and once, when the
server re-inits the session and re-opens its stream after a reconnect (§v.6), and a gateway
killed with ``kill -9`` neither loses nor repeats them — provided the events reach it
durably (see ``docs/gateway.md``: dispatch must send them as durable messages; the gateway
acks each one only after its buffer record is fsynced). Backed-up events are coalesced:
several SSE events share one ``response.body`` frame, while an event that finds the tunnel
idle goes out at once on its own.

Failure handling. Malformed frames are logged and ignored; frames over ``max_frame_bytes``
are refused (a request gets 413), and ones over four times that close the tunnel. Close codes
4001, 4002 and 4004 are fatal for that runner (the reason is logged and shown in ``corral
status``); every other drop reconnects with exponential backoff and jitter.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import os
import random
import re
import struct
import time
import zlib
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal
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

from .. import __version__
from .._exceptions import BusError, ConfigError, CorralError
from ..bus import Incoming
from ..config import Positive, PositiveInt, RunnerSettings, check_runners
from ..harnesses import HARNESSES
from ..routes import HttpChunk, HttpRequest, HttpResponse, SessionEvent, json_response
from ..runners import resolve_runner_ids
from ._actor import Actor, ActorContext, handles

log = logging.getLogger("corral.actors.gateway")

FRAME_PROTOCOL_VERSION = 1
ORIGIN = "omnigent://internal"
TOKEN_HEADER = "X-Omnigent-Runner-Tunnel-Token"
#: Close codes after which reconnecting cannot help (§i.3), and what each means.
FATAL_CLOSE_CODES = {
    4001: "the server did not get a hello frame first",
    4002: "the server does not speak frame protocol version 1",
    4004: "the runner id does not match the tunnel token (or the server requires a token)",
}
SSE_HEADERS = [
    ("cache-control", "no-cache"),
    ("x-accel-buffering", "no"),
    ("content-type", "text/event-stream; charset=utf-8"),
]
HEARTBEAT = 'data: {"type": "session.heartbeat"}\n\n'
_TEXT_TYPES = ("text/", "application/json", "application/x-ndjson")
#: Response bodies are cut into frames of at most this many bytes (a multiple of 3, so that
#: base64 pieces concatenate).
BODY_PIECE = 512 * 1024
_EMPTY_LIST = {"object": "list", "data": [], "first_id": None, "last_id": None, "has_more": False}


class GatewayOptions(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """``[actors.gateway.options]`` (the top-level ``[[runners]]`` are appended to ``runners``)."""

    runners: list[RunnerSettings] = []
    #: The actor that owns ``/v1/sessions`` routes.
    dispatch: str = "dispatch"
    dispatch_timeout_s: Positive = 60.0
    #: The actor that owns a session's resources (terminals).
    tools: str = "tools"
    #: Deadline of ``POST .../mcp/execute``, which lasts as long as the tool runs.
    tool_timeout_s: Positive = 900.0
    #: A session stream sends ``session.heartbeat`` after this much silence.
    heartbeat_s: Positive = 15.0
    backoff_base_s: Positive = 0.5
    backoff_cap_s: Positive = 10.0
    connect_timeout_s: Positive = 10.0
    #: WebSocket-level pings to the server; no pong within the timeout drops the tunnel.
    ping_interval_s: Positive = 30.0
    ping_timeout_s: Positive = 90.0
    #: Incoming frames larger than this (in characters) are refused.
    max_frame_bytes: PositiveInt = 100 * 1024 * 1024
    #: Coalescing: at most this many events / bytes in one ``response.body`` of a stream.
    sse_batch_events: PositiveInt = 64
    sse_batch_bytes: PositiveInt = 256 * 1024
    #: Undelivered events kept per session; past it the oldest are dropped (and logged).
    max_buffered_events: PositiveInt = 100_000
    #: The buffer file is compacted once it is this large and mostly delivered.
    compact_bytes: PositiveInt = 16 * 1024 * 1024
    #: Frames queued for one tunnel's writer before request tasks wait.
    send_queue: PositiveInt = 256
    #: Harness names announced in ``hello`` (default: every registered harness).
    harnesses: list[str] | None = None


class TunnelFatal(CorralError):
    """The server closed a tunnel with a code that reconnecting cannot fix (4001/4002/4004)."""

    def __init__(self, message: str, *, code: int) -> None:
        super().__init__(message)
        self.code = code


class TunnelDown(CorralError):
    """A frame was sent on a tunnel that is no longer connected."""


# --- frames (§i.2) ---------------------------------------------------------------------------


class Frame(msgspec.Struct, tag_field="kind", frozen=True, kw_only=True):
    """Base of tunnel frames: one JSON object per WebSocket text message, tagged by ``kind``."""


class HelloFrame(Frame, tag="hello"):
    runner_version: str
    frame_protocol_version: int
    harnesses: list[str]
    envs: list[str]
    telemetry_opt_out: bool


class RequestFrame(Frame, tag="request"):
    id: str
    method: str
    path: str
    query_string: str = ""
    headers: list[tuple[str, str]] = []
    body: str | None = None
    encoding: Literal["utf-8", "base64"] = "utf-8"
    stream: bool = True


class RequestCancelFrame(Frame, tag="request.cancel"):
    id: str
    reason: str = "client_disconnected"


class PingFrame(Frame, tag="ping"):
    ts: int


class PongFrame(Frame, tag="pong"):
    ts: int


class ResponseHeadFrame(Frame, tag="response.head"):
    id: str
    status: int
    headers: list[tuple[str, str]]


class ResponseBodyFrame(Frame, tag="response.body"):
    id: str
    body: str
    encoding: Literal["utf-8", "base64"]


class ResponseEndFrame(Frame, tag="response.end"):
    id: str


class WsOpenFrame(Frame, tag="ws.open"):
    ch_id: str
    path: str = ""
    query_string: str = ""


class WsDataFrame(Frame, tag="ws.frame"):
    ch_id: str
    data: str = ""
    encoding: str = "utf-8"


class WsCloseFrame(Frame, tag="ws.close"):
    ch_id: str
    code: int = 1000
    reason: str = ""


ServerFrame = (
    RequestFrame | RequestCancelFrame | PingFrame | WsOpenFrame | WsDataFrame | WsCloseFrame
)
_decode_frame = msgspec.json.Decoder(ServerFrame).decode
_encode_frame = msgspec.json.Encoder().encode
_OVERSIZED_ID = re.compile(r'"kind"\s*:\s*"request".*?"id"\s*:\s*"([^"\\]{1,128})"', re.DOTALL)


def body_encoding(headers: list[tuple[str, str]]) -> Literal["utf-8", "base64"]:
    """``utf-8`` for text, JSON, JSON lines and SSE content types, else ``base64`` (§i.2)."""
    ctype = next((v for k, v in headers if k.lower() == "content-type"), "").strip().lower()
    return "utf-8" if ctype.startswith(_TEXT_TYPES) else "base64"


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


def sse_data(event: bytes) -> str:
    """One SSE frame, ``data: <json>\\n\\n``, with ``json.dumps``'s separators (§ii.6)."""
    try:
        text = json.dumps(json.loads(event))
    except ValueError:
        text = event.decode(errors="replace")
    return f"data: {text}\n\n"


# --- the durable stream buffer ---------------------------------------------------------------

_MAGIC = b"corral-gateway-streams 1\n"
_RECORD = struct.Struct("<II")  # payload length, crc32 of the payload
_EVENT, _DONE = 0, 1
_Record = tuple[int, str, int, bytes]
_encode_record = msgspec.msgpack.Encoder().encode
_decode_record = msgspec.msgpack.Decoder(_Record).decode
#: What one pending event costs in the file, roughly (for the compaction rule).
_OVERHEAD = 48


def _record(kind: int, session_id: str, seq: int, data: bytes = b"") -> bytes:
    payload = _encode_record((kind, session_id, seq, data))
    return _RECORD.pack(len(payload), zlib.crc32(payload)) + payload


class _Session:
    __slots__ = ("done", "events", "last")

    def __init__(self) -> None:
        #: Undelivered events, oldest first: (seq, JSON bytes).
        self.events: deque[tuple[int, bytes]] = deque()
        #: The highest seq seen, and the highest one no longer pending (delivered or dropped).
        self.last = 0
        self.done = 0


class StreamBuffer:
    """Session events not yet delivered to the server, kept in ``streams.log``.

    The file holds records ``u32 length | u32 crc32 | msgpack (kind, session, seq, data)``
    after a magic line: ``kind`` 0 is an event, 1 says every event of the session up to
    ``seq`` is no longer pending (sent to the server, or dropped past the bound). Replay
    stops at the first torn or corrupt record and truncates the file there. Event records are
    written in batches and fsynced by :meth:`run` (which then acks their bus messages); the
    delivered mark is written at once when a frame was sent, so that a killed process does not
    resend it. The file is rewritten with only pending events once it is large and mostly
    delivered.
    """

    def __init__(self, path: Path, *, max_events: int, compact_bytes: int) -> None:
        self.path = path
        self.max_events = max_events
        self.compact_bytes = compact_bytes
        self.sessions: dict[str, _Session] = {}
        self.stats = {"events": 0, "duplicates": 0, "dropped": 0, "syncs": 0, "compactions": 0}
        self._fd = -1
        self._size = 0
        self._live = 0
        self._unwritten: list[bytes] = []
        self._dirty = False
        self._to_ack: list[Incoming] = []
        self._wanted = trio.Event()
        self._warned: dict[str, float] = {}

    # -- loading ---------------------------------------------------------------------------

    def load(self) -> None:
        """Rebuild the pending events from the file (repairing a torn tail) and open it."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            data = b""
        if data and not data.startswith(_MAGIC):
            aside = self.path.with_suffix(f".unreadable-{int(time.time())}")
            log.error("%s is not a stream buffer; moved it to %s", self.path, aside)
            os.replace(self.path, aside)
            data = b""
        offset = len(_MAGIC) if data else 0
        while offset + _RECORD.size <= len(data):
            length, crc = _RECORD.unpack_from(data, offset)
            payload = data[offset + _RECORD.size : offset + _RECORD.size + length]
            if len(payload) < length or zlib.crc32(payload) != crc:
                break
            try:
                kind, session_id, seq, event = _decode_record(payload)
            except msgspec.DecodeError:
                break
            if kind == _EVENT:
                self._add(session_id, seq, event)
            else:
                self._done(session_id, seq)
            offset += _RECORD.size + length
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        if not data:
            os.ftruncate(self._fd, 0)
            os.write(self._fd, _MAGIC)
            offset = len(_MAGIC)
        elif offset < len(data):
            log.warning("%s: dropped a torn tail of %d bytes", self.path, len(data) - offset)
            os.ftruncate(self._fd, offset)
        os.fsync(self._fd)
        self._size = offset
        self._unwritten.clear()
        pending = self.pending_count()
        if pending:
            log.info("stream buffer: %d undelivered events of %d sessions", pending, len(self))

    def __len__(self) -> int:
        return sum(1 for s in self.sessions.values() if s.events)

    def pending_count(self) -> int:
        return sum(len(s.events) for s in self.sessions.values())

    # -- the event path --------------------------------------------------------------------

    def add(self, session_id: str, seq: int, event: bytes) -> bool:
        """Keep an event; False (and nothing kept) if it is not newer than the last one."""
        if not self._add(session_id, seq, event):
            self.stats["duplicates"] += 1
            return False
        self.stats["events"] += 1
        self._wanted.set()
        return True

    def _add(self, session_id: str, seq: int, event: bytes) -> bool:
        s = self.sessions.get(session_id)
        if s is None:
            s = self.sessions[session_id] = _Session()
        if seq <= s.last or seq <= s.done:
            return False
        s.last = seq
        s.events.append((seq, event))
        self._unwritten.append(_record(_EVENT, session_id, seq, event))
        self._live += len(event) + _OVERHEAD
        if len(s.events) > self.max_events:
            dropped, data = s.events.popleft()
            self._live -= len(data) + _OVERHEAD
            s.done = dropped
            self._unwritten.append(_record(_DONE, session_id, dropped))
            self.stats["dropped"] += 1
            self._warn_dropped(session_id)
        return True

    def ack_when_synced(self, incoming: Incoming) -> None:
        """Ack a bus message once the records written so far are fsynced."""
        self._to_ack.append(incoming)
        self._wanted.set()

    def has_pending(self, session_id: str) -> bool:
        s = self.sessions.get(session_id)
        return bool(s and s.events)

    def pending_in(self, session_id: str) -> int:
        s = self.sessions.get(session_id)
        return len(s.events) if s else 0

    def take(self, session_id: str, max_events: int, max_bytes: int) -> list[tuple[int, bytes]]:
        """The oldest pending events of a session (they stay pending until :meth:`delivered`)."""
        s = self.sessions.get(session_id)
        out: list[tuple[int, bytes]] = []
        size = 0
        for seq, event in s.events if s else ():
            if out and (len(out) >= max_events or size + len(event) > max_bytes):
                break
            out.append((seq, event))
            size += len(event)
        return out

    def delivered(self, session_id: str, seq: int) -> None:
        """Every event of the session up to ``seq`` reached the kernel: never send it again."""
        s = self.sessions.get(session_id)
        if s is None or seq <= s.done:
            return
        self._done(session_id, seq)
        self._write(_record(_DONE, session_id, seq))

    def _done(self, session_id: str, seq: int) -> None:
        s = self.sessions.get(session_id)
        if s is None:
            s = self.sessions[session_id] = _Session()
        s.done = max(s.done, seq)
        s.last = max(s.last, seq)
        while s.events and s.events[0][0] <= s.done:
            self._live -= len(s.events.popleft()[1]) + _OVERHEAD

    def _warn_dropped(self, session_id: str) -> None:
        now = time.monotonic()
        if now - self._warned.get(session_id, -math.inf) > 10:
            self._warned[session_id] = now
            log.warning(
                "session %s: more than %d undelivered events; dropping the oldest",
                session_id,
                self.max_events,
            )

    # -- writing ---------------------------------------------------------------------------

    def _write(self, extra: bytes = b"") -> None:
        if self._unwritten:
            extra = b"".join(self._unwritten) + extra
            self._unwritten.clear()
        if extra:
            os.write(self._fd, extra)
            self._size += len(extra)
            self._dirty = True

    async def run(self, ack: Callable[[Incoming], None]) -> None:
        """Write, fsync (one round at a time, so rounds group), ack, compact; forever."""
        while True:
            await self._wanted.wait()
            self._wanted = trio.Event()
            self._write()
            acks, self._to_ack = self._to_ack, []
            if self._dirty:
                self._dirty = False
                await trio.to_thread.run_sync(os.fsync, self._fd)
                self.stats["syncs"] += 1
            for incoming in acks:
                ack(incoming)
            if self._size > self.compact_bytes and self._size > 4 * self._live:
                self.compact()

    def compact(self) -> None:
        """Rewrite the file with only what replay needs (synchronous: nothing interleaves)."""
        self._write()
        parts = [_MAGIC]
        for session_id, s in self.sessions.items():
            if s.done:
                parts.append(_record(_DONE, session_id, s.done))
            parts.extend(_record(_EVENT, session_id, seq, ev) for seq, ev in s.events)
        data = b"".join(parts)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self._size = len(data)
        self.stats["compactions"] += 1

    def close(self) -> None:
        """Write and fsync what is pending, and close the file."""
        if self._fd < 0:
            return
        self._write()
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = -1


# --- one tunnel ------------------------------------------------------------------------------


class _Outgoing:
    """A frame queued for a tunnel's writer; ``sent`` is set once it was sent or dropped."""

    __slots__ = ("on_sent", "sent", "text")

    def __init__(self, text: str, on_sent: Callable[[], None] | None, wait: bool) -> None:
        self.text = text
        self.on_sent = on_sent
        self.sent = trio.Event() if wait else None


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

    async def text(self, text: str, on_sent: Callable[[], None] | None = None) -> None:
        """Send a UTF-8 body piece; with ``on_sent``, wait until it was sent (or dropped)."""
        frame = ResponseBodyFrame(id=self.id, body=text, encoding="utf-8")
        await self.tunnel.send(frame, on_sent=on_sent, wait=on_sent is not None)

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
        self.requests: dict[str, trio.CancelScope] = {}
        self.stats = dict.fromkeys(
            ("frames_in", "frames_out", "requests", "malformed", "oversized"), 0
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
            "requests_in_flight": len(self.requests),
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
            try:
                connected_for = await self._connect_and_serve()
                error = self._drop_reason or "the server closed the tunnel"
            except TunnelFatal as exc:
                self.close_code = exc.code
                self._set_state("fatal", str(exc))
                log.error("tunnel %s: %s; not reconnecting", self.runner_id, exc)
                return
            except ConnectionRejected as exc:
                error = f"the server refused the tunnel upgrade with HTTP {exc.status_code}"
            except HandshakeError as exc:
                cause = exc.__cause__ or exc
                error = f"cannot connect to {self.url}: {cause or type(cause).__name__}"
            except (ConnectionClosed, OSError, trio.BrokenResourceError) as exc:
                error = f"the tunnel broke: {type(exc).__name__}: {exc}"
            except Exception as exc:
                log.exception("tunnel %s: unexpected failure", self.runner_id)
                error = f"internal error: {type(exc).__name__}: {exc}"
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
                await self._serve(ws)
            finally:
                if ws.closed is None:
                    # Stopping (or dropping the connection on our side): close it cleanly.
                    with trio.CancelScope(shield=True), trio.move_on_after(1):
                        reason = (self._drop_reason or "runner shutting down")[:120]
                        await ws.aclose(1000, reason)
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
                self._drop_reason = (
                    f"the tunnel closed with {reason.code} ({reason.reason or reason.name})"
                )
        return time.monotonic() - started

    async def _serve(self, ws: WebSocketConnection) -> None:
        hello = HelloFrame(
            runner_version=__version__,
            frame_protocol_version=FRAME_PROTOCOL_VERSION,
            harnesses=self.gateway.harnesses,
            envs=[],
            telemetry_opt_out=True,
        )
        try:
            await ws.send_message(_encode_frame(hello).decode())
        except ConnectionClosed:
            return  # closed right after the upgrade (4004 comes so); the caller reads why
        self.connects += 1
        self._set_state("connected")
        log.info("tunnel %s: connected to %s", self.runner_id, self.url)
        out, queue = trio.open_memory_channel[_Outgoing](self.options.send_queue)
        self._out = out
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._writer, ws, queue, nursery.cancel_scope)
                nursery.start_soon(self._pinger, ws, nursery.cancel_scope)
                await self._reader(ws, nursery)
                nursery.cancel_scope.cancel()
        finally:
            self._out = None
            self.requests.clear()

    async def _writer(
        self,
        ws: WebSocketConnection,
        queue: trio.MemoryReceiveChannel[_Outgoing],
        scope: trio.CancelScope,
    ) -> None:
        # The only task that writes frames, so a cancelled request never cuts one in half.
        item: _Outgoing | None = None
        try:
            async for item in queue:
                await ws.send_message(item.text)
                self.stats["frames_out"] += 1
                if item.on_sent is not None:
                    try:
                        item.on_sent()
                    except Exception:
                        log.exception("tunnel %s: a sent-callback failed", self.runner_id)
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

    async def send(
        self, frame: Frame, *, on_sent: Callable[[], None] | None = None, wait: bool = False
    ) -> None:
        """Queue a frame for the writer; with ``wait``, return once it was sent or dropped."""
        out = self._out
        if out is None:
            raise TunnelDown(f"tunnel {self.runner_id} is not connected")
        item = _Outgoing(_encode_frame(frame).decode(), on_sent, wait)
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
            frame = _decode_frame(raw)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self._malformed(str(exc), raw[:200])
            return
        if isinstance(frame, RequestFrame):
            if frame.id in self.requests:
                self._malformed(f"request id {frame.id!r} is already in flight", raw[:200])
                return
            scope = self.requests[frame.id] = trio.CancelScope()
            nursery.start_soon(self._request, frame, scope)
        elif isinstance(frame, PingFrame):
            await self.send(PongFrame(ts=frame.ts))
        elif isinstance(frame, RequestCancelFrame):
            cancelled = self.requests.get(frame.id)
            if cancelled is not None:
                log.info(
                    "tunnel %s: request %s cancelled (%s)", self.runner_id, frame.id, frame.reason
                )
                cancelled.cancel()
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

    async def _refuse_oversized(self, raw: str) -> None:
        self.stats["oversized"] += 1
        limit = self.options.max_frame_bytes
        match = _OVERSIZED_ID.search(raw[:2048])
        log.warning(
            "tunnel %s: refusing a %d-character frame (limit %d)%s",
            self.runner_id,
            len(raw),
            limit,
            f" for request {match.group(1)}" if match else "",
        )
        if match:
            response = json_response(
                413,
                {
                    "error": "payload_too_large",
                    "detail": f"The request frame is larger than this runner's limit of {limit}.",
                },
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
                        await responder.respond(
                            json_response(500, {"error": "runner_dispatch_failed"})
                        )
                    elif not responder.ended:
                        await responder.end()
        except TunnelDown:
            pass
        finally:
            if self.requests.get(frame.id) is scope:
                del self.requests[frame.id]


# --- the actor -------------------------------------------------------------------------------


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

    @handles(SessionEvent)
    async def session_event(self, msg: SessionEvent, incoming: Incoming) -> None:
        if self.buffer.add(msg.session_id, msg.seq, msg.event):
            incoming.deferred = True
            self.buffer.ack_when_synced(incoming)
            self._notify(msg.session_id)

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
        # checkpoint lets the actor loop take one more message; an idle inbox stops at once,
        # so a lone event is never held back.
        inbox = self.peer.inbox
        for _ in range(opts.sse_batch_events):
            if not inbox.statistics().current_buffer_used:
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
