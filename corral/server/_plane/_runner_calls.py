"""What the runner asks of the plane: policy decisions, tool calls, items and event batches.

:class:`RunnerCalls` is the part of :class:`ControlPlane` behind the runner's own HTTP calls
(``/policies/evaluate``, ``/mcp``, ``external_conversation_item``) and its tunnel
``event.batch`` frames (PROTOCOL_0_19 §A.3).
"""

from __future__ import annotations

from typing import Any

import msgspec

from ..._jsonlines import JsonObject
from .._conversation import UnknownSession
from .._mcp import RpcAnswer
from .._policy import TOOL_RESULT, Decision, combine, decide, tool_name_of
from .._store import SessionRow
from .._tunnel import EventAck, event_ack
from ._answers import MessagePosted
from ._parts import PlaneParts
from ._refusals import Refused

_encode = msgspec.json.Encoder().encode


#: ``event.batch`` limits of the real server (§A.3).
_MAX_BATCH_EVENTS = 32
_MAX_BATCH_BYTES = 256 * 1024
#: The event types the real server takes on the tunnel; this server stores only the first.
_TUNNEL_EVENT_TYPES = frozenset(
    {
        "external_conversation_item",
        "external_output_text_delta",
        "external_session_status",
        "external_session_usage",
    }
)


class RunnerCalls(PlaneParts):
    """The runner's calls into a :class:`ControlPlane`."""

    async def evaluate(
        self,
        row: SessionRow,
        phase: str,
        data: JsonObject,
        request_data: JsonObject | None = None,
        target: str | None = None,
    ) -> Decision:
        """``/policies/evaluate`` (§iii.8): the decision on one phase of the session.

        A tool result names its call in ``request_data`` (or ``target``, PROTOCOL_0_19 §F.2);
        older runners put the name in ``data``, which is read too.
        """
        tool = tool_name_of(data, request_data, target)
        source = request_data if phase == TOOL_RESULT and request_data is not None else data
        return await self.decide(row, phase, tool, source.get("arguments"))

    async def decide(
        self, row: SessionRow, phase: str, tool: str | None, arguments: Any
    ) -> Decision:
        """The server rules and the session agent's policies on one call (see ``_policy``)."""
        server = decide(self.settings.policies, phase, tool)
        return combine(server, await self._agent_policies(row), phase, tool, arguments)

    async def mcp(self, row: SessionRow, rpc: Any) -> RpcAnswer:
        """``POST /mcp`` (§iii.9): one JSON-RPC 2.0 request → its answer (see ``_mcp.py``)."""
        return await self._tools.handle(row, rpc)

    async def add_runner_item(self, row: SessionRow, data: Any) -> MessagePosted:
        """``external_conversation_item`` (§iii.10) → a stored item.

        Raises:
            Refused: 422 when ``data`` is not ``{item_type, item_data, response_id?}``.
        """
        if not isinstance(data, dict) or not isinstance(data.get("item_data", {}), dict):
            raise Refused(422, "invalid_event", "data must be {item_type, item_data, response_id?}")
        item_type = data.get("item_type", "message")
        if not isinstance(item_type, str) or not item_type:
            raise Refused(422, "invalid_event", "item_type must be a non-empty string")
        fields = {**(data.get("item_data") or {}), "type": item_type}
        if isinstance(data.get("response_id"), str):
            fields["response_id"] = data["response_id"]
        if isinstance(data.get("source_id"), str):
            # The runner's idempotency key: a replayed item is stored once.
            fields["source_id"] = data["source_id"]
        item = await self.store.add_item(row.id, fields)
        return {"queued": False, "item_id": item["id"]}

    async def ingest_batch(self, frame: JsonObject) -> EventAck:
        """An ``event.batch`` from the runner (§A.3) → its ``event.ack``.

        Events are applied in order; the ack's ``applied`` counts those that were. Only
        ``external_conversation_item`` is stored here (with its ``source_id``, so a replayed
        batch is stored once); the other tunnel types of the real server feed native-harness
        transcripts this server has no use for, and are refused by name, not dropped.
        """
        events = frame.get("events")
        if (
            not isinstance(events, list)
            or not events
            or not all(isinstance(e, dict) and isinstance(e.get("type"), str) for e in events)
        ):
            return event_ack(frame, 0, "events must be a non-empty list of objects with a type")
        if len(events) > _MAX_BATCH_EVENTS or len(_encode(frame)) > _MAX_BATCH_BYTES:
            return event_ack(frame, 0, "event batch exceeds count or size limit")
        session_id = frame.get("session_id")
        row = await self.store.get_session(session_id) if isinstance(session_id, str) else None
        if row is None:
            return event_ack(frame, 0, f"no session {session_id!r}")
        for index, event in enumerate(events):
            kind = event["type"]
            if kind not in _TUNNEL_EVENT_TYPES:
                return event_ack(frame, index, "event type is not allowed on runner tunnel")
            if kind != "external_conversation_item":
                return event_ack(frame, index, f"{kind} is not supported by this server")
            data = event.get("data")
            if not isinstance(data, dict) or not isinstance(data.get("source_id"), str):
                return event_ack(frame, index, "source_id required for tunnel replay")
            try:
                await self.add_runner_item(row, data)
            except Refused as exc:
                return event_ack(frame, index, exc.detail)
            except UnknownSession:
                return event_ack(frame, index, f"no session {session_id!r}")
        self.notify(row.id)
        return event_ack(frame, len(events))
