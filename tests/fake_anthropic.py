"""A fake Anthropic Messages API for tests: ``POST /v1/messages`` answered over SSE.

Claude Code, pointed at it with ``ANTHROPIC_BASE_URL`` (no ``/v1``), sends only
``POST /v1/messages?beta=true`` with ``stream: true`` (HARNESS_CLIS.md). The server is
:class:`tests.fake_openai.FakeOpenAI`'s — the same scripted replies, hangs, drops and recorded
requests, on 127.0.0.1 in the test's trio loop — with Anthropic's error body; the
:func:`message_events` helper builds the frames a real provider streams for an answer
(thinking, text, tool calls) so tests say what the model answers, not how the wire looks.
"""

from __future__ import annotations

import json
from typing import Any

from tests.fake_openai import FakeOpenAI, Reply, Request, sse

__all__ = ["FakeAnthropic", "Reply", "Request", "error", "message_events", "text_reply"]

MODEL = "claude-fake-1"


def error(status: int, message: str, **headers: str) -> Reply:
    """A provider error with Anthropic's JSON error body."""
    body = {"type": "error", "error": {"type": "api_error", "message": message}}
    return Reply(status=status, headers=headers, body=json.dumps(body).encode())


def _frame(obj: dict[str, Any]) -> bytes:
    return sse(obj, obj["type"])


def message_events(
    deltas: list[str] = (),  # type: ignore[assignment]
    *,
    thinking: list[str] = (),  # type: ignore[assignment]
    calls: list[tuple[str, str, dict[str, Any]]] = (),  # type: ignore[assignment]
    model: str = MODEL,
    usage: tuple[int, int] = (10, 5),
) -> list[bytes]:
    """A streamed message: ``message_start``, a thinking block, a text block, one
    ``tool_use`` block per ``(id, name, input)`` call (its input split over two
    ``input_json_delta`` frames), ``message_delta`` with the stop reason and usage,
    ``message_stop``."""
    message = {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": usage[0], "output_tokens": 1},
    }
    frames = [_frame({"type": "message_start", "message": message})]
    blocks: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
    if thinking:
        deltas_ = [{"type": "thinking_delta", "thinking": t} for t in thinking]
        deltas_.append({"type": "signature_delta", "signature": "c2ln"})
        blocks.append(({"type": "thinking", "thinking": "", "signature": ""}, deltas_))
    if deltas:
        texts = [{"type": "text_delta", "text": d} for d in deltas]
        blocks.append(({"type": "text", "text": ""}, texts))
    for call_id, name, arguments in calls:
        raw = json.dumps(arguments)
        half = len(raw) // 2
        pieces = [{"type": "input_json_delta", "partial_json": p} for p in (raw[:half], raw[half:])]
        blocks.append(({"type": "tool_use", "id": call_id, "name": name, "input": {}}, pieces))
    for index, (block, block_deltas) in enumerate(blocks):
        start = {"type": "content_block_start", "index": index, "content_block": block}
        frames.append(_frame(start))
        for delta in block_deltas:
            frames.append(_frame({"type": "content_block_delta", "index": index, "delta": delta}))
        frames.append(_frame({"type": "content_block_stop", "index": index}))
    stop = "tool_use" if calls else "end_turn"
    frames.append(
        _frame(
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"input_tokens": usage[0], "output_tokens": usage[1]},
            }
        )
    )
    frames.append(_frame({"type": "message_stop"}))
    return frames


def text_reply(*deltas: str, **kwargs: Any) -> Reply:
    """A reply streaming ``deltas`` as one text answer."""
    return Reply(frames=message_events(list(deltas), **kwargs))


class FakeAnthropic(FakeOpenAI):
    """The server. ``await server.start(nursery)``, then point ``ANTHROPIC_BASE_URL`` at
    :attr:`base_url`."""

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def no_reply(self) -> Reply:
        return error(500, "no reply scripted")
