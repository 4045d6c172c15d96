"""The conversation history a harness sees: rehydration, dedup, media (D-23..D-28, D-33).

Pure functions plus one async media resolver; the dispatch actor owns the cache.

* A cold cache is filled from the server's ``/items`` (D-23): messages normalised to
  ``{"type": "message", "role", "content": [blocks]}`` (D-28), tool calls and their outputs
  as ``{"type": "function_call", "call_id", "name", "arguments"}`` and
  ``{"type": "function_call_output", "call_id", "output"}`` — what omnigent's runner gives its
  harness from the same items; other items (resource events) are left out.
* A warm cache is kept the way the server saves a turn (:func:`take_item`, :func:`commit`):
  the streamed text is a draft that becomes one assistant message when a whole message item
  replaces it, before a completed tool call, and at completion; completed calls and their
  outputs follow in stream order. So the next turn is given the same history whether or not
  dispatch restarted in between (a restart empties the cache; ``/items`` fills it again).
* Exactly the stored item named by ``persisted_item_id`` is dropped and the runner's own copy
  of the message is appended (D-24); with no ``persisted_item_id`` nothing is dropped — a
  trailing stored user message stays (D-25) — and the new message is appended (D-26).
* Blocks that reference a ``file_id`` are resolved to ``data:`` URLs before forwarding; no
  ``file_id`` reaches a worker (D-27).
* A stored item too large for a turn's message is replaced by a note saying so
  (:func:`left_out_note`), so that one refused message does not stop every later turn.
* An interrupted turn leaves no assistant text, only a user-role note saying so
  (:func:`interrupt_note`, PROTOCOL_0_19.md §E.4), so the next request reads
  ``[user1, note, user2]``.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from ..._jsonlines import JsonObject

FetchFile = Callable[[str], Awaitable[tuple[bytes, str]]]

_TEXT_BLOCKS = {"input_text", "output_text", "text"}
_LEFT_OUT = "[System: a message of"


def user_item(content: Any) -> JsonObject:
    """The history item of a user message whose ``content`` is text, blocks or items."""
    return {"type": "message", "role": "user", "content": _blocks(content, "input_text")}


def assistant_item(text: str) -> JsonObject:
    """The history item committed for a turn's streamed assistant text (D-33)."""
    return {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text}],
    }


#: The note an interrupted turn leaves in the history. The marker line is the one omnigent's
#: runner writes (the server and UIs may look for it); the explanation is corral's own.
INTERRUPT_NOTE = (
    "[System: interrupted]\n"
    "The user stopped the previous request (the user message just before this note) before "
    "it finished, and any answer to it may be cut short. Do not carry it on unless the user "
    "asks again; take the next user message as what they want now."
)


def left_out_note(size: int) -> JsonObject:
    """The history item standing for a message too large for a turn to carry.

    The gateway refuses a message over the bus limit (413), but the 0.19 server has stored it
    by then, and gives it back in every later history; without this, each later turn of the
    session would fail to start (PROTOCOL_0_19.md §C.1: the item is saved before it is sent).
    """
    text = (
        f"{_LEFT_OUT} {size} bytes is left out here: it is over this runner's message size "
        "limit, so it was never run]"
    )
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def largest(items: list[JsonObject]) -> tuple[int, int] | None:
    """The index and encoded size of the largest item before the last (the new message) that
    is not a :func:`left_out_note` already, or None if there is none."""
    sizes = [
        (len(msgspec.json.encode(item)), i)
        for i, item in enumerate(items[:-1])
        if not texts([item])[0].startswith(_LEFT_OUT)
    ]
    if not sizes:
        return None
    size, index = max(sizes)
    return index, size


def interrupt_note() -> JsonObject:
    """The history item recording that the turn before it was interrupted (§E.4)."""
    return user_item([{"type": "input_text", "text": INTERRUPT_NOTE}])


def _blocks(content: Any, text_type: str) -> list[JsonObject]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": text_type, "text": content}]
    blocks: list[JsonObject] = []
    for part in content if isinstance(content, list) else [content]:
        if isinstance(part, str):
            blocks.append({"type": text_type, "text": part})
        elif isinstance(part, dict) and part.get("type") == "message":
            blocks.extend(_blocks(part.get("content"), text_type))
        elif isinstance(part, dict):
            blocks.append(dict(part))
    return blocks


