"""``corral elicitations``: which parked entries are elicitations and how each shows."""

from __future__ import annotations

from typing import Any

from corral.actors.elicitations import elicitation_rows
from corral.actors.policy.messages import ToolCall, elicitation_id_for
from corral.bus import Envelope, Message, encode_body, encode_envelope, tag_of
from corral.harnesses.protocol import ElicitationParked


def _row(msg: Message, state: str = "parked", reason: str | None = None) -> dict[str, Any]:
    env = Envelope(
        id="m1",
        sender="dispatch",
        recipient="policy",
        type=tag_of(type(msg)),
        body=encode_body(msg),
        durability="durable",
        created_at=12.5,
    )
    return {"type": env.type, "state": state, "reason": reason, "frame": encode_envelope(env)}


def test_a_parked_tool_call_shows_as_the_policy_actors_elicitation() -> None:
    call = ToolCall(session_id="s", turn_id="t", call_id="c", name="sys_os_shell", arguments="{}")
    assert elicitation_rows([_row(call)]) == [
        {
            "elicitation_id": elicitation_id_for("s", "c"),
            "session_id": "s",
            "turn_id": "t",
            "owner": "policy",
            "state": "parked",
            "reason": None,
            "created_at": 12.5,
            "params": {"tool": {"name": "sys_os_shell", "call_id": "c"}},
        }
    ]


def test_a_parked_worker_elicitation_shows_with_its_owner_and_params() -> None:
    parked = ElicitationParked(
        session_id="s",
        turn_id="t",
        elicitation_id="e",
        owner="w1",
        incarnation="i2",
        params={"message": "ok?"},
        reply_to="dispatch",
    )
    [row] = elicitation_rows([_row(parked, "cancelled", "harness_restarted")])
    assert (row["elicitation_id"], row["owner"]) == ("e", "w1#i2")
    assert row["params"] == {"message": "ok?"}
    assert (row["state"], row["reason"]) == ("cancelled", "harness_restarted")


def test_other_parked_entries_and_broken_frames_are_not_elicitations() -> None:
    class Other(Message, tag="test.other"):
        n: int = 0

    broken = {"type": tag_of(ToolCall), "state": "parked", "reason": None, "frame": b"\x00"}
    wrong_body = _row(Other()) | {"type": tag_of(ToolCall)}
    assert elicitation_rows([_row(Other()), broken, wrong_body]) == []
