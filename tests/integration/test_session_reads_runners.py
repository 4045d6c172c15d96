"""A session tool asks the server of the runner id its session is bound through (T-26): a
real host (dispatch, policy, tools, scripted workers) serving two runner ids of two servers,
and a stand-in gateway on the bus that binds one session through each."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest

from corral.routes import HttpRequest
from tests.conftest import FAST_LIVENESS, HostProcess
from tests.fake_server import FakeOmnigentServer
from tests.integration._gateway import FakeGateway, fake_gateway
from tests.integration.test_tools_policy import agent, outputs, tool


@pytest.fixture
def other_server() -> Iterator[FakeOmnigentServer]:
    fake = FakeOmnigentServer()
    with fake.serve_in_thread():
        yield fake


def add_agent(fake: FakeOmnigentServer) -> str:
    return fake.add_agent("name: elsewhere\n")


async def _bind(gw: FakeGateway, runner_id: str, session_id: str, agent_id: str) -> None:
    """``POST /v1/sessions`` as the tunnel of ``runner_id`` delivers it."""
    body = json.dumps({"session_id": session_id, "agent_id": agent_id}).encode()
    request = HttpRequest(
        request_id=uuid.uuid4().hex,
        method="POST",
        path="/v1/sessions",
        body=body,
        reply_to=gw.peer.name,
        runner_id=runner_id,
    )
    reply = await gw.peer.call("dispatch", request, durable=True, timeout=20)
    assert reply.status < 300, reply


async def _info(gw: FakeGateway, runner_id: str, session_id: str) -> dict:
    path = f"/v1/sessions/{session_id}/events"
    body = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]}
    request = HttpRequest(
        request_id=uuid.uuid4().hex,
        method="POST",
        path=path,
        body=json.dumps(body).encode(),
        reply_to=gw.peer.name,
        runner_id=runner_id,
    )
    await gw.peer.call("dispatch", request, durable=True, timeout=20)
    assert await gw.until_status(session_id, timeout=30) == ["running", "idle"]
    (output,) = outputs(gw, session_id)
    return json.loads(output)


async def test_t26_each_session_s_tools_ask_its_own_runner_s_server(
    host_factory, server: FakeOmnigentServer, other_server: FakeOmnigentServer, tmp_path
) -> None:
    url = json.dumps(server.base_url)
    runners = (
        f'[[actors.tools.options.runners]]\nserver = {url}\nid = "r1"\n'
        f"[[actors.tools.options.runners]]\nserver = {json.dumps(other_server.base_url)}\n"
        'id = "r2"\n'
    )
    host: HostProcess = host_factory(
        FAST_LIVENESS
        + f'[actors.dispatch.options]\nserver_url = {url}\nsubscribers = ["test-gateway"]\n'
        + f"[actors.policy.options]\nserver_url = {url}\n"
        + "[actors.tools.options]\n"
        + runners
    ).start()
    # Both sessions' agents and verdicts come from the first server (dispatch and policy
    # have it as their one server); only the tools actor tells the runner ids apart.
    agent_id, one = agent(server, tmp_path, [tool("sys_session_get_info")])
    two = server.add_session(agent_id)["id"]
    server.sessions[one]["title"] = "seen on the first server"
    other_server.add_session(add_agent(other_server), session_id=two, title="on the second")
    async with fake_gateway(host.endpoint) as gw:
        await _bind(gw, "r1", one, agent_id)
        await _bind(gw, "r2", two, agent_id)
        first = await _info(gw, "r1", one)
        second = await _info(gw, "r2", two)
    assert (first["session_id"], first["title"]) == (one, "seen on the first server")
    assert (second["session_id"], second["title"]) == (two, "on the second")
    assert other_server.received("GET", f"/v1/sessions/{one}") == []
    assert len(other_server.received("GET", f"/v1/sessions/{two}")) == 1
