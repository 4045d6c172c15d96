"""What one streamed model call produced: its text, its tool calls, its output items."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..._jsonlines import JsonObject


@dataclass(slots=True)
class _ToolCall:
    call_id: str
    name: str
    arguments: str


@dataclass(slots=True)
class _Step:
    """What one model call produced."""

    text: str = ""
    tool_calls: list[_ToolCall] = field(default_factory=list)
    items: list[JsonObject] = field(default_factory=list)  # Responses output items
    usage: JsonObject | None = None
