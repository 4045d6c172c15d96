"""The turn's ``message`` as every harness kind reads it (PROTOCOL_FACTS §iv.1)."""

from __future__ import annotations

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
