"""The turn's ``message`` as every harness kind reads it (PROTOCOL_FACTS §iv.1)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def message_items(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Its ``content`` as a list of items: the conversation so far, ending with the turn's
    user input. A bare string is taken, leniently, as one user message; what is not an
    object is dropped."""
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "message", "role": "user", "content": content}]
    return [item for item in content or [] if isinstance(item, dict)]


def function_tools(raw: Any) -> list[tuple[str, str, dict[str, Any]]]:
    """The runner's tools a turn's message offers (its ``tools``, in the chat shape
    ``{type, function: {name, …}}`` or flat), as ``(name, description, parameters)``; a tool
    of another type or without a name is left out."""
    rows = []
    for tool in raw or []:
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            continue
        nested = tool.get("function")
        fn: dict[str, Any] = nested if isinstance(nested, dict) else tool
        name = fn.get("name")
        if isinstance(name, str) and name:
            schema = fn.get("parameters") or {"type": "object", "properties": {}}
            rows.append((name, str(fn.get("description") or ""), schema))
    return rows


def tool_rows(raw: Any) -> tuple[tuple[str, str, str], ...]:
    """:func:`function_tools` with each schema as JSON text (sorted keys: the same tools give
    the same rows, so a CLI's saved tool list compares equal)."""
    return tuple(
        (name, description, json.dumps(schema, sort_keys=True))
        for name, description, schema in function_tools(raw)
    )
