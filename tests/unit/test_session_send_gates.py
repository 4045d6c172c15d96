"""``sys_session_send``'s gates in the tool, against a server in 0.19.1's shapes (the fake):
what is refused before which server call, and what the create body carries (S-07, S-08,
S-09, P-09..P-15; the gates themselves: tests/unit/test_send_gates.py)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from corral.server_client import ServerClient
from corral.spec import load_bundle, make_bundle_files, spec_to_dict
from corral.tools import session_send
from corral.tools._api import ToolContext
from corral.tools.session_tools import TOOLS
from tests._tool_context import tool_context
from tests.fake_server import FakeOmnigentServer

SEND = {tool.name: tool for tool in TOOLS}["sys_session_send"]
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


def _context(tmp_path: Path, client: ServerClient, sub_agents: Any = None) -> ToolContext:
    async def publish(event: Any) -> None:
        return None

    async def register_work(*args: Any) -> None:
        return None

    spec: dict[str, Any] = {"tools": {"agents": ["worker"]}}
    if sub_agents is not None:
        spec["sub_agents"] = sub_agents
    return tool_context(
        tmp_path,
        server=client,
        session_id=CALLER,
        spec=spec,
        publish=publish,
        register_work=register_work,
    )


def _caller(server: FakeOmnigentServer) -> str:
    agent_id = server.add_agent("name: lead\n")
    server.add_session(agent_id, session_id=CALLER, title="main")
    return agent_id


def _creates(server: FakeOmnigentServer) -> list[dict[str, Any]]:
    return [json.loads(r.body) for r in server.received("POST", "/v1/sessions")]


def _harness(harness: str, **executor: Any) -> dict[str, Any]:
    return {"worker": {"executor": {"harness": harness, **executor}}}


async def _send(ctx: ToolContext, **args: Any) -> str:
    return await SEND.run(ctx, args)


@pytest.mark.parametrize("model", ["claude; rm -rf /", " ", 42])
async def test_p09_a_malformed_model_is_refused_before_any_server_call(
    tmp_path: Path, server: FakeOmnigentServer, client: ServerClient, model: Any
) -> None:
    _caller(server)
    server.requests.clear()
    ctx = _context(tmp_path, client, _harness("claude-native"))
    out = await _send(ctx, agent="worker", title="t", args={"input": "go", "model": model})
    assert out.startswith("Error: sys_session_send invalid 'model': ")
    assert server.requests == []


async def test_p10_a_model_by_id_is_refused_before_the_target_is_looked_up(
    tmp_path: Path, server: FakeOmnigentServer, client: ServerClient
) -> None:
    _caller(server)
    server.requests.clear()
    ctx = _context(tmp_path, client)
    out = await _send(ctx, session_id="conv_kid", args={"input": "go", "model": "gpt-5-4"})
    assert out.startswith("Error:") and "model" in out
    assert server.requests == []


async def test_p11_a_model_for_an_existing_child_names_it_and_creates_nothing(
    tmp_path: Path, server: FakeOmnigentServer, client: ServerClient
) -> None:
    agent_id = _caller(server)
    server.add_session(
        agent_id,
        session_id="conv_existing_model",
        title="worker:t",
        parent_session_id=CALLER,
        root_conversation_id=CALLER,
    )
    ctx = _context(tmp_path, client, _harness("claude-native"))
    args = {"input": "continue", "model": "claude-opus-4-8"}
    out = await _send(ctx, agent="worker", title="t", args=args)
    assert out.startswith("Error:")
    assert "conv_existing_model" in out and "sys_session_close" in out
    assert _creates(server) == [] and server.received("POST", r".*/events") == []


@pytest.mark.parametrize(
    ("harness", "model", "says"),
    [
        ("unknown-harness", "gpt-5-4", "'unknown-harness'"),
        ("claude-native", "databricks-gpt-5-4", "only runs Claude models"),
        ("codex-native", "databricks-claude-sonnet-4-6", "only runs GPT models"),
    ],
)
async def test_p12_p13_p14_a_model_the_harness_cannot_run_creates_nothing(
    tmp_path: Path,
    server: FakeOmnigentServer,
    client: ServerClient,
    harness: str,
    model: str,
    says: str,
) -> None:
    _caller(server)
    ctx = _context(tmp_path, client, _harness(harness, auth={"type": "databricks"}))
    out = await _send(ctx, agent="worker", title="t", args={"input": "go", "model": model})
    assert out.startswith("Error:") and says in out
    if "only runs" in says:  # P-13, P-14: the id as the caller sent it
        assert f"'{model}'" in out
    assert _creates(server) == []


@pytest.mark.parametrize(
    ("harness", "model", "auth", "override"),
    [
        ("claude-native", "databricks-claude-sonnet-4-6", None, "databricks-claude-sonnet-4-6"),
        ("codex-native", "databricks-gpt-5-4", None, "databricks-gpt-5-4"),
        ("claude-sdk", "claude-sonnet-4-6", {"type": "databricks"}, "databricks-claude-sonnet-4-6"),
        ("claude-sdk", "databricks-claude-opus-4-8", {"type": "api_key"}, "claude-opus-4-8"),
    ],
)
async def test_s07_s10_p15_the_model_lands_in_the_create_body_spelled_for_the_provider(
    tmp_path: Path,
    server: FakeOmnigentServer,
    client: ServerClient,
    monkeypatch: pytest.MonkeyPatch,
    harness: str,
    model: str,
    auth: dict[str, str] | None,
    override: str,
) -> None:
    monkeypatch.setattr(session_send, "CLI_PROBE", lambda name: f"/usr/bin/{name}")  # S-09
    _caller(server)
    executor = {"auth": auth} if auth else {}
    ctx = _context(tmp_path, client, _harness(harness, **executor))
    out = await _send(ctx, agent="worker", title="t", args={"input": "go", "model": model})
    assert json.loads(out)["status"] == "launching"
    (body,) = _creates(server)
    assert (body["model_override"], body["sub_agent_name"]) == (override, "worker")


async def test_s08_s09_a_fresh_dispatch_whose_cli_is_missing_creates_nothing(
    tmp_path: Path,
    server: FakeOmnigentServer,
    client: ServerClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(session_send, "CLI_PROBE", lambda name: None)
    _caller(server)
    ctx = _context(tmp_path, client, _harness("pi"))
    out = await _send(ctx, agent="worker", title="t", args="go")
    assert out.startswith("Error:") and "'pi' CLI" in out
    assert "npm install -g @earendil-works/pi-coding-agent" in out
    assert _creates(server) == []


async def test_s10_p15_a_directory_agent_s_child_takes_a_model_override(
    tmp_path: Path,
    server: FakeOmnigentServer,
    client: ServerClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The spec dispatch hands the tools is the parent's bundle as parsed: a directory
    agent's child (``agents/worker/config.yaml``, not in the parent's YAML) has its harness
    and provider there, so a model for it is checked and spelled, not refused for want of a
    harness."""
    monkeypatch.setattr(session_send, "CLI_PROBE", lambda name: f"/usr/bin/{name}")
    _caller(server)
    bundle = make_bundle_files(
        {
            "config.yaml": b"name: lead\ntools:\n  agents: [worker]\n",
            "agents/worker/config.yaml": (
                b"name: worker\nexecutor:\n  harness: claude-sdk\n  auth: {type: databricks}\n"
            ),
        }
    )
    ctx = _context(tmp_path, client)
    ctx.spec = spec_to_dict(load_bundle(bundle))
    out = await _send(ctx, agent="worker", title="t", args={"input": "go", "model": "claude-x-1"})
    assert json.loads(out)["status"] == "launching", out
    (body,) = _creates(server)
    assert body["model_override"] == "databricks-claude-x-1"


@pytest.mark.parametrize(
    "closed",
    [{"labels": {"omnigent.closed": "true"}}, {"title": "worker:closed:t"}],
    ids=["label", "legacy-title"],
)
async def test_s13_p19_a_by_id_send_to_a_closed_child_is_refused_and_posts_nothing(
    tmp_path: Path, server: FakeOmnigentServer, client: ServerClient, closed: dict[str, Any]
) -> None:
    agent_id = _caller(server)
    child = server.add_session(agent_id, parent_session_id=CALLER, **closed)["id"]
    registered: list[Any] = []
    ctx = _context(tmp_path, client)

    async def register_work(*args: Any) -> None:
        registered.append(args)

    ctx.register_work = register_work
    out = json.loads(await _send(ctx, session_id=child, args="go on"))
    assert (out["error"], out["conversation_id"]) == ("session_closed", child)
    assert server.received("POST", f"/v1/sessions/{child}/events") == []
    assert registered == [], "a closed child is not registered for fan-out"
    # The same child open: the send goes through (the refusal is the label's doing).
    server.sessions[child].update(labels={}, title="worker:t")
    assert json.loads(await _send(ctx, session_id=child, args="go on"))["status"] == "launching"
    assert len(registered) == 1
