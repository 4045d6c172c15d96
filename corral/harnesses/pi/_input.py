"""What pi is given of a turn's message: the new user input, and the history before it.

The turn's §iv.1 ``message`` holds the session's whole history, its last user message being
this turn's. pi keeps the conversation in memory while its CLI runs, so only that last
message goes to ``prompt``: its text, and its images (``data:`` URLs) as pi's image blocks.
A CLI that starts without the conversation — ``--no-session`` saves none, so a new worker's
or one started again after a crash — is given the history as text ahead of the message
(:func:`prompt_text`), the user's and the assistant's words; tool calls of the history are
not replayed.

The runner's tools the message offers (``tools``, chat or flat shape) are given to pi as
tools of corral's extension (:func:`runner_tools`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._turn_message import message_items, tool_rows

_TEXT_PARTS = ("text", "input_text", "output_text")
SEED_HEAD = "The conversation so far (carried over; your own memory of it was lost):"
SEED_TAIL = "The user's new message:"


@dataclass(frozen=True, slots=True)
class TurnInput:
    """The turn's user text and images, and the conversation before it as (role, text)."""

    text: str
    images: list[dict[str, str]]
    history: list[tuple[str, str]]


def turn_input(message: Mapping[str, Any]) -> TurnInput:
    """Split the turn's ``message`` (see the module docstring)."""
    items = message_items(message)
    said = [
        (item["role"], item.get("content"))
        for item in items
        if item.get("type", "message") == "message" and item.get("role") in ("user", "assistant")
    ]
    if not said or said[-1][0] != "user":
        return TurnInput("", [], [])
    history = [(role, text) for role, parts in said[:-1] if (text := _text_of(parts))]
    last = said[-1][1]
    return TurnInput(_text_of(last), _images(last), history)


def runner_tools(message: Mapping[str, Any]) -> tuple[tuple[str, str, str], ...]:
    """The runner's tools the turn's message offers, as ``(name, description, parameters as
    JSON)``."""
    return tool_rows(message.get("tools"))


def prompt_text(given: TurnInput, *, seed: bool) -> str:
    """The ``prompt`` message; with the history ahead of it when ``seed``."""
    if not seed or not given.history:
        return given.text
    lines = [f"{role.capitalize()}: {text}" for role, text in given.history]
    return "\n\n".join([SEED_HEAD, *lines, SEED_TAIL, given.text])


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(
        str(p.get("text") or "")
        for p in content or []
        if isinstance(p, dict) and p.get("type") in _TEXT_PARTS and p.get("text")
    )


def _images(content: Any) -> list[dict[str, str]]:
    """The ``input_image`` parts with a base64 ``data:`` URL, as pi's ``ImageContent``."""
    images = []
    for part in content if isinstance(content, list) else []:
        if not isinstance(part, dict) or part.get("type") != "input_image":
            continue
        url = part.get("image_url")
        url = url.get("url") if isinstance(url, dict) else url
        if isinstance(url, str) and url.startswith("data:") and ";base64," in url:
            mime, _, data = url.removeprefix("data:").partition(";base64,")
            images.append({"type": "image", "data": data, "mimeType": mime})
    return images
