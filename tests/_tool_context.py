"""A :class:`ToolContext` for calling a runner-local tool in-process, as the tools actor builds
one per call, for the tests of the tools that need no actor around them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from corral.tools._api import ToolContext

__all__ = ["tool_context"]


def tool_context(tmp_path: Path, **fields: Any) -> ToolContext:
    """A context under ``tmp_path`` (the fallback dirs in ``fallback/``, the durable dir in
    ``data/``) for session ``conv_caller``, with no workspace, and whose ``publish`` fails
    the test (most tools publish nothing themselves); ``fields`` set any of its fields."""

    async def publish(event: Any) -> None:
        raise AssertionError(f"a tool published {event!r}; none should")

    defaults: dict[str, Any] = {
        "session_id": "conv_caller",
        "call_id": "call_1",
        "spec": {},
        "workspace": None,
        "os_env_root": tmp_path / "fallback",
        "timeout_s": 30.0,
        "publish": publish,
        "data_dir": tmp_path / "data",
    }
    return ToolContext(**{**defaults, **fields})
