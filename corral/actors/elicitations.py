"""What ``corral elicitations`` lists: the parked messages that wait on a person.

Two actors park a durable message in the broker until a person answers: the policy actor
parks a tool call its policy answered ASK, the harness actor parks a worker's elicitation
(``ElicitationParked``). The broker only holds them; this module says which parked messages
are elicitations and how each shows. It is handed to the host by the CLI, so that the
supervisor stays generic and knows no actor's messages.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from .._exceptions import ProtocolError
from ..bus import Message, decode_envelope, tag_of
from ..harnesses.protocol import ElicitationParked
from .policy.messages import ToolCall, elicitation_id_for


def elicitation_rows(parked: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The elicitations among the broker's parked (and recently resolved) entries.

    Each entry is decoded with the one type its tag names (no registry of every message):
    an entry of another type, or one that does not decode, is not an elicitation.
    """
    rows = []
    for row in parked:
        view = _VIEWS.get(row["type"])
        if view is None:
            continue
        kind, show = view
        try:
            env = decode_envelope(row["frame"])
            msg = msgspec.msgpack.decode(env.body, type=kind)
        except (ProtocolError, msgspec.DecodeError):
            continue
        rows.append(show(msg, row, env.created_at))
    return rows


def _harness_elicitation(
    msg: ElicitationParked, row: dict[str, Any], created_at: float
) -> dict[str, Any]:
    """An elicitation a harness worker raised, parked by the harness actor."""
    return {
        "elicitation_id": msg.elicitation_id,
        "session_id": msg.session_id,
        "turn_id": msg.turn_id,
        "owner": f"{msg.owner}#{msg.incarnation}",
        "state": row["state"],
        "reason": row["reason"],
        "created_at": created_at,
        "params": msg.params,
    }


def _policy_elicitation(call: ToolCall, row: dict[str, Any], created_at: float) -> dict[str, Any]:
    """A tool call the policy actor parked on an ASK."""
    return {
        "elicitation_id": elicitation_id_for(call.session_id, call.call_id),
        "session_id": call.session_id,
        "turn_id": call.turn_id,
        "owner": "policy",
        "state": row["state"],
        "reason": row["reason"],
        "created_at": created_at,
        "params": {"tool": {"name": call.name, "call_id": call.call_id}},
    }


#: Per message tag: the type parked under it and how it shows.
_VIEWS: dict[str, tuple[type[Message], Callable[[Any, dict[str, Any], float], dict[str, Any]]]] = {
    tag_of(ToolCall): (ToolCall, _policy_elicitation),
    tag_of(ElicitationParked): (ElicitationParked, _harness_elicitation),
}
