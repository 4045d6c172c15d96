"""Units of the policy actor and the tools actor's call log."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.actors.policy import PolicyError, parse_verdict
from corral.tools.calls import CallLog
from corral.tools.protocol import elicitation_id_for


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ({"result": "POLICY_ACTION_ALLOW"}, ("ALLOW", None)),
        ({"result": "POLICY_ACTION_DENY", "reason": "no"}, ("DENY", "no")),
        ({"result": "POLICY_ACTION_ASK", "message": "sure?"}, ("ASK", "sure?")),
        ({"result": "POLICY_ACTION_UNSPECIFIED"}, ("UNSPECIFIED", None)),
        ({"action": "deny"}, ("DENY", None)),
        ({"result": {"action": "ALLOW"}}, ("ALLOW", None)),
    ],
)
def test_parse_verdict_accepts_the_shapes_servers_send(answer, expected) -> None:
    assert parse_verdict(answer) == expected


@pytest.mark.parametrize("answer", [None, [], {}, {"result": 3}, {"result": "POLICY_ACTION_MAYBE"}])
def test_parse_verdict_rejects_what_names_no_action(answer) -> None:
    with pytest.raises(PolicyError):
        parse_verdict(answer)


def test_elicitation_ids_are_stable_per_call() -> None:
    a = elicitation_id_for("s1", "call_1")
    assert a == elicitation_id_for("s1", "call_1")
    assert a != elicitation_id_for("s1", "call_2") != elicitation_id_for("s2", "call_1")
    assert a.startswith("elicit_") and len(a) == len("elicit_") + 32


async def test_call_log_survives_a_reopen_and_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "calls.log"
    log = CallLog(path)
    await log.load()
    await log.started("a")
    await log.done("a", '{"ok": 1}', "completed")
    await log.started("b")
    path.write_bytes(path.read_bytes() + b'{"id": "c", "sta')  # a crash mid-write
    again = CallLog(path)
    await again.load()
    assert (again.get("a").state, again.get("a").output) == ("done", '{"ok": 1}')
    assert again.get("b").state == "started", "cut off: answered as such, never re-run"
    assert again.get("c") is None


async def test_call_log_compaction_keeps_unfinished_calls(tmp_path: Path) -> None:
    log = CallLog(tmp_path / "calls.log", keep=3)
    await log.load()
    await log.started("running")
    for i in range(10):
        await log.done(f"d{i}", "x", "completed")
    again = CallLog(tmp_path / "calls.log", keep=3)
    await again.load()
    assert again.get("running") is not None
    assert again.get("d9") is not None and again.get("d0") is None
    assert len(again.records) <= 1 + 2 * 3
