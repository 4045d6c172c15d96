"""A harness kind for the zygote's tests: a turn streams its worker's ``os.environ`` (JSON)."""

from __future__ import annotations

import json
import os
from typing import Any

from corral.harnesses._turn import TurnContext


class EnvDump:
    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options

    async def run_turn(self, turn: TurnContext) -> None:
        await turn.text(json.dumps(dict(os.environ)))
