"""The dispatch actor's protocol: what comes back to a session's turn.

:class:`ToolOutcome` is what the model sees of a tool call (policy → dispatch, durable);
:class:`PublishEvents` carries session events caused outside a turn's stream.
"""

from __future__ import annotations

from typing import Any

from ...bus import Message
from ...tools._api import ToolStatus


class ToolOutcome(Message, tag="dispatch.tool_outcome"):
    """What the model sees of a tool call (policy → dispatch, durable)."""

    session_id: str
    turn_id: str
    call_id: str
    output: str
    status: ToolStatus = "completed"


class PublishEvents(Message, tag="dispatch.publish_events"):
    """Session events caused outside a turn's stream (tools, policy → dispatch, durable)."""

    session_id: str
    events: list[dict[str, Any]]
