"""The read-only session and agent tools against a server in 0.19.1's shapes (the fake):
S-24..S-28, S-32..S-35, S-42..S-46, E-05, E-06, P-29, T-26."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from corral.server_client import ServerClient
from corral.tools._api import ToolContext, ToolError
from corral.tools.registry import AGENT_TOOL_NAMES, SESSION_READ_TOOL_NAMES, tool_schemas
from corral.tools.session_tools import PENDING, READY, TOOLS
from tests._tool_context import tool_context
from tests.fake_server import (
    FakeOmnigentServer,
    assistant_message,
    function_call,
    function_call_output,
    user_message,
)

_TOOLS = {tool.name: tool for tool in TOOLS}
TOKEN = "tok_" + "s3cr3t" * 6
CALLER = "conv_caller"


@pytest.fixture
async def server(nursery: trio.Nursery) -> FakeOmnigentServer:
    fake = FakeOmnigentServer()
    await fake.start(nursery)
    return fake


@pytest.fixture
async def client(server: FakeOmnigentServer) -> AsyncIterator[ServerClient]:
    async with ServerClient(server.base_url, token=TOKEN, retries=0) as c:
        yield c


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    work = tmp_path / "workspace"
    work.mkdir()
    return work


@pytest.fixture
def ctx(tmp_path: Path, workspace: Path, client: ServerClient) -> ToolContext:
    return tool_context(tmp_path, workspace=workspace, server=client, session_id=CALLER)


async def run(ctx: ToolContext, name: str, **args: Any) -> Any:
    return json.loads(await _TOOLS[name].run(ctx, args))


def add_agent(server: FakeOmnigentServer, name: str = "researcher", **fields: Any) -> str:
    agent_id = server.add_agent(f"name: {name}\nexecutor: {{harness: openai-agents}}\n")
    for key, value in fields.items():
        setattr(server.agents[agent_id], key, value)
    return agent_id


def caller(server: FakeOmnigentServer, **fields: Any) -> str:
    return server.add_session(add_agent(server, "main"), session_id=CALLER, **fields)["id"]


# -- T-26: which tools work -------------------------------------------------------------------


def test_t26_read_tools_are_advertised_and_the_rest_still_hidden() -> None:
    # A spec with a sub-agent: ``sys_session_send`` works, and is granted to it.
    names = {t["name"] for t in tool_schemas({"tools": {"agents": ["helper"]}})}
    assert names >= READY & (SESSION_READ_TOOL_NAMES | AGENT_TOOL_NAMES | {"sys_session_send"})
    assert not names & PENDING


async def test_t26_without_a_server_a_read_tool_says_so(tmp_path: Path, workspace: Path) -> None:
    ctx = tool_context(tmp_path, workspace=workspace, session_id=CALLER)
    with pytest.raises(ToolError, match=r"^sys_session_get_info requires server access$"):
        await _TOOLS["sys_session_get_info"].run(ctx, {})


async def test_an_unreachable_server_is_a_tool_error_naming_no_secret(
    tmp_path: Path, workspace: Path
) -> None:
    with trio.socket.socket() as sock:  # a port nobody listens on
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with ServerClient(f"http://127.0.0.1:{port}", token=TOKEN, retries=0) as down:
        ctx = tool_context(tmp_path, workspace=workspace, server=down, session_id=CALLER)
        with pytest.raises(ToolError) as raised:
            await _TOOLS["sys_session_get_info"].run(ctx, {})
    assert str(raised.value) == "sys_session_get_info: the server could not be reached"
    assert TOKEN not in str(raised.value) and str(port) not in str(raised.value)


async def test_an_answer_in_another_shape_is_a_tool_error(
    server: FakeOmnigentServer, ctx: ToolContext
) -> None:
    caller(server)
    server.fail("GET", f"/v1/sessions/{CALLER}", status=200, body=b'{"no": "id"}')
    with pytest.raises(ToolError, match=r"^sys_session_get_info: the server's answer was not"):
        await _TOOLS["sys_session_get_info"].run(ctx, {})


# -- sys_session_get_info ---------------------------------------------------------------------


async def test_s32_e06_get_info_defaults_to_the_caller(
    server: FakeOmnigentServer, ctx: ToolContext
) -> None:
    caller(server)
    info = await run(ctx, "sys_session_get_info")
    assert info["session_id"] == CALLER
    assert info["runner_online"] is None
    assert (info["pending_elicitations"], info["pending_elicitation_count"]) == ([], 0)
    assert server.received("GET", "/v1/runners/.*") == []
    (read,) = server.received("GET", f"/v1/sessions/{CALLER}")
    assert read.params == {"include_items": "false", "include_liveness": "false"}


async def test_s33_e06_get_info_projects_metadata_and_runner_connectivity(
    server: FakeOmnigentServer, ctx: ToolContext
) -> None:
    caller(server)
    target = server.add_session(
        add_agent(server),
        session_id="conv_target",
        title="researcher:auth",
        runner_id="r1",
        parent_session_id=CALLER,
        sub_agent_name="researcher",
        llm_model="anthropic/claude-sonnet-4-6",
        model_override="claude-opus-4-8",
        pending_elicitations=[{"id": "el_1"}, {"id": "el_2"}],
        workspace="/w",
        git_branch="main",
    )
    server.online_runners.add("r1")
    info = await run(ctx, "sys_session_get_info", session_id="conv_target")
    assert info["model"] == "claude-opus-4-8"
    assert info["runner_online"] is True
    assert info["pending_elicitations"] == [{"id": "el_1"}, {"id": "el_2"}]
    assert info["pending_elicitation_count"] == 2
    assert "items" not in info
    for key in ("status", "title", "agent_id", "agent_name", "runner_id", "parent_session_id"):
        assert info[key] == target[key], key
    assert (info["workspace"], info["git_branch"], info["sub_agent_name"]) == (
        "/w",
        "main",
        "researcher",
    )
    assert len(server.received("GET", "/v1/runners/r1/status")) == 1


async def test_s33_runner_online_is_null_when_its_lookup_fails(
    server: FakeOmnigentServer, ctx: ToolContext
) -> None:
    caller(server, runner_id="r1")
    server.fail("GET", "/v1/runners/r1/status", status=500)
    assert (await run(ctx, "sys_session_get_info"))["runner_online"] is None


@pytest.mark.parametrize(
    ("status", "error"),
    [(404, "session_not_found"), (403, "access_denied"), (401, "access_denied")],
)
async def test_s34_get_info_maps_error_statuses(
    server: FakeOmnigentServer, ctx: ToolContext, status: int, error: str
) -> None:
    server.fail("GET", "/v1/sessions/conv_t", status=status)
    answer = await run(ctx, "sys_session_get_info", session_id="conv_t")
    assert answer == {"error": error, "session_id": "conv_t"}


async def test_s35_p29_native_ui_wrapper_name_is_hidden(
    server: FakeOmnigentServer, ctx: ToolContext
) -> None:
    server.add_session(add_agent(server, "pi-native-ui"), session_id=CALLER)
    text = await _TOOLS["sys_session_get_info"].run(ctx, {})
    assert json.loads(text)["agent_name"] == "Pi"
    assert "pi-native-ui" not in text
    listed = await _TOOLS["sys_session_list"].run(ctx, {})
    assert "pi-native-ui" not in listed and "Pi" in listed


# -- sys_session_list -------------------------------------------------------------------------


def child(server: FakeOmnigentServer, sid: str, title: str | None, parent: str, **kw: Any) -> None:
    server.add_session(
        add_agent(server), session_id=sid, title=title, parent_session_id=parent, **kw
    )


async def test_s24_session_list_maps_children_and_skips_closed(
    server: FakeOmnigentServer, ctx: ToolContext
) -> None:
    caller(server)
    child(server, "c1", "researcher:auth", CALLER)
    child(server, "c2", "researcher:done", CALLER, labels={"omnigent.closed": "true"})
    child(server, "c3", "researcher:legacy:closed:c3", CALLER)
    child(server, "c4", "legacy-untyped", CALLER)
    child(server, "c5", "ui:claude-native-ui:1", CALLER)
    listing = await run(ctx, "sys_session_list")
    assert listing["sub_agents"] == [
        {"agent": "researcher", "title": "auth", "conversation_id": "c1"},
        {"agent": "claude-native-ui", "title": "1", "conversation_id": "c5"},
    ]
    (children,) = server.received("GET", f"/v1/sessions/{CALLER}/child_sessions")
    assert children.params == {"limit": "100"}


async def test_s25_a_child_caller_also_sees_main_and_its_siblings(
    server: FakeOmnigentServer, ctx: ToolContext
) -> None:
    server.add_session(add_agent(server, "main"), session_id="conv_root")
    child(server, CALLER, "researcher:me", "conv_root")
    child(server, "sib", "writer:draft", "conv_root")
    child(server, "mine", "helper:x", CALLER)
    listing = await run(ctx, "sys_session_list")
    assert listing["sub_agents"] == [
        {"agent": "helper", "title": "x", "conversation_id": "mine"},
        {"agent": "main", "title": None, "conversation_id": "conv_root"},
        {"agent": "writer", "title": "draft", "conversation_id": "sib"},
    ]


async def test_s26_global_sessions_filter_and_connectivity_once_per_runner(
    server: FakeOmnigentServer, ctx: ToolContext
) -> None:
    caller(server)
    agent = add_agent(server, "coder")
    server.add_session(agent, session_id="s1", runner_id="r1", title="one")
    server.add_session(agent, session_id="s2", runner_id="r1")
    server.add_session(agent, session_id="s3", runner_id="r2")
    server.online_runners.add("r1")
    listing = await run(ctx, "sys_session_list", agent_name="coder")
    (query,) = server.received("GET", "/v1/sessions")
    assert query.params["agent_name"] == "coder"
    assert query.params["visibility"] == "all"
    rows = {row["session_id"]: row for row in listing["sessions"]}
    assert set(rows) == {"s1", "s2", "s3"}
    assert rows["s1"] == {
        "session_id": "s1",
        "agent_name": "coder",
        "title": "one",
        "status": "idle",
        "runner_id": "r1",
        "runner_online": True,
        "parent_session_id": None,
    }
    assert rows["s3"]["runner_online"] is False
    assert len(server.received("GET", "/v1/runners/r1/status")) == 1
    assert len(server.received("GET", "/v1/runners/r2/status")) == 1


async def test_s26_each_view_degrades_to_empty(
    server: FakeOmnigentServer, ctx: ToolContext
) -> None:
    caller(server)
    server.fail("GET", f"/v1/sessions/{CALLER}/child_sessions", status=500)
    server.fail("GET", "/v1/sessions", status=500)
    assert await run(ctx, "sys_session_list") == {"sub_agents": [], "sessions": []}


# -- sys_session_get_history ------------------------------------------------------------------


async def test_s27_history_is_chronological_and_projected(
    server: FakeOmnigentServer, ctx: ToolContext
) -> None:
    child(server, "conv_t", "researcher:auth", CALLER)
    server.add_item("conv_t", user_message("find it"))
    server.add_item("conv_t", function_call("sys_os_shell", '{"command": "ls"}', "call_a"))
    server.add_item("conv_t", function_call_output("call_a", "a.txt"))
    server.add_item("conv_t", assistant_message("x" * 2100))
    peek = await run(ctx, "sys_session_get_history", conversation_id="conv_t", tail_items=4)
    assert (peek["conversation_id"], peek["agent"], peek["title"]) == (
        "conv_t",
        "researcher",
        "auth",
    )
    assert peek["items"][:3] == [
        {"type": "message", "role": "user", "text": "find it"},
        {"type": "function_call", "tool": "sys_os_shell", "args": '{"command": "ls"}'},
        {"type": "function_call_output", "output": "a.txt"},
    ]
    assert peek["items"][3]["text"] == "x" * 2000 + " [truncated]"
    (items,) = server.received("GET", "/v1/sessions/conv_t/items")
    assert (items.params["order"], items.params["limit"]) == ("desc", "4")


async def test_e05_pending_elicitations_come_after_the_stored_items(
    server: FakeOmnigentServer, ctx: ToolContext
) -> None:
    schema = {"type": "object", "properties": {"q1": {}, "q2": {}}}
    prompt = "Answer 3 questions on human biology"
    child(
        server,
        "conv_t",
        "tutor:bio",
        CALLER,
        pending_elicitations=[
            {
                "type": "response.elicitation_request",
                "elicitation_id": "elicit_bio",
                "params": {"message": prompt, "requestedSchema": schema},
            }
        ],
    )
    server.add_item("conv_t", assistant_message("here are the questions"))
    peek = await run(ctx, "sys_session_get_history", conversation_id="conv_t")
    assert len(peek["items"]) == 2
    assert peek["items"][-1] == {
        "type": "pending_elicitation",
        "elicitation_id": "elicit_bio",
        "prompt": prompt,
        "fields": ["q1", "q2"],
    }


@pytest.mark.parametrize(
    ("status", "error"),
    [(404, "session_not_found"), (403, "session_out_of_tree"), (401, "session_out_of_tree")],
)
async def test_s28_history_access_errors(
    server: FakeOmnigentServer, ctx: ToolContext, status: int, error: str
) -> None:
    server.fail("GET", "/v1/sessions/conv_t/items", status=status)
    answer = await run(ctx, "sys_session_get_history", conversation_id="conv_t")
    assert answer == {"error": error, "conversation_id": "conv_t"}


async def test_s27_history_needs_a_target_and_whole_numbers(ctx: ToolContext) -> None:
    with pytest.raises(ToolError, match="requires a non-empty 'conversation_id'"):
        await run(ctx, "sys_session_get_history")
    with pytest.raises(ToolError, match=r"^tail_items must be >= 1$"):
        await run(ctx, "sys_session_get_history", conversation_id="c", tail_items=0)
    with pytest.raises(ToolError, match=r"^content_max_chars must be a whole number, got 1\.5$"):
        await run(ctx, "sys_session_get_history", conversation_id="c", content_max_chars=1.5)
    with pytest.raises(ToolError, match=r"^content_offset_chars must be >= 0$"):
        await run(ctx, "sys_session_get_history", conversation_id="c", content_offset_chars=-1)


async def test_s27_history_tail_is_clamped_and_a_long_item_is_read_in_windows(
    server: FakeOmnigentServer, ctx: ToolContext
) -> None:
    child(server, "conv_t", "researcher:auth", CALLER)
    server.add_item("conv_t", assistant_message("abcdefghij"))
    first = await run(
        ctx, "sys_session_get_history", conversation_id="conv_t", tail_items="500",
        content_max_chars=4,
    )  # fmt: skip
    assert first["items"] == [{"type": "message", "role": "assistant", "text": "abcd [truncated]"}]
    (items,) = server.received("GET", "/v1/sessions/conv_t/items")
    assert items.params["limit"] == "50"
    last = await run(
        ctx, "sys_session_get_history", conversation_id="conv_t", tail_items=1,
        content_max_chars=4, content_offset_chars=8,
    )  # fmt: skip
    assert last["items"][0]["text"] == "ij"


# -- sys_agent_* --------------------------------------------------------------------------------


async def test_s42_agent_get_projects_agent_metadata(
    server: FakeOmnigentServer, ctx: ToolContext
) -> None:
    servers = [{"name": "docs", "transport": "http"}]
    policies = [{"name": "ask_os", "type": "function", "on": ["PHASE_TOOL_CALL"]}]
    agent_id = add_agent(
        server,
        description="finds things",
        harness="openai-agents",
        mcp_servers=servers,
        policies=policies,
        version=3,
    )
    server.add_session(agent_id, session_id="conv_t")
    answer = await run(ctx, "sys_agent_get", session_id="conv_t")
    assert answer == {
        "session_id": "conv_t",
        "agent_id": agent_id,
        "name": "researcher",
        "version": 3,
        "description": "finds things",
        "harness": "openai-agents",
        "mcp_servers": servers,
        "policies": policies,
    }


@pytest.mark.parametrize("tool", ["sys_agent_get", "sys_agent_download"])
@pytest.mark.parametrize(("status", "error"), [(404, "agent_not_found"), (403, "access_denied")])
async def test_s43_agent_tools_map_errors(
    server: FakeOmnigentServer,
    ctx: ToolContext,
    workspace: Path,
    tool: str,
    status: int,
    error: str,
) -> None:
    server.fail("GET", "/v1/sessions/conv_t/agent(/contents)?", status=status)
    assert await run(ctx, tool, session_id="conv_t") == {"error": error, "session_id": "conv_t"}
    assert list(workspace.iterdir()) == []


async def test_s44_agent_download_writes_the_bundle_to_the_cwd(
    server: FakeOmnigentServer, ctx: ToolContext, workspace: Path
) -> None:
    agent_id = add_agent(server, version=5)
    server.agents[agent_id].name = "my agent"
    server.add_session(agent_id, session_id="conv_t")
    answer = await run(ctx, "sys_agent_download", session_id="conv_t")
    dest = workspace / "my_agent-v5.tar.gz"
    assert answer == {
        "path": str(dest),
        "agent_name": "my agent",
        "agent_version": "5",
        "bytes_written": dest.stat().st_size,
    }
    assert dest.read_bytes() == server.agents[agent_id].bundle()
    with tarfile.open(fileobj=io.BytesIO(dest.read_bytes())) as tar:
        assert tar.getnames() == ["my agent.yaml"]
    assert sorted(p.name for p in workspace.iterdir()) == ["my_agent-v5.tar.gz"]


async def test_p20_a_refused_name_never_asks_the_server(
    server: FakeOmnigentServer, ctx: ToolContext
) -> None:
    with pytest.raises(ToolError, match="bare file name"):
        await run(ctx, "sys_agent_download", session_id="conv_t", dest_filename="../x.tar.gz")
    assert server.requests == []


async def test_s45_agent_list_merges_three_sources(
    server: FakeOmnigentServer, ctx: ToolContext, workspace: Path
) -> None:
    agent_id = add_agent(server, "coder", description="writes code", harness="openai-agents")
    server.add_session(agent_id, session_id="s1", status="running")
    configs = workspace / ".omnigent" / "agent-configs"
    configs.mkdir(parents=True)
    (configs / "helper.yaml").write_text("name: helper\ndescription: helps\n")
    (configs / "broken.yaml").write_text("- not a mapping\n")
    listing = await run(ctx, "sys_agent_list")
    assert listing["builtins"] == [
        {
            "agent_id": agent_id,
            "name": "coder",
            "description": "writes code",
            "harness": "openai-agents",
            "available_on_host": None,
            "unavailable_reason": None,
        }
    ]
    assert listing["session_agents"] == [
        {"session_id": "s1", "agent_id": agent_id, "agent_name": "coder", "status": "running"}
    ]
    assert listing["local_configs"] == [
        {"name": "helper", "path": str(configs / "helper.yaml"), "description": "helps"}
    ]


async def test_s46_agent_list_degrades_one_section_at_a_time(
    server: FakeOmnigentServer, ctx: ToolContext
) -> None:
    server.fail("GET", "/v1/agents", status=500)
    server.fail("GET", "/v1/sessions", status=500)
    answer = await run(ctx, "sys_agent_list")
    assert answer == {"builtins": [], "session_agents": [], "local_configs": []}
