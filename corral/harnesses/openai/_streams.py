"""The two streaming APIs, read: Server-Sent Events, then Responses or Chat Completions events.

:class:`_SSEParser` cuts a ``text/event-stream`` into events; a :class:`_Reader` per API
turns them into text and reasoning deltas for the turn and one :class:`_Step`.
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any

import msgspec

from ..._jsonlines import JsonObject
from .._turn import TurnFailed
from ._conversations import _item_text
from ._step import _Step, _ToolCall

if TYPE_CHECKING:
    from ._loop import _AgentLoop

MAX_SSE_LINE = 16 * 1024 * 1024


def _redact(text: str, secret: str | None) -> str:
    return text.replace(secret, "[redacted]") if secret else text


def _json_object(data: str | bytes) -> JsonObject:
    try:
        obj = msgspec.json.decode(data)  # ~3x faster than json.loads, once per provider event
    except msgspec.DecodeError:
        try:
            obj = json.loads(data)  # what only the stdlib reads (NaN, a lone surrogate)
        except ValueError:
            obj = None
    if not isinstance(obj, dict):
        shown = data if isinstance(data, str) else data.decode("utf-8", "replace")
        raise TurnFailed("provider_protocol_error", f"not a JSON object: {shown[:200]!r}")
    return obj


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error.get("code") or json.dumps(error))
    return str(error)


class _SSEParser:
    """Incremental ``text/event-stream`` parser: bytes in, ``(event, data)`` pairs out.

    Lines end in ``\\n`` or ``\\r\\n``; ``:`` comments, ``id`` and ``retry`` are ignored.
    """

    def __init__(self) -> None:
        self._buffer = b""
        self._event = ""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[tuple[str, str]]:
        *lines, self._buffer = (self._buffer + chunk).split(b"\n")
        if len(self._buffer) > MAX_SSE_LINE:
            raise TurnFailed("provider_protocol_error", "an SSE line longer than 16 MiB")
        out: list[tuple[str, str]] = []
        for raw in lines:
            try:
                line = raw.removesuffix(b"\r").decode()
            except UnicodeDecodeError:
                raise TurnFailed("provider_protocol_error", "an SSE line is not UTF-8") from None
            if not line:
                if self._data:
                    out.append((self._event, "\n".join(self._data)))
                self._event, self._data = "", []
                continue
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "data":
                self._data.append(value)
            elif name == "event":
                self._event = value
        return out

    def close(self) -> list[tuple[str, str]]:
        """The last event, when the stream ended without its blank line."""
        return self.feed(b"\n\n")


class _Reader:
    """Consumes one streamed model call, emitting text and reasoning to the turn."""

    def __init__(self, loop: _AgentLoop) -> None:
        self.loop = loop
        self.turn = loop.turn
        self.emitted = False  # something of this attempt reached the turn: no retry
        self.done = False
        self.text: list[str] = []
        self.usage: JsonObject | None = None

    async def _text(self, delta: Any) -> None:
        if not isinstance(delta, str):
            raise TurnFailed("provider_protocol_error", f"a text delta is not a string: {delta!r}")
        if delta:
            self.emitted = True
            self.text.append(delta)
            await self.turn.text(delta)

    async def _reasoning(self, delta: Any) -> None:
        if isinstance(delta, str) and delta:
            self.emitted = True
            await self.turn.reasoning(delta)

    @property
    def complete(self) -> bool:
        """Whether the model call ended properly (else the stream was cut short)."""
        return self.done

    async def event(self, name: str, data: str) -> None:
        raise NotImplementedError

    async def whole(self, obj: JsonObject) -> None:
        """A provider that ignored ``stream: true`` and answered with one JSON object."""
        raise NotImplementedError

    def step(self) -> _Step:
        raise NotImplementedError


class _ResponsesReader(_Reader):
    def __init__(self, loop: _AgentLoop) -> None:
        super().__init__(loop)
        self.items: list[JsonObject] = []

    async def event(self, name: str, data: str) -> None:
        if data.strip() == "[DONE]":
            return
        obj = _json_object(data)
        kind = obj.get("type") or name
        if kind in ("response.created", "response.in_progress", "response.queued"):
            self.loop.serve((obj.get("response") or {}).get("model"))
        elif kind == "response.output_text.delta":
            await self._text(obj.get("delta"))
        elif kind in ("response.reasoning_text.delta", "response.reasoning_summary_text.delta"):
            await self._reasoning(obj.get("delta"))
        elif kind == "response.output_item.done":
            if not isinstance(obj.get("item"), dict):
                raise TurnFailed("provider_protocol_error", f"{kind} without an item")
            self.items.append(obj["item"])
        elif kind in ("response.completed", "response.incomplete"):
            await self.whole(obj.get("response") or {})
        elif kind == "response.failed":
            error = (obj.get("response") or {}).get("error") or "the response failed"
            raise TurnFailed("provider_error", _redact(_error_text(error), self._key))
        elif kind == "error":
            raise TurnFailed(
                "provider_error", _redact(_error_text(obj.get("error", obj)), self._key)
            )

    @property
    def _key(self) -> str | None:
        return self.loop.settings.api_key

    async def whole(self, response: JsonObject) -> None:
        self.loop.serve(response.get("model"))
        self.usage = response.get("usage") or None
        if not self.items and isinstance(response.get("output"), list):
            self.items = [i for i in response["output"] if isinstance(i, dict)]
            if not self.text:  # nothing was streamed: emit the answer whole
                for item in self.items:
                    if item.get("type") == "message":
                        await self._text(_item_text(item))
        self.done = True

    def step(self) -> _Step:
        calls = []
        for item in self.items:
            if item.get("type") != "function_call":
                continue
            if not item.get("name"):
                raise TurnFailed("provider_protocol_error", f"a function_call has no name: {item}")
            call_id = item.get("call_id") or item.get("id") or f"call_{uuid.uuid4().hex[:12]}"
            calls.append(
                _ToolCall(str(call_id), str(item["name"]), str(item.get("arguments") or ""))
            )
        return _Step("".join(self.text), calls, self.items, self.usage)


class _ChatReader(_Reader):
    def __init__(self, loop: _AgentLoop) -> None:
        super().__init__(loop)
        self.calls: dict[int, dict[str, str]] = {}
        self.finished = False

    async def event(self, name: str, data: str) -> None:
        if data.strip() == "[DONE]":
            self.done = True
            return
        obj = _json_object(data)
        if obj.get("error"):
            error = _redact(_error_text(obj["error"]), self.loop.settings.api_key)
            raise TurnFailed("provider_error", error)
        self.loop.serve(obj.get("model"))
        if obj.get("usage"):
            self.usage = obj["usage"]
        for choice in obj.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or choice.get("message") or {}
            await self._reasoning(delta.get("reasoning_content") or delta.get("reasoning"))
            await self._text(delta.get("content") or delta.get("refusal") or "")
            for call in delta.get("tool_calls") or []:
                self._add_call(call)
            self.finished = self.finished or bool(choice.get("finish_reason"))

    def _add_call(self, call: Any) -> None:
        if not isinstance(call, dict):
            raise TurnFailed("provider_protocol_error", f"a tool call is not an object: {call!r}")
        index = call.get("index", len(self.calls))
        acc = self.calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
        function = call.get("function") or {}
        acc["id"] = acc["id"] or str(call.get("id") or "")
        acc["name"] = acc["name"] or str(function.get("name") or "")
        acc["arguments"] += str(function.get("arguments") or "")

    @property
    def complete(self) -> bool:
        # ``[DONE]`` ends a stream; some servers close after the finish_reason without it.
        return self.done or self.finished

    async def whole(self, obj: JsonObject) -> None:
        await self.event("", json.dumps(obj))
        self.done = True

    def step(self) -> _Step:
        calls = []
        for index in sorted(self.calls):
            acc = self.calls[index]
            if not acc["name"]:
                raise TurnFailed("provider_protocol_error", f"tool call #{index} has no name")
            call_id = acc["id"] or f"call_{uuid.uuid4().hex[:12]}"
            calls.append(_ToolCall(call_id, acc["name"], acc["arguments"]))
        return _Step("".join(self.text), calls, [], self.usage)