def normalise(item: JsonObject) -> JsonObject | None:
    """A stored item as a history item, or None for items a harness is not given."""
    if not isinstance(item, dict):
        return None
    kind = item.get("type", "message")
    if kind == "function_call":
        keys = ("call_id", "name", "arguments")
        return {"type": "function_call", **{k: item.get(k) for k in keys}}
    if kind == "function_call_output":
        return {
            "type": "function_call_output",
            "call_id": item.get("call_id"),
            "output": item.get("output"),
        }
    role = item.get("role")
    if kind != "message" or role not in ("user", "assistant", "system", "developer"):
        return None
    text_type = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": _blocks(item.get("content"), text_type)}


def take_item(items: list[JsonObject], draft: list[str], item: JsonObject) -> None:
    """Add a turn's finished output ``item`` to the turn's ``items`` as the server saves it;
    ``draft`` is the text streamed since the last message the turn saved."""
    kind = item.get("type")
    if kind == "message" and item.get("role", "assistant") == "assistant":
        draft.clear()  # the message is whole: the deltas streamed for it are in it
        normalised = normalise({**item, "role": "assistant"})
        if normalised is not None:
            items.append(normalised)
    elif kind == "function_call" and item.get("status") == "completed":
        _flush(items, draft)
        items.append(normalise(item) or {})
    elif kind == "function_call_output":
        items.append(normalise(item) or {})


def commit(items: list[JsonObject], draft: list[str], *, keep_draft: bool) -> list[JsonObject]:
    """What a turn adds to the history when it ends: its saved items, and the draft as the
    last assistant message when the turn kept its answer (an interrupted turn does not)."""
    out = list(items)
    if keep_draft:
        _flush(out, list(draft))
    return out


def _flush(items: list[JsonObject], draft: list[str]) -> None:
    text = "".join(draft)
    draft.clear()
    if text:
        items.append(assistant_item(text))


def undelivered_dropped(stored: list[JsonObject], persisted: set[str]) -> list[JsonObject]:
    """The server's items as a turn's history starts from them: without the items of the
    turn's own messages (``persisted``, D-24), and without the user messages the server
    stored after the first of those — they have not reached this runner yet, and join the
    history when they do. A message posted right behind another (a second sub-agent's wake)
    used to be in the history twice: read back with the first one's cold cache, and again
    when it arrived."""
    first = next((i for i, item in enumerate(stored) if item.get("id") in persisted), None)
    return [
        item
        for i, item in enumerate(stored)
        if item.get("id") not in persisted
        and not (
            first is not None
            and i > first
            and item.get("type", "message") == "message"
            and item.get("role") == "user"
        )
    ]


def rehydrate(stored: list[JsonObject], persisted_item_id: str | None) -> list[JsonObject]:
    """History from the server's items, minus the one the new message was stored as."""
    out = []
    for item in stored:
        if persisted_item_id is not None and item.get("id") == persisted_item_id:
            continue
        normalised = normalise(item)
        if normalised is not None:
            out.append(normalised)
    return out


async def resolve_media(items: list[JsonObject], fetch: FetchFile) -> list[JsonObject]:
    """Replace every ``file_id`` block by an inline ``data:`` URL (D-27)."""
    out = []
    for item in items:
        content = item.get("content")
        if not isinstance(content, list) or not any(
            isinstance(b, dict) and "file_id" in b for b in content
        ):
            out.append(item)
            continue
        blocks = []
        for block in content:
            if isinstance(block, dict) and "file_id" in block:
                data, content_type = await fetch(str(block["file_id"]))
                url = f"data:{content_type};base64,{base64.b64encode(data).decode()}"
                resolved = {k: v for k, v in block.items() if k not in ("file_id", "filename")}
                if block.get("type") == "input_image" or content_type.startswith("image/"):
                    resolved.update(type="input_image", image_url=url)
                else:
                    resolved.update(type="input_file", file_data=url)
                    if "filename" in block:
                        resolved["filename"] = block["filename"]
                blocks.append(resolved)
            else:
                blocks.append(block)
        out.append({**item, "content": blocks})
    return out


def texts(items: list[JsonObject]) -> list[str]:
    """The text of each item (for tests and logs)."""
    return [
        "".join(b.get("text", "") for b in item.get("content", []) if b.get("type") in _TEXT_BLOCKS)
        for item in items
    ]
