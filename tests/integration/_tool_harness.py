"""A test harness that asks for a runner-local tool at once, with no spec of its own."""

from __future__ import annotations

from typing import Any

from corral.harnesses._turn import TurnContext


class ToolCaller:
    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options

    async def run_turn(self, turn: TurnContext) -> None:
        await turn.call_tool("sys_os_read", {"path": "README.md"})
        await turn.text("after the tool")
