"""A fake OpenAI-compatible server for tests: Responses and Chat Completions over SSE.

It runs inside the test's trio loop on 127.0.0.1 and answers each request with the next
scripted :class:`Reply` (HTTP 500 "no reply scripted" once the script runs out). A reply can
stream SSE frames as chunked HTTP, hang after some frames until the client goes away, or drop
the connection mid-body. Every request is recorded with its parsed JSON body, the
(monotonic) time it arrived and an event set once the client closed the connection.

The ``*_events`` helpers build the frames a real provider sends for a text answer or a tool
call, so tests say what the model answers, not how the wire looks.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import trio

from tests._http11 import read_request, until_eof

NO_REPLY = 500


@dataclass
class Reply:
    """One scripted answer.

    ``hang_after``: after that many frames, wait until the client closes the connection.
    ``drop_after``: after that many frames, close the connection without ending the body.
    ``pace_s``: pause between frames (pacing for the turn watchdog, never synchronisation).
    """

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    frames: list[bytes] = field(default_factory=list)
    hang_after: int | None = None
    drop_after: int | None = None
    pace_s: float = 0.0

    @property
    def streaming(self) -> bool:
        return self.status == 200 and not self.body


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    json: Any
    received_at: float
    closed: trio.Event = field(default_factory=trio.Event)
    #: Which of the server's connections it came on (counted from 1).
    connection: int = 0


def error(status: int, message: str, **headers: str) -> Reply:
    """A provider error with OpenAI's JSON error body."""
    body = json.dumps({"error": {"message": message, "type": "error", "code": None}})
    return Reply(status=status, headers=headers, body=body.encode())


def sse(data: dict[str, Any] | str, event: str | None = None) -> bytes:
    """One SSE frame."""
    payload = data if isinstance(data, str) else json.dumps(data)
    return (f"event: {event}\n" if event else "").encode() + f"data: {payload}\n\n".encode()


def _typed(obj: dict[str, Any]) -> bytes:
    return sse(obj, obj["type"])


