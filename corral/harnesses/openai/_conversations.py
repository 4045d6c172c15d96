"""The request of each model call: the history, as Responses ``input`` or Chat ``messages``.

A conversation starts from the turn's history (``_history``) and grows by each step and its
tool outputs; ``body(model)`` is the next request's JSON.
"""

from __future__ import annotations

import base64
import binascii
import json
import urllib.parse
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..._jsonlines import JsonObject
from .._turn_message import message_items

if TYPE_CHECKING:
    from ._step import _Step, _ToolCall


def _message_item(text: str) -> JsonObject:
    return {
        "type": "message",
        "id": f"msg_{uuid.uuid4().hex[:24]}",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


_TEXT_PARTS = ("text", "input_text", "output_text")


def _history(message: Mapping[str, Any]) -> list[JsonObject]:
    """The §iv.1 ``content``: a list of items (or, leniently, one user string).

    A call the runner recorded twice (``in_progress``, then ``completed``) is kept once.
    """
    items: list[JsonObject] = []
    calls: set[str] = set()
    for item in message_items(message):
        if item.get("type") == "function_call" and item.get("call_id"):
            if item["call_id"] in calls:
                continue
            calls.add(item["call_id"])
        items.append(item)
    return items


def _item_text(item: Mapping[str, Any]) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    return "".join(
        str(p.get("text") or "") for p in content or [] if isinstance(p, dict) and "text" in p
    )


class _ResponsesConversation:
    """The ``input`` of a Responses call: history items, then the turn's own items."""

    def __init__(
        self, history: list[JsonObject], instructions: str | None, tools: list[JsonObject]
    ) -> None:
        self.instructions = instructions
        self.tools = [_responses_tool(t) for t in tools if isinstance(t, dict)]
        self.input = [_responses_item(i) for i in history]

    def add_step(self, step: _Step, outputs: list[tuple[_ToolCall, str]]) -> None:
        items = step.items
        if not items:  # a provider that sent no output items: rebuild them
            items = [_message_item(step.text)] if step.text else []
            items += [
                {
                    "type": "function_call",
                    "call_id": c.call_id,
                    "name": c.name,
                    "arguments": c.arguments,
                }
                for c in step.tool_calls
            ]
        self.input.extend(items)
        for call, output in outputs:
            self.input.append(
                {"type": "function_call_output", "call_id": call.call_id, "output": output}
            )

    def body(self, model: str) -> JsonObject:
        body: JsonObject = {"model": model, "input": list(self.input), "stream": True}
        if self.instructions:
            body["instructions"] = self.instructions
        if self.tools:
            body["tools"] = self.tools
        return body


#: Media types of an attached file whose content goes to the model as text.
_TEXT_FILE_TYPES = ("application/json", "application/xml", "application/yaml", "application/x-yaml")


def _inline_text_files(content: list[Any]) -> list[JsonObject]:
    """Content blocks with each text file attached as ``input_text``.

    The server forwards an upload as ``{"type": "input_file", "filename", "file_data":
    "data:<type>;base64,..."}`` (PROTOCOL_0_19 §C.1). A text file (``text/*``, JSON, XML,
    YAML) becomes an ``input_text`` block holding its decoded content (UTF-8, undecodable
    bytes replaced), which every model and both APIs read. Any other file, and one whose
    data cannot be decoded, passes on as it came.
    """
    blocks: list[JsonObject] = []
    for block in content:
        if not isinstance(block, dict):
            continue
        text = _text_file(block) if block.get("type") == "input_file" else None
        blocks.append(block if text is None else {"type": "input_text", "text": text})
    return blocks


def _text_file(block: JsonObject) -> str | None:
    data = block.get("file_data")
    if not isinstance(data, str) or not data.startswith("data:"):
        return None
    header, comma, payload = data.partition(",")
    media_type, *params = header.removeprefix("data:").split(";")
    media_type = media_type.strip().lower()
    is_text = media_type.startswith("text/") or media_type.endswith("+json")
    if not comma or not (is_text or media_type in _TEXT_FILE_TYPES):
        return None
    try:
        raw = base64.b64decode(payload, validate=True) if "base64" in params else None
    except binascii.Error:
        return None
    return (raw if raw is not None else urllib.parse.unquote_to_bytes(payload)).decode(
        "utf-8", "replace"
    )


def _responses_tool(tool: JsonObject) -> JsonObject:
    function = tool.get("function")
    if tool.get("type") == "function" and isinstance(function, dict):
        return {"type": "function", **function}
    return tool


def _responses_item(item: JsonObject) -> JsonObject:
    """A history item the Responses API accepts (runner-only fields and ids dropped)."""
    kind = item.get("type") or ("message" if "role" in item else None)
    if kind == "message":
        role = item.get("role") or "user"
        content = item.get("content")
        if isinstance(content, list):
            text_type = "output_text" if role == "assistant" else "input_text"
            content = [
                {**p, "type": text_type} if p.get("type") in _TEXT_PARTS else p
                for p in _inline_text_files(content)
            ]
        return {"type": "message", "role": role, "content": content or ""}
    if kind == "function_call":
        keys = ("call_id", "name", "arguments")
        return {"type": kind, **{k: item.get(k) or "" for k in keys}}
    if kind == "function_call_output":
        return {"type": kind, "call_id": item.get("call_id") or "", "output": item.get("output")}
    return {k: v for k, v in item.items() if k != "agent"}


class _ChatConversation:
    """The ``messages`` of a Chat Completions call."""

    def __init__(
        self, history: list[JsonObject], instructions: str | None, tools: list[JsonObject]
    ) -> None:
        self.messages: list[JsonObject] = []
        if instructions:
            self.messages.append({"role": "system", "content": instructions})
        self.tools = [_chat_tool(t) for t in tools if isinstance(t, dict)]
        self.tools = [t for t in self.tools if t is not None]
        for item in history:
            self._add_item(item)

    def _add_item(self, item: JsonObject) -> None:
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = item.get("role") or "user"
            role = "system" if role == "developer" else role
            self.messages.append({"role": role, "content": _chat_content(item.get("content"))})
        elif kind == "function_call":
            call = {
                "id": item.get("call_id") or "",
                "type": "function",
                "function": {"name": item.get("name") or "", "arguments": item.get("arguments")},
            }
            last = self.messages[-1] if self.messages else {}
            if last.get("role") == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                self.messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            output = output if isinstance(output, str) else json.dumps(output)
            self.messages.append(
                {"role": "tool", "tool_call_id": item.get("call_id") or "", "content": output}
            )

    def add_step(self, step: _Step, outputs: list[tuple[_ToolCall, str]]) -> None:
        message: JsonObject = {"role": "assistant", "content": step.text or None}
        if step.tool_calls:
            message["tool_calls"] = [
                {
                    "id": c.call_id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in step.tool_calls
            ]
        self.messages.append(message)
        for call, output in outputs:
            self.messages.append({"role": "tool", "tool_call_id": call.call_id, "content": output})

    def body(self, model: str) -> JsonObject:
        body: JsonObject = {
            "model": model,
            "messages": list(self.messages),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.tools:
            body["tools"] = self.tools
        return body


def _chat_tool(tool: JsonObject) -> JsonObject | None:
    if isinstance(tool.get("function"), dict):
        return tool
    if tool.get("type") == "function" and tool.get("name"):
        function = {k: v for k, v in tool.items() if k != "type"}
        return {"type": "function", "function": function}
    return None  # a provider-hosted tool: Chat Completions has no equivalent


def _chat_content(content: Any) -> Any:
    """Responses content parts → a Chat string (text only) or a list of Chat parts."""
    if not isinstance(content, list):
        return content if isinstance(content, str) else ""
    parts: list[JsonObject] = []
    for part in _inline_text_files(content):
        if "text" in part and part.get("type") in _TEXT_PARTS:
            parts.append({"type": "text", "text": part["text"]})
        elif part.get("type") == "input_image":
            url = part.get("image_url")
            url = url.get("url") if isinstance(url, dict) else url
            parts.append({"type": "image_url", "image_url": {"url": url}})
    if all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts
