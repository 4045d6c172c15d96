"""The read-only session tools through the real omnigent 0.19.1 server (#17): corral, its
runner, asks the server for the caller with the routes omnigent's own runner uses (T-26),
and the fast suite's fake answers them with the same keys."""

from __future__ import annotations

import json
from typing import Any

import trio

from corral.server_client import ServerClient
from tests.fake_server import FakeOmnigentServer

from ._stack import Client


async def _tool_output(client: Client, agent: str) -> tuple[str, Any]:
    """A session of ``agent`` whose model calls its tool once; that call's output."""
    session = await client.session(agent)
    stream = await client.open_stream(session)
    _, end = await client.turn(stream, "go")
    assert stream.events[end]["status"] == "idle", stream.events[end]
    items = await client.wait_items(session, 4)
    (output,) = [i for i in items if i["type"] == "function_call_output"]
    return session, json.loads(output["output"])


async def test_s32_s33_e06_sys_session_get_info_reads_the_real_server(client: Client) -> None:
    session, info = await _tool_output(client, "sessioninfo")
    assert info["session_id"] == session
    assert info["agent_name"] == "sessioninfo"
    assert info["agent_id"] == await client.agent_id("sessioninfo")
    assert info["model"] == "sessioninfo"  # the server's llm_model: no override
    assert (info["runner_id"], info["runner_online"]) == (client.runner_id, True)
    assert (info["pending_elicitations"], info["pending_elicitation_count"]) == ([], 0)
    assert info["parent_session_id"] is None and "items" not in info


async def test_s45_sys_agent_list_reads_the_real_server(client: Client) -> None:
    session, listing = await _tool_output(client, "agentlist")
    builtins = {a["name"]: a for a in listing["builtins"]}
    assert {"agentlist", "tool", "team"} <= set(builtins)
    assert builtins["tool"]["agent_id"] == await client.agent_id("tool")
    assert builtins["team"]["description"] == "interop directory-format agent"
    assert builtins["tool"]["harness"] == "openai-agents"
    (mine,) = [s for s in listing["session_agents"] if s["session_id"] == session]
    assert (mine["agent_name"], mine["agent_id"]) == (
        "agentlist",
        await client.agent_id("agentlist"),
    )
    assert listing["local_configs"] == []


async def test_s24_s26_sys_session_list_reads_the_real_server(client: Client) -> None:
    session, listing = await _tool_output(client, "sessionlist")
    assert listing["sub_agents"] == []
    (mine,) = [s for s in listing["sessions"] if s["session_id"] == session]
    assert mine["agent_name"] == "sessionlist"
    assert mine["parent_session_id"] is None


def _keys(value: Any) -> set[str]:
    assert isinstance(value, dict), value
    return set(value)


async def test_the_fake_server_s_discovery_answers_have_the_real_server_s_keys(
    client: Client,
) -> None:
    """``tests/fake_server.py`` answers the routes these tools read with the real keys."""
    session = await client.session("tool", bind=False)
    real = client.http
    agents = (await real.get("/v1/agents", params={"limit": 100})).json()
    sessions = (await real.get("/v1/sessions", params={"limit": 1000, "order": "desc"})).json()
    agent = (await real.get(f"/v1/sessions/{session}/agent")).json()
    children = (await real.get(f"/v1/sessions/{session}/child_sessions")).json()
    status = (await real.get(f"/v1/runners/{client.runner_id}/status")).json()
    fake = FakeOmnigentServer()
    async with trio.open_nursery() as nursery:
        await fake.start(nursery)
        agent_id = fake.add_agent("name: tool\n")
        fake.add_session(agent_id, session_id="s1")
        async with ServerClient(fake.base_url) as c:
            fake_agents = await c.read("/v1/agents")
            fake_sessions = await c.read("/v1/sessions")
            fake_agent = await c.read("/v1/sessions/s1/agent")
            fake_children = await c.read("/v1/sessions/s1/child_sessions")
            fake_status = await c.read("/v1/runners/r1/status")
        nursery.cancel_scope.cancel()
    for real_page, fake_page in ((agents, fake_agents), (sessions, fake_sessions)):
        assert _keys(fake_page) == _keys(real_page)
        assert _keys(fake_page["data"][0]) == _keys(real_page["data"][0])
    assert _keys(fake_agent) == _keys(agent)
    assert _keys(fake_children) == _keys(children)
    assert _keys(fake_status) == _keys(status)
