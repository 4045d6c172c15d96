"""The scripted harness's ``gather`` step (the demo ``team`` agent's wait for its two
sub-agents, #17 item 5): checked when the script is read, and merging what the tool's outputs
hold once the marker was seen ``count`` times (S-15 lines)."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from corral.harnesses.scripted import ScriptedHarness, ScriptError, script_turns

MARK = "[System: sub-agent task"


def _spec(gather: dict[str, Any]) -> dict[str, Any]:
    return {"executor": {"harness": "scripted", "script": {"turns": [[{"gather": gather}]]}}}


class _Turn:
    """The parts of a worker's TurnContext the step uses."""

    def __init__(self, spec: dict[str, Any], outputs: list[str]) -> None:
        self.spec, self.message = spec, {"content": []}
        self.outputs, self.calls, self.texts = outputs, 0, []

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        assert name == "sys_read_inbox"
        self.calls += 1
        return self.outputs.pop(0)

    async def text(self, piece: str) -> None:
        self.texts.append(piece)


@pytest.mark.parametrize(
    "bad", [{"tool": "x", "marker": "m"}, {"tool": "x", "marker": "m", "count": 0}, {"count": 1}]
)
def test_a_gather_without_tool_marker_and_count_is_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ScriptError, match="gather needs"):
        script_turns(_spec(bad))


def test_gather_calls_until_both_answers_came_then_merges_them() -> None:
    spec = _spec(
        {"tool": "sys_read_inbox", "marker": MARK, "count": 2, "every_ms": 0, "prefix": "M:\n"}
    )
    turn = _Turn(
        spec,
        [
            "Inbox is empty — no completed tasks.",
            f"{MARK} a returned: A]",
            "Inbox is empty — no completed tasks.",
            f"{MARK} b returned: B]",
        ],
    )
    trio.run(ScriptedHarness({}).run_turn, turn)
    assert turn.calls == 4
    assert "".join(turn.texts) == f"M:\n{MARK} a returned: A]\n\n{MARK} b returned: B]"
