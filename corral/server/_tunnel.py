"""The server's end of a runner tunnel (PROTOCOL_FACTS §i, §ii).

After the handshake (checked by the HTTP layer) a :class:`RunnerLink` owns the WebSocket: it
reads every frame, answers liveness, and multiplexes HTTP requests to the runner by id, the way
the real server's httpx-over-tunnel client does. A request is a ``request`` frame; its answer
comes back as ``response.head``, any number of ``response.body`` frames (``utf-8`` or
``base64``) and ``response.end``, interleaved freely with other requests' frames.

:meth:`RunnerLink.request` waits for a whole answer; :meth:`RunnerLink.open` yields a
:class:`TunnelCall` as soon as the head arrived, for answers that stream (``GET .../stream``
never ends while the tunnel is up). When the link goes down, every call still waiting raises
:class:`RunnerGone`, so no caller waits for an answer that can no longer come.

Liveness (§i.3): an app-level ``ping`` every ``ping_interval_s``; a link on which no frame at
all arrived for ``ping_timeout_s`` is closed with 4003 ``"ping timeout"``.

Event ingest (PROTOCOL_0_19 §A.3): a runner whose ``hello`` lists ``session-event-ingest-v1``
gets ``{"kind": "event.ready"}`` before any request, and may then send ``event.batch`` frames
(the tunnel form of ``POST /v1/sessions/{id}/events``). Batches are handed, in order, to the
link's ``on_batch`` handler, whose answer goes back as the ``event.ack``; a runner that sends
more than :data:`MAX_QUEUED_BATCHES` before they are applied is told ``busy`` (retryable).
"""

from __future__ import annotations

import base64
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager, suppress
from typing import Any, Literal, TypedDict

import msgspec
import trio
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from .._exceptions import CorralError
from .._jsonlines import JsonObject

__all__ = [
    "EVENT_INGEST_CAPABILITY",
    "FRAME_PROTOCOL_VERSION",
    "RunnerGone",
    "RunnerLink",
    "SseParser",
    "TunnelCall",
    "TunnelResponse",
    "event_ack",
]

log = logging.getLogger("corral.server.tunnel")

FRAME_PROTOCOL_VERSION = 1
#: The hello capability that asks for ``event.ready`` and allows ``event.batch`` (§A.3).
EVENT_INGEST_CAPABILITY = "session-event-ingest-v1"
#: Batches waiting to be applied before a runner is told ``busy`` (the real server allows 2
#: per runner; a few more cost nothing here).
MAX_QUEUED_BATCHES = 16


class EventAck(TypedDict):
    """The ``event.ack`` frame of an ``event.batch``."""

    kind: Literal["event.ack"]
    id: Any
    applied: int
    error: str | None
    retryable: bool


#: Applies one ``event.batch`` frame; returns its ``event.ack`` frame.
BatchHandler = Callable[[JsonObject], Awaitable[EventAck]]
#: The headers the server's HTTP client puts on every tunnelled request (§ii).
_BASE_HEADERS = [
    ["host", "runner"],
    ["accept", "*/*"],
    ["accept-encoding", "gzip, deflate, zstd"],
    ["connection", "keep-alive"],
    ["user-agent", "corral-control-plane"],
]


class RunnerGone(CorralError):
    """The runner's tunnel closed (or was never there) before the answer arrived."""


