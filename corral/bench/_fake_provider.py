"""A model provider on 127.0.0.1 for the CLI harness benchmark: every request gets the same
streamed answer at once, so what is measured is the CLI and corral, not a model.

It reads HTTP/1.1 requests (keep-alive, ``content-length`` bodies) and answers each with
``200 text/event-stream``, the kind's SSE frames sent chunked. It runs in the benchmark's
trio loop; nothing of it leaves the machine.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import trio


def sse(event: dict[str, Any]) -> bytes:
    """One SSE frame whose ``event:`` is the object's ``type``."""
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


def anthropic_text(model: str, pieces: list[str]) -> list[bytes]:
    """A Messages API stream answering ``pieces`` as one text block."""
    usage = {"input_tokens": 10, "output_tokens": len(pieces)}
    message = {"id": "msg_bench", "type": "message", "role": "assistant", "model": model}
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": {**message, "content": [], "usage": usage}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    ]
    events += [
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}}
        for p in pieces
    ]
    events += [
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": usage},
        {"type": "message_stop"},
    ]
    return [sse(e) for e in events]


def responses_text(model: str, pieces: list[str]) -> list[bytes]:
    """A Responses API stream answering ``pieces`` as one message, its deltas naming the item
    ``response.output_item.added`` announced (the Codex CLI drops deltas of an unannounced
    item)."""
    item: dict[str, Any] = {"type": "message", "id": "msg_bench", "role": "assistant"}
    part = {"type": "output_text", "text": "".join(pieces), "annotations": []}
    done = {**item, "status": "completed", "content": [part]}
    item["content"] = []
    usage = {"input_tokens": 10, "output_tokens": len(pieces), "total_tokens": 10 + len(pieces)}
    response = {"id": "resp_bench", "object": "response", "model": model}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": {**response, "status": "in_progress"}},
        {"type": "response.output_item.added", "output_index": 0, "item": item},
    ]
    events += [
        {"type": "response.output_text.delta", "item_id": "msg_bench", "output_index": 0,
         "content_index": 0, "delta": p}
        for p in pieces
    ]  # fmt: skip
    events += [
        {"type": "response.output_item.done", "output_index": 0, "item": done},
        {
            "type": "response.completed",
            "response": {**response, "status": "completed", "output": [done], "usage": usage},
        },
    ]
    return [sse(e) for e in events]


def chat_text(model: str, pieces: list[str]) -> list[bytes]:
    """A Chat Completions stream answering ``pieces``: content deltas, a finish, a usage
    chunk and ``[DONE]`` (its frames carry no ``event:`` line, as OpenAI's do not)."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return {"id": "chatcmpl-bench", "model": model, "choices": [choice]}

    usage = {"prompt_tokens": 10, "completion_tokens": len(pieces)}
    events = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": p}) for p in pieces]
    events += [chunk({}, "stop"), {"id": "chatcmpl-bench", "choices": [], "usage": usage}]
    frames = [f"data: {json.dumps(e)}\n\n".encode() for e in events]
    return [*frames, b"data: [DONE]\n\n"]


class FakeProvider:
    """``await provider.start(nursery)``; every request is answered with ``frames``, at once
    or, with ``pace_s``, one frame every ``pace_s`` seconds (a model streaming at its pace)."""

    def __init__(self, frames: list[bytes], *, pace_s: float = 0.0) -> None:
        self.frames = frames
        self.pace_s = pace_s
        self.port = 0
        self.requests = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, nursery: trio.Nursery) -> None:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, self._serve, 0, host="127.0.0.1")
        )
        self.port = listeners[0].socket.getsockname()[1]

    async def _serve(self, stream: trio.SocketStream) -> None:
        buffer = bytearray()
        try:
            while await _read_request(stream, buffer):
                self.requests += 1
                head = (
                    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    "transfer-encoding: chunked\r\n\r\n"
                )
                chunks = [f"{len(f):x}\r\n".encode() + f + b"\r\n" for f in self.frames]
                if not self.pace_s:
                    await stream.send_all(head.encode() + b"".join(chunks) + b"0\r\n\r\n")
                    continue
                await stream.send_all(head.encode())
                for chunk in chunks:
                    await stream.send_all(chunk)
                    await trio.sleep(self.pace_s)
                await stream.send_all(b"0\r\n\r\n")
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await trio.aclose_forcefully(stream)


async def _read_request(stream: trio.SocketStream, buffer: bytearray) -> bool:
    """Read one request (head and body) off ``stream``; False once the client closed it."""
    while b"\r\n\r\n" not in buffer:
        data = await stream.receive_some()
        if not data:
            return False
        buffer += data
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(rest) < length:
        data = await stream.receive_some()
        if not data:
            return False
        rest += data
    buffer[:] = rest[length:]
    return True
