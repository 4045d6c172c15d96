"""What Codex is given of a turn's message: the new user input, and the history before it.

The turn's §iv.1 ``message`` holds the session's whole history (and the runner's tools,
offered to Codex as its *dynamic tools*: :func:`runner_tools`), its last user message being
this turn's (dispatch runs a message that arrives mid-turn as a turn of its own). Codex
keeps its own thread, so only that last message goes to ``turn/start``, as Codex's
``UserInput`` parts: text as ``text``, an image as ``image`` (its URL, a ``data:`` URL
included), an attached text file as ``text`` holding its content. What comes before it is
given to a thread that does not have it yet — a fresh ``CODEX_HOME`` — as Responses API
messages (``thread/inject_items``): the user's and the assistant's text. Tool calls of the
history are not replayed: Codex's own are in its thread, and another harness's would name
tools Codex does not have.
"""

from __future__ import annotations

import base64
import binascii
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._turn_message import function_tools, message_items

_TEXT_PARTS = ("text", "input_text", "output_text")
#: Media types of an attached file whose content is given to Codex as text.
_TEXT_TYPES = ("application/json", "application/xml", "application/yaml", "application/x-yaml")


def runner_tools(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The runner's tools the turn's message offers (``tools``, chat or flat shape), as Codex
    dynamic tools: ``{type: "function", name, description, inputSchema}``."""
    return [
        {"type": "function", "name": name, "description": description, "inputSchema": schema}
        for name, description, schema in function_tools(message.get("tools"))
    ]


@dataclass(frozen=True, slots=True)
class TurnInput:
    """The ``input`` of ``turn/start``, and the history before it as Responses items."""

    parts: list[dict[str, Any]]
    history: list[dict[str, Any]]
    #: The user's text, for the LLM-request policy check.
    text: str
    #: The runner's tools (:func:`runner_tools`).
    tools: list[dict[str, Any]]


def turn_input(message: Mapping[str, Any]) -> TurnInput:
    """Split the turn's ``message`` (see the module docstring)."""
    items = message_items(message)
    last = next((n for n in range(len(items) - 1, -1, -1) if _is_message(items[n], "user")), None)
    tools = runner_tools(message)
    if last is None:
        return TurnInput([], _seed(items), "", tools)
    parts = _user_parts(items[last].get("content"))
    text = "\n".join(p["text"] for p in parts if p["type"] == "text")
    return TurnInput(parts, _seed(items[:last]), text, tools)


def _is_message(item: Mapping[str, Any], role: str) -> bool:
    return item.get("type", "message") == "message" and item.get("role") == role


def _seed(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The user and assistant messages of ``items`` as Responses API messages."""
    seeded = []
    for item in items:
        for role, part in (("user", "input_text"), ("assistant", "output_text")):
            if _is_message(item, role):
                text = _text_of(item.get("content"))
                if text:
                    content = [{"type": part, "text": text}]
                    seeded.append({"type": "message", "role": role, "content": content})
    return seeded


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(
        str(p.get("text") or "")
        for p in content or []
        if isinstance(p, dict) and p.get("type") in _TEXT_PARTS
    )


def _user_parts(content: Any) -> list[dict[str, Any]]:
    """A user message's content as Codex ``UserInput`` parts."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    parts: list[dict[str, Any]] = []
    for block in content or []:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind in _TEXT_PARTS and block.get("text"):
            parts.append({"type": "text", "text": str(block["text"])})
        elif kind == "input_image":
            url = block.get("image_url")
            url = url.get("url") if isinstance(url, dict) else url
            if isinstance(url, str) and url:
                parts.append({"type": "image", "url": url})
        elif kind == "input_file":
            text = _file_text(block)
            if text is not None:
                parts.append({"type": "text", "text": text})
    return parts


def _file_text(block: Mapping[str, Any]) -> str | None:
    """The decoded content of an attached text file (``data:<type>;base64,…``), else None."""
    data = block.get("file_data")
    if not isinstance(data, str) or not data.startswith("data:") or "," not in data:
        return None
    head, payload = data[5:].split(",", 1)
    media = head.split(";")[0].lower()
    if not (media.startswith("text/") or media in _TEXT_TYPES or media.endswith("+json")):
        return None
    try:
        raw = base64.b64decode(payload) if head.endswith(";base64") else None
    except (binascii.Error, ValueError):
        return None
    if raw is None:
        raw = urllib.parse.unquote_to_bytes(payload)
    return raw.decode("utf-8", errors="replace")