def responses_events(
    model: str,
    deltas: list[str] = (),  # type: ignore[assignment]
    *,
    calls: list[tuple[str, str, str]] = (),  # type: ignore[assignment]  (call_id, name, args)
    usage: tuple[int, int] = (10, 5),
    added: bool = False,
    custom: list[tuple[str, str, str]] = (),  # type: ignore[assignment]  (call_id, name, input)
    reasoning: list[str] = (),  # type: ignore[assignment]
) -> list[bytes]:
    """A Responses stream: created, text deltas, function calls, completed with usage.

    ``added``: announce the message with ``response.output_item.added`` and name it in each
    delta (``item_id``), as OpenAI does; the Codex CLI drops deltas of an item it was not told
    of. ``custom``: calls of custom (freeform) tools, such as Codex's ``apply_patch``.
    ``reasoning``: a reasoning item's summary, streamed first in these pieces.
    """
    response = {"id": "resp_fake", "object": "response", "model": model, "output": []}
    frames = [_typed({"type": "response.created", "response": {**response, "status": "queued"}})]
    output: list[dict[str, Any]] = []
    if reasoning:
        thought: dict[str, Any] = {"type": "reasoning", "id": "rs_fake", "summary": []}
        at = {"item_id": "rs_fake", "output_index": 0, "summary_index": 0}
        frames.append(
            _typed({"type": "response.output_item.added", "output_index": 0, "item": thought})
        )
        frames += [
            _typed({"type": "response.reasoning_summary_text.delta", **at, "delta": piece})
            for piece in reasoning
        ]
        summary = [{"type": "summary_text", "text": "".join(reasoning)}]
        thought = {**thought, "summary": summary}
        output.append(thought)
        frames.append(
            _typed({"type": "response.output_item.done", "output_index": 0, "item": thought})
        )
    if deltas:
        if added:
            item0 = {
                "type": "message",
                "id": "msg_fake",
                "role": "assistant",
                "status": "in_progress",
                "content": [],
            }
            frames.append(
                _typed({"type": "response.output_item.added", "output_index": 0, "item": item0})
            )
        for d in deltas:
            frames.append(
                _typed(
                    {
                        "type": "response.output_text.delta",
                        "delta": d,
                        "item_id": "msg_fake",
                        "output_index": 0,
                        "content_index": 0,
                    }
                )
            )
        text = "".join(deltas)
        message = {
            "type": "message",
            "id": "msg_fake",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
        output.append(message)
        frames.append(_typed({"type": "response.output_item.done", "item": message}))
    tools = [("function_call", "arguments", call) for call in calls]
    tools += [("custom_tool_call", "input", call) for call in custom]
    for kind, field_name, (call_id, name, value) in tools:
        item = {
            "type": kind,
            "id": f"fc_{call_id}",
            "call_id": call_id,
            "name": name,
            field_name: value,
            "status": "completed",
        }
        output.append(item)
        frames.append(_typed({"type": "response.output_item.done", "item": item}))
    tokens = {"input_tokens": usage[0], "output_tokens": usage[1], "total_tokens": sum(usage)}
    done = {**response, "status": "completed", "output": output, "usage": tokens}
    frames.append(_typed({"type": "response.completed", "response": done}))
    return frames


def chat_events(
    model: str,
    deltas: list[str] = (),  # type: ignore[assignment]
    *,
    calls: list[tuple[str, str, str]] = (),  # type: ignore[assignment]
    usage: tuple[int, int] = (10, 5),
    reasoning: list[str] = (),  # type: ignore[assignment]
) -> list[bytes]:
    """A Chat Completions stream: content deltas, tool calls split across chunks (by index),
    a finish_reason, a usage chunk and ``[DONE]``. ``reasoning``: streamed first, as
    ``reasoning_content`` deltas (llama.cpp's and DeepSeek's field)."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return sse({"id": "chatcmpl-fake", "model": model, "choices": [choice]})

    frames = [chunk({"role": "assistant", "content": ""})]
    frames += [chunk({"reasoning_content": r}) for r in reasoning]
    frames += [chunk({"content": d}) for d in deltas]
    for index, (call_id, name, args) in enumerate(calls):
        head = {"index": index, "id": call_id, "type": "function", "function": {"name": name}}
        head["function"]["arguments"] = ""
        frames.append(chunk({"tool_calls": [head]}))
        half = len(args) // 2
        for piece in (args[:half], args[half:]):
            frames.append(
                chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            )
    frames.append(chunk({}, "tool_calls" if calls else "stop"))
    tokens = {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}
    frames.append(sse({"id": "chatcmpl-fake", "model": model, "choices": [], "usage": tokens}))
    frames.append(sse("[DONE]"))
    return frames


class FakeOpenAI:
    """The server. ``await server.start(nursery)``, then point ``base_url`` at it."""

    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.requests: list[Request] = []
        self.port = 0
        self.connections = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def queue(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    def no_reply(self) -> Reply:
        """The answer once the script ran out."""
        return error(NO_REPLY, "no reply")

    async def start(self, nursery: trio.Nursery) -> None:
        listeners = await nursery.start(trio.serve_tcp, self._connection, 0)
        self.port = listeners[0].socket.getsockname()[1]

    async def _connection(self, stream: trio.SocketStream) -> None:
        mine: list[Request] = []
        buffer = bytearray()
        self.connections += 1
        connection = self.connections
        try:
            while True:
                request = await self._read_request(stream, buffer)
                if request is None:
                    return
                request.connection = connection
                mine.append(request)
                self.requests.append(request)
                reply = self.replies.popleft() if self.replies else self.no_reply()
                if not await self._send(stream, reply):
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        finally:
            for request in mine:
                request.closed.set()
            await trio.aclose_forcefully(stream)

    async def _read_request(self, stream: trio.SocketStream, buffer: bytearray) -> Request | None:
        raw = await read_request(stream, buffer)
        if raw is None:
            return None
        payload = json.loads(raw.body) if raw.body else None
        return Request(raw.method, raw.target, dict(raw.headers), payload, trio.current_time())

    async def _send(self, stream: trio.SocketStream, reply: Reply) -> bool:
        """Send ``reply``; False if the connection is finished afterwards."""
        if not reply.streaming:
            head = _head(reply.status, {"content-type": "application/json", **reply.headers})
            head += f"content-length: {len(reply.body)}\r\n\r\n".encode()
            await stream.send_all(head + reply.body)
            return True
        headers = {"content-type": "text/event-stream", "transfer-encoding": "chunked"}
        await stream.send_all(_head(200, {**headers, **reply.headers}) + b"\r\n")
        for n, frame in enumerate(reply.frames):
            if n == reply.hang_after:
                await until_eof(stream)
                return False
            if n == reply.drop_after:
                return False
            if reply.pace_s:
                await trio.sleep(reply.pace_s)
            await stream.send_all(f"{len(frame):x}\r\n".encode() + frame + b"\r\n")
        if reply.hang_after is not None:
            await until_eof(stream)
            return False
        if reply.drop_after is not None:
            return False
        await stream.send_all(b"0\r\n\r\n")
        return True


def _head(status: int, headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} X"] + [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n").encode()
