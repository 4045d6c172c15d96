"""``sys_cancel_task`` in the tool, against a server in 0.19.1's shapes (the fake): what each
kind of child is sent and what the caller is told (S-49, S-50, S-51, S-52). Through a real host
and its cancel of a running child: tests/integration/test_subagents_cancel.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from corral.server_client import ServerClient
from corral.tools.session_cancel import BEST_EFFORT, REQUESTED
from corral.tools.session_tools import TOOLS
from tests._tool_context import tool_context
from tests.fake_server import FakeOmnigentServer

CANCEL = {tool.name: tool for tool in TOOLS}["sys_cancel_task"]
CALLER = "conv_caller"


@pytest.fixture
async def server(nursery: trio.Nursery) -> FakeOmnigentServer:
    fake = FakeOmnigentServer()
    await fake.start(nursery)
    return fake


@pytest.fixture
async def client(server: FakeOmnigentServer) -> AsyncIterator[ServerClient]:
    async with ServerClient(server.base_url, retries=0) as c:
        yield c


class Registry:
    """The work registry's answer to a cancel, as dispatch gives it: (found, status)."""

    def __init__(self, work: dict[str, str]) -> None:
        self.work = work
        self.calls: list[tuple[str, bool]] = []

    async def cancel(self, child: str, confirmed: bool) -> tuple[bool, str | None]:
        self.calls.append((child, confirmed))
        if child not in self.work:
            return False, None
        if confirmed:
            self.work[child] = "cancelled"
        return True, self.work[child]


def _child(server: FakeOmnigentServer, wrapper: str | None) -> str:
    agent_id = server.add_agent("name: lead\n")
    server.add_session(agent_id, session_id=CALLER)
    labels = {} if wrapper is None else {"omnigent.wrapper": wrapper}
    return str(server.add_session(agent_id, parent_session_id=CALLER, labels=labels)["id"])


async def _cancel(tmp_path: Path, client: ServerClient, registry: Registry, task: str) -> str:
    ctx = tool_context(tmp_path, server=client, session_id=CALLER, cancel_work=registry.cancel)
    return await CANCEL.run(ctx, {"task_id": task})


def _posted(server: FakeOmnigentServer, child: str) -> list[Any]:
    return [json.loads(r.body) for r in server.received("POST", f"/v1/sessions/{child}/events")]


async def test_s49_a_claude_native_child_is_stopped_and_its_work_ends_cancelled(
    tmp_path: Path, server: FakeOmnigentServer, client: ServerClient
) -> None:
    child = _child(server, "claude-code-native-ui")
    registry = Registry({child: "launching"})
    out = json.loads(await _cancel(tmp_path, client, registry, child))
    assert out == {"cancelled": True, "task_id": child, "status": "cancelled"}
    assert _posted(server, child) == [{"type": "stop_session", "data": {}}]
    assert registry.calls == [(child, False), (child, True)]


async def test_s50_a_codex_native_child_is_interrupted_best_effort(
    tmp_path: Path, server: FakeOmnigentServer, client: ServerClient
) -> None:
    child = _child(server, "codex-native-ui")
    registry = Registry({child: "launching"})
    out = json.loads(await _cancel(tmp_path, client, registry, child))
    assert out == {
        "cancel_requested": True,
        "cancel_confirmed": False,
        "best_effort": True,
        "task_id": child,
        "status": "launching",
        "message": BEST_EFFORT,
    }
    assert _posted(server, child) == [{"type": "interrupt", "data": {}}]
    assert registry.calls == [(child, False)], "nothing confirms it"


async def test_s51_any_other_child_is_interrupted_never_stopped(
    tmp_path: Path, server: FakeOmnigentServer, client: ServerClient
) -> None:
    child = _child(server, None)
    registry = Registry({child: "in_progress"})
    out = json.loads(await _cancel(tmp_path, client, registry, child))
    assert out == {
        "cancel_requested": True,
        "cancel_confirmed": False,
        "task_id": child,
        "status": "in_progress",
        "message": REQUESTED,
    }
    assert _posted(server, child) == [{"type": "interrupt", "data": {}}]


async def test_s52_unknown_or_ended_work_posts_nothing(
    tmp_path: Path, server: FakeOmnigentServer, client: ServerClient
) -> None:
    child = _child(server, None)
    registry = Registry({child: "completed"})
    assert json.loads(await _cancel(tmp_path, client, registry, child)) == {
        "cancelled": False,
        "task_id": child,
        "status": "completed",
    }
    assert await _cancel(tmp_path, client, registry, "conv_nobody") == (
        "Error: no in-flight task with task_id conv_nobody"
    )
    assert _posted(server, child) == []
