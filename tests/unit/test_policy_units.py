"""Units of the policy actor and the tools actor's call log."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from corral.actors.policy import PolicyError, evaluate_elicitation_id, parse_verdict
from corral.actors.policy.messages import elicitation_id_for
from corral.tools.calls import CallLog
from tests.fake_server import evaluate_problem, item_problem


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


# --- the bodies the 0.19.1 server evaluates (PROTOCOL_0_19 §F.2), as the fake server checks --


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (  # what corral sent before (what-corral-did-wrong #8)
            {"event": {"type": "PHASE_TOOL_RESULT", "data": {"name": "t", "output": "o"}}},
            "Policy evaluate requires a non-empty tool name in 'event.request_data.name' or "
            "'event.target' for 'PHASE_TOOL_RESULT'.",
        ),
        (
            {"event": {"type": "PHASE_TOOL_CALL", "data": {"arguments": {}}}},
            "Policy evaluate requires a non-empty tool name in 'event.data.name' for "
            "'PHASE_TOOL_CALL'.",
        ),
        (
            {"event": {"type": "PHASE_LLM_REQUEST", "data": "model call"}},
            "Policy evaluate 'event.data' must be an object for 'PHASE_LLM_REQUEST'; got str.",
        ),
        (
            {"event": {"type": "PHASE_TOOL_RESULT", "target": "t"}},
            "Policy evaluate 'event.data' must be an object for 'PHASE_TOOL_RESULT'; got NoneType.",
        ),
        (
            {"event": {"type": "PHASE_TOOL_USE", "data": {}}},
            "Unknown event type: 'PHASE_TOOL_USE'. Expected one of ['PHASE_TOOL_CALL', "
            "'PHASE_TOOL_RESULT', 'PHASE_LLM_REQUEST', 'PHASE_LLM_RESPONSE', 'PHASE_REQUEST'].",
        ),
        ({"phase": "PHASE_TOOL_CALL"}, "Policy evaluate body must include an 'event' object."),
        (
            {"event": {"type": "PHASE_LLM_REQUEST", "data": {}}, "_omnigent_elicitation_id": "x"},
            "Policy evaluate '_omnigent_elicitation_id' must match 'elicit_evaluate_' + 32 hex "
            "chars.",
        ),
    ],
)
def test_the_fake_server_refuses_what_the_real_one_refuses(body, message) -> None:
    assert evaluate_problem(body) == message


@pytest.mark.parametrize(
    "event",
    [
        {"type": "PHASE_TOOL_CALL", "data": {"name": "t", "arguments": {}, "call_id": "c"}},
        {"type": "PHASE_TOOL_RESULT", "request_data": {"name": "t"}, "data": {"result": "o"}},
        {"type": "PHASE_TOOL_RESULT", "target": "t", "data": {"result": "o"}},
        {"type": "PHASE_LLM_REQUEST", "data": {"model": "m", "messages_count": 1}},
        {"type": "PHASE_REQUEST", "data": "hello"},
    ],
)
def test_the_fake_server_evaluates_what_the_real_one_evaluates(event) -> None:
    eid = evaluate_elicitation_id("s1", "poleval_1")
    assert re.fullmatch(r"elicit_evaluate_[0-9a-f]{32}", eid)
    assert eid == evaluate_elicitation_id("s1", "poleval_1") != evaluate_elicitation_id("s1", "x")
    assert evaluate_problem({"event": event, "_omnigent_elicitation_id": eid}) is None


@pytest.mark.parametrize(
    ("kind", "data", "problem"),
    [
        ("function_call", {"name": "t", "arguments": "{}", "call_id": "c"}, "agent is missing"),
        ("message", {"role": "assistant", "content": []}, "agent is missing"),
        ("message", {"role": "user", "content": []}, None),
        ("message", {"role": "assistant", "content": [], "agent": "a"}, None),
        ("function_call", {"agent": "a", "name": "t", "arguments": "{}", "call_id": "c"}, None),
        ("function_call_output", {"call_id": "c", "output": "o"}, None),
        ("reasoning", {}, "requires known data.item_type"),
    ],
)
def test_the_fake_server_parses_items_like_the_real_one(kind, data, problem) -> None:
    """PROTOCOL_0_19 §E.1: a function_call, and an assistant message, need ``agent``."""
    got = item_problem(kind, data)
    assert (got is None) if problem is None else (got is not None and got.endswith(problem))
