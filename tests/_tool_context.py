"""A :class:`ToolContext` for calling a runner-local tool in-process, as the tools actor builds
one per call, for the tests of the tools that need no actor around them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from corral.server_client import ServerClient
from corral.tools._api import ToolContext

__all__ = ["tool_context"]


def tool_context(
    tmp_path: Path,
    *,
    workspace: Path | None = None,
    server: ServerClient | None = None,
    session_id: str = "conv_caller",
) -> ToolContext:
    """A context under ``tmp_path`` (the fallback dirs in ``fallback/``, the durable dir in
    ``data/``) whose ``publish`` fails the test: the tools tested with it publish nothing."""

    async def publish(event: Any) -> None:
        raise AssertionError(f"a tool published {event!r}; none should")

    return ToolContext(
        session_id=session_id,
        call_id="call_1",
        spec={},
        workspace=workspace,
        os_env_root=tmp_path / "fallback",
        timeout_s=30.0,
        publish=publish,
        data_dir=tmp_path / "data",
        server=server,
    )
