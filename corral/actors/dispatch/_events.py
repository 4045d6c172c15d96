"""Session events: the typed union of ``POST /v1/sessions/{id}/events`` bodies, parsed strictly.

The server forwards a client's message, verdict, interrupt or control event as one JSON
object tagged by ``type`` (PROTOCOL_0_19.md §C). :func:`parse_event` decodes it into one
Struct of :data:`SessionEventBody` or raises :class:`BadEvent` with the 4xx it is answered
with; nothing else in dispatch looks at the raw body.
"""

from __future__ import annotations

import msgspec

from ..._exceptions import BadInput
from ..._input import load_json
from ..._jsonlines import JsonObject
from ...harnesses.protocol import Approval


class _Event(msgspec.Struct, tag_field="type", kw_only=True):
    pass


class MessageEvent(_Event, tag="message"):
    role: str = "user"
    #: A list of items or blocks (D-02); a plain string is taken as one text block.
    content: str | list[JsonObject] | None = None
    model: str | None = None
    agent_id: str | None = None
    harness: str | None = None
    instructions: str | None = None
    connection_params: JsonObject | None = None
    persisted_item_id: str | None = None
    harness_override: str | None = None
    model_override: str | None = None
    tools: list[JsonObject] | None = None


class ApprovalEvent(_Event, tag="approval"):
    data: JsonObject | None = None
    elicitation_id: str | None = None
    action: str | None = None
    content: JsonObject | None = None


class InterruptEvent(_Event, tag="interrupt"):
    pass


class StopSessionEvent(_Event, tag="stop_session"):
    pass


class CompactEvent(_Event, tag="compact"):
    pass


# Control events the 0.19 server forwards (PROTOCOL_0_19.md §C.3). omnigent's runner acts on
# them only for native terminal harnesses, which corral has none of; for every other harness
# it answers 204 and so does corral. Fields are typed as the server sends them, so a wrong
# type is a 422 like any other malformed event.


class CostApprovalPopupEvent(_Event, tag="cost_approval_popup"):
    """An ASK the server parked in ``policies/evaluate``, for a native terminal's modal."""

    elicitation_id: str | None = None
    message: str | None = None
    policy_name: str | None = None


class PolicyBlockedNoticeEvent(_Event, tag="policy_blocked_notice"):
    message: str | None = None
    policy_name: str | None = None


class ClearEvent(_Event, tag="clear"):
    pass


class EffortChangeEvent(_Event, tag="effort_change"):
    effort: str | None = None
    rollback_on_refusal: bool | None = None


class ModelChangeEvent(_Event, tag="model_change"):
    model: str | None = None
    effort: str | None = None
    rollback_on_refusal: bool | None = None


class PermissionModeChangeEvent(_Event, tag="permission_mode_change"):
    permission_mode: str | None = None


class PlanModeChangeEvent(_Event, tag="plan_mode_change"):
    enabled: bool | None = None


class CodexApprovalModeChangeEvent(_Event, tag="codex_approval_mode_change"):
    approval_mode: str | None = None


class BtwDismissEvent(_Event, tag="btw_dismiss"):
    pass


class ExternalSessionStatusEvent(_Event, tag="external_session_status"):
    """A native forwarder's status report; corral runs no forwarder, so nothing to record."""

    data: JsonObject | None = None


SessionEventBody = (
    MessageEvent
    | ApprovalEvent
    | InterruptEvent
    | StopSessionEvent
    | CompactEvent
    | CostApprovalPopupEvent
    | PolicyBlockedNoticeEvent
    | ClearEvent
    | EffortChangeEvent
    | ModelChangeEvent
    | PermissionModeChangeEvent
    | PlanModeChangeEvent
    | CodexApprovalModeChangeEvent
    | BtwDismissEvent
    | ExternalSessionStatusEvent
)
_event_decoder = msgspec.json.Decoder(SessionEventBody)


class BadEvent(BadInput):
    """A session event that is malformed or of an unknown type (answered 4xx)."""


def parse_event(body: bytes) -> SessionEventBody:
    """Decode one session event strictly.

    Raises:
        BadEvent: 400 ``invalid_json`` for a body that is not UTF-8 JSON, holds a lone
            surrogate escape or nests too deep (:func:`corral._input.load_json`); 400 for one
            that is not an object with a string type; 422 for an unknown type or a field of
            the wrong type (the message names the field).
    """
    try:
        raw = load_json(body, "the event body")
    except BadInput as exc:
        raise BadEvent(exc.status, exc.code, str(exc)) from None
    if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
        raise BadEvent(400, "invalid_request", "an event is a JSON object with a string type")
    try:
        return _event_decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise BadEvent(422, "invalid_event", str(exc)) from None


def flatten_approval(event: ApprovalEvent, session_id: str) -> Approval:
    """The nested ``{type: approval, data: {...}}`` envelope, flat for the harness (E-01..E-03)."""
    data = dict(event.data or {})
    elicitation_id = data.get("elicitation_id", event.elicitation_id)
    action = data.get("action", event.action)
    content = data.get("content", event.content)
    if not isinstance(elicitation_id, str) or action not in ("accept", "decline", "cancel"):
        raise BadEvent(422, "invalid_event", "an approval needs elicitation_id and action")
    if content is None:
        return Approval(session_id=session_id, elicitation_id=elicitation_id, action=action)
    return Approval(
        session_id=session_id, elicitation_id=elicitation_id, action=action, content=content
    )
