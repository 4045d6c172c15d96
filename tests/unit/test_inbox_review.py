"""The tool-result policy on a sub-agent's output when ``sys_read_inbox`` drains it
(``corral.tools.inbox_review``; P-01..P-04), against the fake server, which answers 400 to a
body the 0.19.1 server refuses."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from corral.server_client import ServerClient
from corral.tools._api import ToolContext, WorkDrained
from corral.tools.inbox import TOOLS as INBOX_TOOLS
from corral.tools.inbox import Inbox
from tests.fake_server import FakeOmnigentServer

SID = "conv_parent"
EVALUATE = r"/v1/sessions/conv_parent/policies/evaluate"


@pytest.fixture
async def server(nursery: trio.Nursery) -> FakeOmnigentServer:
    fake = FakeOmnigentServer()
    await fake.start(nursery)
    fake.add_session(fake.add_agent("name: main\n"), session_id=SID)
    return fake


@pytest.fixture
async def client(server: FakeOmnigentServer) -> AsyncIterator[ServerClient]:
    async with ServerClient(server.base_url, retries=0) as c:
        yield c


def item(status: str = "completed", output: str = "SECRET_MARKER") -> dict[str, Any]:
    return {
        "type": "sub_agent",
        "task_id": "conv_child",
        "handle_id": "conv_child",
        "conversation_id": "conv_child",
        "tool_name": "worker",
        "agent": "worker",
        "title": "retry-policy",
        "status": status,
        "output": output,
        "work_id": "subagent_000000000001",
    }


async def drain(
    tmp_path: Path,
    inbox: Inbox,
    client: ServerClient | None,
    call_id: str = "call_1",
    work_drained: WorkDrained | None = None,
) -> str:
    async def publish(event: Any) -> None:
        raise AssertionError("sys_read_inbox publishes nothing")

    ctx = ToolContext(
        session_id=SID,
        call_id=call_id,
        spec={},
        workspace=None,
        os_env_root=tmp_path / "fallback",
        timeout_s=30.0,
        publish=publish,
        data_dir=tmp_path,
        inbox=inbox,
        server=client,
        work_drained=work_drained,
    )
    [tool] = INBOX_TOOLS
    return await tool.run(ctx, {})


async def test_p01_one_evaluation_per_drained_item_naming_the_send(
    tmp_path: Path, server: FakeOmnigentServer, client: ServerClient
) -> None:
    inbox = Inbox(tmp_path / "inbox")
    await inbox.push(SID, item(), key="k1")
    text = await drain(tmp_path, inbox, client)
    assert text == (
        "[System: sub-agent task conv_child completed — worker:retry-policy returned: "
        "SECRET_MARKER]"
    )
    assert await drain(tmp_path, inbox, client) == text  # the same call: no second evaluation
    (call,) = server.received("POST", EVALUATE)
    event = call.json["event"]
    assert event["type"] == "PHASE_TOOL_RESULT"
    assert event["data"]["result"] == "SECRET_MARKER"
    assert (event["request_data"]["name"], event["request_data"]["tool"]) == (
        "sys_session_send",
        "sys_session_send",
    )
    args = {"agent": "worker", "title": "retry-policy", "conversation_id": "conv_child"}
    assert event["request_data"]["args"] == event["request_data"]["arguments"] == args


@pytest.mark.parametrize(
    ("status", "answer", "shown"),
    [
        ("completed", {"result": "POLICY_ACTION_DENY", "reason": "secret output"}, (
            "completed — worker:retry-policy returned: [Result suppressed by policy: secret "
            "output]"
        )),
        ("failed", {"result": "POLICY_ACTION_DENY", "reason": "failed secret output"}, (
            "failed — worker:retry-policy error: [Result suppressed by policy: failed secret "
            "output]"
        )),
        ("completed", {"result": "POLICY_ACTION_ALLOW", "data": "<REDACTED>"}, (
            "completed — worker:retry-policy returned: <REDACTED>"
        )),
        ("completed", {"result": "POLICY_ACTION_ASK"}, (
            "completed — worker:retry-policy returned: [Result suppressed by policy: no reason "
            "given]"
        )),
        ("completed", {"result": "POLICY_ACTION_UNSPECIFIED"}, (
            "completed — worker:retry-policy returned: SECRET_MARKER"
        )),
    ],
)  # fmt: skip
async def test_p02_the_verdict_is_applied(
    tmp_path: Path,
    server: FakeOmnigentServer,
    client: ServerClient,
    status: str,
    answer: dict[str, Any],
    shown: str,
) -> None:
    server.policy = lambda session_id, body: answer
    inbox = Inbox(tmp_path / "inbox")
    await inbox.push(SID, item(status), key="k1")
    assert await drain(tmp_path, inbox, client) == f"[System: sub-agent task conv_child {shown}]"
    assert await inbox.size(SID) == 0


async def test_p03_a_failed_evaluation_fails_closed_and_is_asked_again(
    tmp_path: Path, server: FakeOmnigentServer, client: ServerClient
) -> None:
    inbox = Inbox(tmp_path / "inbox")
    await inbox.push(SID, item(output="SECRET_RETRY_MARKER"), key="k1")
    server.fail("POST", EVALUATE, status=500)
    first = await drain(tmp_path, inbox, client, "call_1")
    assert first == (
        "[System: sub-agent task conv_child completed — worker:retry-policy returned: "
        "[Result suppressed by policy: policy evaluation failed]]"
    )
    assert "SECRET_RETRY_MARKER" not in first
    assert await inbox.size(SID) == 1  # the original, back for the next drain
    second = await drain(tmp_path, inbox, client, "call_2")
    assert second.endswith("worker:retry-policy returned: SECRET_RETRY_MARKER]")
    assert len(server.received("POST", EVALUATE)) == 2
    assert await inbox.size(SID) == 0


async def test_p03_an_unknown_verdict_or_no_server_fails_closed(
    tmp_path: Path, server: FakeOmnigentServer, client: ServerClient
) -> None:
    server.policy = lambda session_id, body: {"result": "POLICY_ACTION_MAYBE"}
    inbox = Inbox(tmp_path / "inbox")
    await inbox.push(SID, item(), key="k1")
    for c, call_id in ((client, "call_1"), (None, "call_2")):
        text = await drain(tmp_path, inbox, c, call_id)
        assert "policy evaluation failed" in text and "SECRET_MARKER" not in text
        assert await inbox.size(SID) == 1


async def test_p04_cancelled_and_other_items_are_not_evaluated(
    tmp_path: Path, server: FakeOmnigentServer, client: ServerClient
) -> None:
    inbox = Inbox(tmp_path / "inbox")
    await inbox.push(SID, item("cancelled", ""), key="k1")
    await inbox.push(
        SID, {"handle_id": "h1", "tool_name": "sys_os_shell", "status": "completed"}, key="h1"
    )
    text = await drain(tmp_path, inbox, None)
    assert (
        text.split("\n\n")[0]
        == "[System: sub-agent task conv_child cancelled — worker:retry-policy]"
    )
    assert server.received("POST", EVALUATE) == []


async def test_s17_the_drain_tells_dispatch_which_results_it_took_again_on_a_replay(
    tmp_path: Path, server: FakeOmnigentServer, client: ServerClient
) -> None:
    """A result the drain took with a final verdict is reported by its work id, once the
    drain is on disk and again when the same call is replayed (a crash before the report);
    one held back by a failed evaluation (P-03) is not, until a drain takes it."""
    told: list[list[str]] = []

    async def work_drained(work_ids: list[str]) -> None:
        told.append(work_ids)

    inbox = Inbox(tmp_path / "inbox")
    await inbox.push(SID, item(), key="k1")
    server.fail("POST", EVALUATE, status=500)
    await drain(tmp_path, inbox, client, "call_1", work_drained=work_drained)
    assert told == []
    second = {**item(), "work_id": "subagent_000000000002"}
    await inbox.push(SID, second, key="k2")
    await drain(tmp_path, inbox, client, "call_2", work_drained=work_drained)
    assert told == [["subagent_000000000001", "subagent_000000000002"]]
    reloaded = Inbox(tmp_path / "inbox")  # the tools actor's next incarnation
    await drain(tmp_path, reloaded, client, "call_2", work_drained=work_drained)
    assert told[-1] == ["subagent_000000000001", "subagent_000000000002"]
    assert len(server.received("POST", EVALUATE)) == 3  # the replay evaluated nothing