class TunnelResponse(msgspec.Struct, frozen=True, kw_only=True):
    """A whole answer to a tunnelled request."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def json(self) -> Any:
        """The body as JSON (None when empty or not JSON)."""
        if not self.body.strip():
            return None
        try:
            return json.loads(self.body)
        except ValueError:
            return None


class TunnelCall:
    """One request in flight: its head, then body chunks, then the end."""

    def __init__(self, request_id: str) -> None:
        self.id = request_id
        self.status: int | None = None
        self.headers: list[tuple[str, str]] = []
        self.head_seen = trio.Event()
        self.ended = False
        self.error: str | None = None
        self._send, self._receive = trio.open_memory_channel[bytes](math.inf)

    def on_head(self, status: int, headers: list[tuple[str, str]]) -> None:
        """``response.head`` arrived."""
        self.status, self.headers = status, headers
        self.head_seen.set()

    def on_body(self, data: bytes) -> None:
        """A ``response.body`` arrived (decoded)."""
        self._send.send_nowait(data)

    def on_end(self) -> None:
        """``response.end`` arrived."""
        self.ended = True
        self.head_seen.set()
        self._send.close()

    def fail(self, why: str) -> None:
        """The link dropped before the end; waiters get :class:`RunnerGone`."""
        if not self.ended:
            self.error = why
            self.head_seen.set()
            self._send.close()

    async def next_chunk(self) -> bytes | None:
        """The next body chunk, or None at the end.

        Raises:
            RunnerGone: the link dropped before the end.
        """
        try:
            return await self._receive.receive()
        except trio.EndOfChannel:
            if self.error is not None:
                raise RunnerGone(self.error) from None
            return None

    async def read(self, limit: int) -> bytes:
        """The whole body (at most ``limit`` bytes, else :class:`RunnerGone` is raised)."""
        body = bytearray()
        while (chunk := await self.next_chunk()) is not None:
            body += chunk
            if len(body) > limit:
                raise RunnerGone(f"the runner's answer is over {limit} bytes")
        return bytes(body)


class SseParser:
    """Incremental parser of the runner's ``data: <json>\\n\\n`` stream (§ii.6).

    Chunks may hold several events (coalesced) or a part of one (a big event cut into
    frames); :meth:`feed` returns every event completed so far. ``data: [DONE]`` sets
    :attr:`done`. An ``id:`` line is the event's ``seq`` in the runner's stream (corral's
    gateway sends one on a stream opened with ``Last-Event-ID``); :attr:`last_id` is the
    highest seen, also of events that are not kept. Other lines (comments, ``event:``) are
    ignored.
    """

    def __init__(self, max_event_bytes: int = 64 * 1024 * 1024) -> None:
        self.max_event_bytes = max_event_bytes
        self.done = False
        self.malformed = 0
        self.last_id: int | None = None
        self._buffer = ""

    def feed(self, text: str) -> list[JsonObject]:
        """Add a chunk of stream text; returns the events it completed."""
        return [event for _, event in self.feed_with_ids(text)]

    def feed_with_ids(self, text: str) -> list[tuple[int | None, JsonObject]]:
        """Like :meth:`feed`, each event with its ``id`` (None when it has none)."""
        # Search only the new text (and the character before it): a big event arriving in
        # many frames is then scanned once, not once per frame.
        start = max(len(self._buffer) - 1, 0)
        self._buffer += text.replace("\r\n", "\n")
        events: list[tuple[int | None, JsonObject]] = []
        while (end := self._buffer.find("\n\n", start)) != -1:
            block, self._buffer = self._buffer[:end], self._buffer[end + 2 :]
            start = 0
            lines = block.split("\n")
            seq = _event_id(lines)
            if seq is not None:
                self.last_id = seq if self.last_id is None else max(self.last_id, seq)
            data = "\n".join(
                line[5:].removeprefix(" ") for line in lines if line.startswith("data:")
            )
            if not data:
                continue
            if data.strip() == "[DONE]":
                self.done = True
                continue
            try:
                event = json.loads(data)
            except ValueError:
                event = None
            if not isinstance(event, dict) or not isinstance(event.get("type"), str):
                self.malformed += 1
                log.warning(
                    "ignoring a runner stream event that is not a typed object: %.200r", data
                )
                continue
            events.append((seq, event))
        if len(self._buffer) > self.max_event_bytes:
            raise RunnerGone(f"a runner stream event is over {self.max_event_bytes} bytes")
        return events


def _event_id(lines: list[str]) -> int | None:
    """The integer ``id:`` of an SSE block, if it has one."""
    for line in lines:
        if line.startswith("id:"):
            text = line[3:].strip()
            if text.isascii() and text.isdigit() and len(text) <= 18:
                return int(text)
    return None


class RunnerLink:
    """One connected runner: the WebSocket after a valid ``hello``.

    Args:
        ws: the accepted WebSocket.
        runner_id: the id the runner connected as.
        hello: its ``hello`` frame.
        on_batch: applies an ``event.batch`` (only a runner that was sent ``event.ready``
            may send one).
    """

    def __init__(
        self,
        ws: WebSocket,
        runner_id: str,
        hello: JsonObject,
        *,
        ping_interval_s: float,
        ping_timeout_s: float,
        on_batch: BatchHandler | None = None,
    ) -> None:
        self.ws = ws
        self.runner_id = runner_id
        self.hello = hello
        capabilities = hello.get("capabilities")
        self.capabilities: list[str] = capabilities if isinstance(capabilities, list) else []
        connection_id = hello.get("connection_id")
        #: The runner's id of this connection attempt (log correlation only, §A.2).
        self.connection_id = connection_id if isinstance(connection_id, str) else None
        self.on_batch = on_batch
        self.ingest = on_batch is not None and EVENT_INGEST_CAPABILITY in self.capabilities
        self._batches, self._batches_out = trio.open_memory_channel[JsonObject](MAX_QUEUED_BATCHES)
        self.ping_interval_s = ping_interval_s
        self.ping_timeout_s = ping_timeout_s
        self.connected_at = time.time()
        self.calls: dict[str, TunnelCall] = {}
        self.closed = trio.Event()
        self.close_code: int | None = None
        self.close_reason: str | None = None
        self.stats = {
            "frames_in": 0,
            "frames_out": 0,
            "requests": 0,
            "malformed": 0,
            "event_batches": 0,
        }
        self._send_lock = trio.Lock()
        self._last_frame = trio.current_time()
        self._scope: trio.CancelScope | None = None
        self._nursery: trio.Nursery | None = None

    def __repr__(self) -> str:
        return f"<RunnerLink {self.runner_id} open={not self.closed.is_set()}>"

    # -- running ---------------------------------------------------------------------------

    async def ready(self) -> None:
        """Send ``event.ready`` if the runner asked for event ingest (before any request).

        Raises:
            RunnerGone: the tunnel is already closed.
        """
        if self.ingest:
            await self.send({"kind": "event.ready"})

    async def serve(self) -> None:
        """Read frames and ping until the tunnel closes (or :meth:`close` is called)."""
        try:
            async with trio.open_nursery() as nursery:
                self._scope = nursery.cancel_scope
                self._nursery = nursery
                nursery.start_soon(self._pinger)
                if self.ingest:
                    nursery.start_soon(self._apply_batches)
                await self._reader()
                nursery.cancel_scope.cancel()
        finally:
            self._gone("the runner's tunnel closed")

    async def _apply_batches(self) -> None:
        assert self.on_batch is not None
        async for frame in self._batches_out:
            try:
                ack = await self.on_batch(frame)
            except Exception:
                # A bug here must not end the tunnel; the runner may retry the batch.
                log.exception("runner %s: applying an event batch failed", self.runner_id)
                ack = event_ack(frame, 0, "internal error", retryable=True)
            try:
                await self.send(ack)
            except RunnerGone:
                return

    async def close(self, code: int, reason: str) -> None:
        """Close the tunnel with ``code`` (no-op when already closed)."""
        if self.closed.is_set():
            return
        self.close_code, self.close_reason = code, reason
        with trio.move_on_after(5, shield=True) as waited:
            async with self._send_lock:
                if self.ws.application_state == WebSocketState.CONNECTED:
                    with suppress(WebSocketDisconnect, RuntimeError, OSError):
                        await self.ws.close(code=code, reason=reason)
        if waited.cancelled_caught:
            log.warning("runner %s: closing the tunnel took too long", self.runner_id)
        self._gone(f"the tunnel was closed ({code} {reason})")
        if self._scope is not None:
            self._scope.cancel()

    def _gone(self, why: str) -> None:
        if not self.closed.is_set():
            self.closed.set()
        calls, self.calls = self.calls, {}
        for call in calls.values():
            call.fail(why)

    async def _reader(self) -> None:
        while True:
            try:
                message = await self.ws.receive()
            except (WebSocketDisconnect, RuntimeError):
                return
            if message["type"] == "websocket.disconnect":
                self.close_code = self.close_code or message.get("code")
                return
            self._last_frame = trio.current_time()
            self.stats["frames_in"] += 1
            text = message.get("text")
            if text is None:
                self._malformed("a binary frame (frames are text)")
                continue
            try:
                frame = json.loads(text)
            except ValueError:
                self._malformed(f"not JSON: {text[:200]!r}")
                continue
            if not isinstance(frame, dict):
                self._malformed(f"not an object: {text[:200]!r}")
                continue
            self._on_frame(frame, text)

    def _on_frame(self, frame: JsonObject, text: str) -> None:
        kind = frame.get("kind")
        if kind in ("pong", "ping", "hello"):
            return  # liveness only (any frame counts); a repeated hello changes nothing
        if kind == "event.batch" and self.ingest:
            self._on_batch(frame)
            return
        if kind not in ("response.head", "response.body", "response.end"):
            if kind not in ("ws.frame", "ws.close"):
                self._malformed(f"unexpected frame kind {kind!r}")
            return
        call = self.calls.get(frame.get("id"))  # type: ignore[arg-type]
        if call is None:
            return  # the answer to a request we stopped waiting for
        try:
            if kind == "response.head":
                headers = [(str(k), str(v)) for k, v in frame.get("headers") or []]
                call.on_head(int(frame["status"]), headers)
            elif kind == "response.body":
                body = frame.get("body") or ""
                if frame.get("encoding") == "base64":
                    call.on_body(base64.b64decode(body, validate=True))
                else:
                    call.on_body(str(body).encode())
            else:
                self.calls.pop(call.id, None)
                call.on_end()
        except (KeyError, TypeError, ValueError) as exc:
            self._malformed(f"bad {kind} frame ({exc}): {text[:200]!r}")
            self.calls.pop(call.id, None)
            call.fail(f"the runner sent a malformed {kind} frame")

    def _on_batch(self, frame: JsonObject) -> None:
        self.stats["event_batches"] += 1
        if not isinstance(frame.get("id"), str) or not frame["id"]:
            self._malformed("an event.batch without an id")
            return
        try:
            self._batches.send_nowait(frame)
        except trio.WouldBlock:
            if self._nursery is not None:
                self._nursery.start_soon(
                    self._send_quietly, event_ack(frame, 0, "busy", retryable=True)
                )

    async def _send_quietly(self, frame: Mapping[str, object]) -> None:
        with suppress(RunnerGone):
            await self.send(frame)

    def _malformed(self, why: str) -> None:
        self.stats["malformed"] += 1
        if self.stats["malformed"] <= 10:
            log.warning("runner %s: ignoring a malformed frame: %s", self.runner_id, why)

    async def _pinger(self) -> None:
        while True:
            await trio.sleep(min(self.ping_interval_s, self.ping_timeout_s / 3))
            silent = trio.current_time() - self._last_frame
            if silent > self.ping_timeout_s:
                log.warning(
                    "runner %s: no frame for %.0fs; closing the tunnel", self.runner_id, silent
                )
                await self.close(4003, "ping timeout")
                return
            try:
                await self.send({"kind": "ping", "ts": int(time.time() * 1000)})
            except RunnerGone:
                return

    # -- requests --------------------------------------------------------------------------

    async def send(self, frame: Mapping[str, object]) -> None:
        """Send one frame (frames of different tasks never interleave)."""
        if self.closed.is_set():
            raise RunnerGone("the runner's tunnel is closed")
        text = json.dumps(frame)
        async with self._send_lock:
            try:
                await self.ws.send_text(text)
            except (WebSocketDisconnect, RuntimeError, OSError) as exc:
                self._gone(f"the tunnel broke while sending: {exc!r}")
                raise RunnerGone("the runner's tunnel broke") from exc
        self.stats["frames_out"] += 1

    @asynccontextmanager
    async def open(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        query: str = "",
        head_timeout_s: float = 60.0,
        headers: list[tuple[str, str]] | None = None,
    ) -> AsyncIterator[TunnelCall]:
        """Send a request (with ``headers`` besides the usual ones) and yield its call once
        the head arrived.

        On leaving, a call that has not ended is abandoned: its late frames are ignored and the
        runner gets a ``request.cancel`` (so it can stop a stream it no longer needs to send).

        Raises:
            RunnerGone: the link closed, or no head within ``head_timeout_s``.
        """
        call = TunnelCall(uuid.uuid4().hex)
        sent_headers = [list(h) for h in _BASE_HEADERS] + [list(h) for h in headers or ()]
        if body is not None:
            sent_headers += [
                ["content-length", str(len(body))],
                ["content-type", "application/json"],
            ]
        frame = {
            "kind": "request",
            "id": call.id,
            "method": method,
            "path": path,
            "query_string": query,
            "headers": sent_headers,
            "body": None if body is None else body.decode(),
            "encoding": "utf-8",
            "stream": True,
        }
        self.calls[call.id] = call
        self.stats["requests"] += 1
        try:
            await self.send(frame)
            with trio.move_on_after(head_timeout_s):
                await call.head_seen.wait()
            if call.error is not None:
                raise RunnerGone(call.error)
            if call.status is None:
                raise RunnerGone(f"no answer to {method} {path} within {head_timeout_s:g}s")
            yield call
        finally:
            if self.calls.pop(call.id, None) is not None and not self.closed.is_set():
                with trio.move_on_after(2, shield=True):
                    with suppress(RunnerGone):
                        await self.send(
                            {"kind": "request.cancel", "id": call.id, "reason": "abandoned"}
                        )

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        query: str = "",
        timeout_s: float = 60.0,
        limit: int = 64 * 1024 * 1024,
    ) -> TunnelResponse:
        """Send a request and wait for its whole answer (at most ``timeout_s`` in all).

        Raises:
            RunnerGone: the link closed, the answer did not come in time, or it is too large.
        """
        deadline = trio.current_time() + timeout_s
        with trio.move_on_at(deadline):
            async with self.open(
                method, path, body=body, query=query, head_timeout_s=timeout_s
            ) as call:
                data = await call.read(limit)
                assert call.status is not None
                return TunnelResponse(status=call.status, headers=call.headers, body=data)
        raise RunnerGone(f"no whole answer to {method} {path} within {timeout_s:g}s")


def event_ack(
    frame: Mapping[str, object], applied: int, error: str | None = None, *, retryable: bool = False
) -> EventAck:
    """The ``event.ack`` of a batch: events ``[0, applied)`` were applied (§A.3)."""
    return {
        "kind": "event.ack",
        "id": frame.get("id"),
        "applied": applied,
        "error": error,
        "retryable": retryable,
    }
