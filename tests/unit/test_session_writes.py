"""The session tools that write through the server, against a server in 0.19.1's shapes (the
fake), and ``sys_list_models``: S-29..S-31, S-36..S-41, S-47, S-48, P-05..P-08, P-18, D8."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from corral.server._session_writes import parse_form
from corral.server_client import ServerClient
from corral.tools._api import ToolContext, ToolError
from corral.tools.registry import tool_schemas
from corral.tools.session_tools import _DEFINITIONS, PENDING, READY, TOOLS
from tests._tool_context import tool_context
from tests.fake_server import FakeOmnigentServer

_TOOLS = {tool.name: tool for tool in TOOLS}
TOKEN = "tok_" + "s3cr3t" * 6
CALLER = "conv_caller"
CHILD = "conv_child"
SHARING = {"agent_session_sharing": "non-public"}


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


class Published(list[dict[str, Any]]):
    async def __call__(self, event: Any) -> None:
        self.append(dict(event))


@pytest.fixture
def published() -> Published:
    return Published()


@pytest.fixture
def ctx(tmp_path: Path, workspace: Path, client: ServerClient, published: Published) -> ToolContext:
    return tool_context(
        tmp_path, workspace=workspace, server=client, session_id=CALLER, publish=published
    )


async def run(ctx: ToolContext, name: str, **args: Any) -> Any:
    out = await _TOOLS[name].run(ctx, args)
    return json.loads(out)


def tree(server: FakeOmnigentServer, **child: Any) -> str:
    """The caller (a root) and one child of it, ``researcher:auth``; ``child`` overrides."""
    agent_id = server.add_agent("name: researcher\n")
    server.add_session(agent_id, session_id=CALLER, title="main")
    fields = {"title": "researcher:auth", "parent_session_id": CALLER}
    fields["root_conversation_id"] = CALLER
    fields.update(child)
    server.add_session(agent_id, session_id=CHILD, **fields)
    return agent_id


def writes(server: FakeOmnigentServer) -> list[Any]:
    return [r for r in server.requests if r.method != "GET"]


# -- D8: one list of which tools work ---------------------------------------------------------


def test_d8_ready_and_pending_are_read_off_the_table() -> None:
    implemented = {name for name, *_, run in _DEFINITIONS if run is not None}
    assert implemented == READY
    assert {t.name for t in TOOLS} - implemented == PENDING
    assert {"sys_session_close", "sys_session_share", "sys_session_create"} <= READY
    assert "sys_list_models" in READY


def test_t26_the_write_tools_are_advertised_when_granted() -> None:
    spec = {"spawn": True, "agent_session_sharing": "public"}
    names = {t["name"] for t in tool_schemas(spec)}
    assert {"sys_session_close", "sys_session_create", "sys_session_share"} <= names
    assert "sys_list_models" in names


# -- sys_session_close ------------------------------------------------------------------------


async def test_s29_close_patches_tombstoned_title_and_label(
    server: FakeOmnigentServer, ctx: ToolContext
) -> None:
    tree(server)
    out = await run(ctx, "sys_session_close", conversation_id=CHILD)
    assert out == {"closed": True, "conversation_id": CHILD, "agent": "researcher", "title": "auth"}
    (patch,) = writes(server)
    assert (patch.method, patch.path) == ("PATCH", f"/v1/sessions/{CHILD}")
    assert patch.json == {
        "title": f"researcher:auth:closed:{CHILD}",
        "labels": {"omnigent.closed": "true"},
        "archived": True,
    }
    # The closed child no longer answers to its (agent, title): a named send makes a new one.
    listing = await run(ctx, "sys_session_list")
    assert listing["sub_agents"] == []


async def test_s29_closing_a_closed_child_keeps_one_marker(
    server: FakeOmnigentServer, ctx: ToolContext
) -> None:
    tree(server, title=f"researcher:auth:closed:{CHILD}")
    out = await run(ctx, "sys_session_close", conversation_id=CHILD)
    assert (out["agent"], out["title"]) == ("researcher", "auth")
    assert writes(server)[0].json["title"] == f"researcher:auth:closed:{CHILD}"


async def test_s30_close_rejects_out_of_tree_target_without_patch(
    server: FakeOmnigentServer, ctx: ToolContext
) -> None:
    tree(server, root_conversation_id="conv_other_root", parent_session_id="conv_other_root")
    out = await run(ctx, "sys_session_close", conversation_id=CHILD)
    assert out == {"error": "session_out_of_tree", "conversation_id": CHILD}
    assert writes(server) == []


@pytest.mark.parametrize("side", ["caller", "target"])
async def test_p18_a_missing_root_counts_as_out_of_tree(
    server: FakeOmnigentServer, ctx: ToolContext, side: str
) -> None:
    tree(server, root_conversation_id=None if side == "target" else CALLER)
    if side == "caller":
        server.sessions[CALLER]["root_conversation_id"] = None
        server.sessions[CHILD]["root_conversation_id"] = None
    out = await run(ctx, "sys_session_close", conversation_id=CHILD)
    assert out == {"error": "session_out_of_tree", "conversation_id": CHILD}
    assert writes(server) == []


async def test_s31_close_rejects_top_level_target(
    server: FakeOmnigentServer, ctx: ToolContext
) -> None:
    tree(server, parent_session_id=None)
    out = await run(ctx, "sys_session_close", conversation_id=CHILD)
    assert out == {"error": "session_not_a_sub_agent", "conversation_id": CHILD}
    # Even the caller's own root, which is in its tree by definition.
    out = await run(ctx, "sys_session_close", conversation_id=CALLER)
    assert out == {"error": "session_not_a_sub_agent", "conversation_id": CALLER}
    assert writes(server) == []


async def test_s31_a_child_whose_title_is_not_agent_and_title_is_not_closed(
    server: FakeOmnigentServer, ctx: ToolContext
) -> None:
    tree(server, title="plain title")
    out = await run(ctx, "sys_session_close", conversation_id=CHILD)
    assert out == {"error": "session_not_a_sub_agent", "conversation_id": CHILD}
    assert writes(server) == []


@pytest.mark.parametrize(
    ("status", "error"),
    [(404, "session_not_found"), (403, "session_out_of_tree"), (401, "session_out_of_tree")],
)
async def test_close_maps_a_refused_target_read(
    server: FakeOmnigentServer, ctx: ToolContext, status: int, error: str
) -> None:
    tree(server)
    server.fail("GET", f"/v1/sessions/{CHILD}", status=status)
    out = await run(ctx, "sys_session_close", conversation_id=CHILD)
    assert out == {"error": error, "conversation_id": CHILD}
    assert writes(server) == []


async def test_close_fails_closed_when_the_caller_cannot_be_read(
    server: FakeOmnigentServer, ctx: ToolContext
) -> None:
    tree(server)
    server.fail("GET", f"/v1/sessions/{CALLER}", status=404)
    with pytest.raises(ToolError, match=r"^sys_session_close could not resolve the calling"):
        await run(ctx, "sys_session_close", conversation_id=CHILD)
    assert writes(server) == []


async def test_close_requires_a_conversation_id(ctx: ToolContext) -> None:
    with pytest.raises(ToolError, match=r"requires a non-empty 'conversation_id' string$"):
        await run(ctx, "sys_session_close")


# -- sys_session_share ------------------------------------------------------------------------


def share_ctx(tmp_path: Path, workspace: Path, client: ServerClient, **spec: Any) -> ToolContext:
    return tool_context(tmp_path, workspace=workspace, server=client, session_id=CALLER, spec=spec)


async def test_s36_share_defaults_to_caller_and_puts_grant(
    server: FakeOmnigentServer, client: ServerClient, tmp_path: Path, workspace: Path
) -> None:
    tree(server)
    ctx = share_ctx(tmp_path, workspace, client, **SHARING)
    out = await run(ctx, "sys_session_share", user_id="alice@example.com", level="edit")
    assert out == {
        "shared": True,
        "session_id": CALLER,
        "user_id": "alice@example.com",
        "level": "edit",
    }
    (put,) = writes(server)
    assert (put.method, put.path) == ("PUT", f"/v1/sessions/{CALLER}/permissions")
    assert put.json == {"user_id": "alice@example.com", "level": 2}


@pytest.mark.parametrize("spec", [{}, {"agent_session_sharing": "none"}], ids=["no-spec", "none"])
async def test_p05_share_disabled_without_share_flag(
    server: FakeOmnigentServer,
    client: ServerClient,
    tmp_path: Path,
    workspace: Path,
    spec: dict[str, Any],
) -> None:
    tree(server)
    ctx = share_ctx(tmp_path, workspace, client, **spec)
    out = await run(ctx, "sys_session_share", user_id="alice@example.com")
    assert "not enabled" in out["error"] and out["session_id"] == CALLER
    assert out["error"].startswith("sys_session_share: session sharing is not enabled")
    assert writes(server) == []


async def test_p06_non_public_rejects_public_grant(
    server: FakeOmnigentServer, client: ServerClient, tmp_path: Path, workspace: Path
) -> None:
    tree(server)
    ctx = share_ctx(tmp_path, workspace, client, **SHARING)
    out = await run(ctx, "sys_session_share", user_id="__public__")
    assert "public" in out["error"] and out["session_id"] == CALLER
    assert writes(server) == []


async def test_p07_public_tier_allows_public_read_grant(
    server: FakeOmnigentServer, client: ServerClient, tmp_path: Path, workspace: Path
) -> None:
    tree(server)
    ctx = share_ctx(tmp_path, workspace, client, agent_session_sharing="public")
    out = await run(ctx, "sys_session_share", user_id="__public__")
    assert out == {"shared": True, "session_id": CALLER, "user_id": "__public__", "level": "read"}
    (put,) = writes(server)
    assert put.json == {"user_id": "__public__", "level": 1}


@pytest.mark.parametrize(("level", "number"), [("read", 1), ("edit", 2), ("manage", 3)])
async def test_p08_share_levels(
    server: FakeOmnigentServer,
    client: ServerClient,
    tmp_path: Path,
    workspace: Path,
    level: str,
    number: int,
) -> None:
    tree(server)
    ctx = share_ctx(tmp_path, workspace, client, **SHARING)
    out = await run(ctx, "sys_session_share", session_id=CHILD, user_id="bob", level=level)
    assert (out["session_id"], out["level"]) == (CHILD, level)
    assert writes(server)[0].json == {"user_id": "bob", "level": number}
    assert server.grants[CHILD] == {"bob": number}


async def test_p08_rejects_bad_level_without_calling_server(
    server: FakeOmnigentServer, client: ServerClient, tmp_path: Path, workspace: Path
) -> None:
    ctx = share_ctx(tmp_path, workspace, client, **SHARING)
    out = await run(ctx, "sys_session_share", user_id="alice", level="admin")
    assert out == {"error": "sys_session_share: level must be one of ['edit', 'manage', 'read']"}
    assert server.requests == []


async def test_p08_order_of_checks(
    server: FakeOmnigentServer, client: ServerClient, tmp_path: Path, workspace: Path
) -> None:
    # The user first, then the enabled gate, then the public tier, then the level.
    off = share_ctx(tmp_path, workspace, client)
    with pytest.raises(ToolError, match="requires a non-empty 'user_id'"):
        await run(off, "sys_session_share", level="admin")
    out = await run(off, "sys_session_share", user_id="__public__", level="admin")
    assert "not enabled for this agent (set" in out["error"]
    non_public = share_ctx(tmp_path, workspace, client, **SHARING)
    out = await run(non_public, "sys_session_share", user_id="__public__", level="admin")
    assert "public ('__public__') sharing is not enabled" in out["error"]
    assert server.requests == []


@pytest.mark.parametrize(
    ("status", "error"),
    [(404, "session_not_found"), (401, "access_denied"), (403, "access_denied")],
)
async def test_s37_share_maps_error_statuses(
    server: FakeOmnigentServer,
    client: ServerClient,
    tmp_path: Path,
    workspace: Path,
    status: int,
    error: str,
) -> None:
    tree(server)
    server.fail("PUT", f"/v1/sessions/{CHILD}/permissions", status=status)
    ctx = share_ctx(tmp_path, workspace, client, **SHARING)
    out = await run(ctx, "sys_session_share", session_id=CHILD, user_id="alice")
    assert out == {"error": error, "session_id": CHILD}


async def test_s37_share_surfaces_server_message_on_4xx(
    server: FakeOmnigentServer, client: ServerClient, tmp_path: Path, workspace: Path
) -> None:
    tree(server)
    ctx = share_ctx(tmp_path, workspace, client, agent_session_sharing="public")
    out = await run(ctx, "sys_session_share", user_id="__public__", level="edit")
    assert out == {
        "error": "Public access is limited to read (level 1)",
        "status_code": 400,
        "session_id": CALLER,
    }
    # Without the envelope there is no message to show: the status is said instead.
    server.fail("PUT", ".*/permissions", status=409, body=b"conflict")
    out = await run(ctx, "sys_session_share", user_id="alice")
    assert out == {"error": "sys_session_share returned 409", "session_id": CALLER}


async def test_s37_an_unreachable_server_names_no_secret(tmp_path: Path, workspace: Path) -> None:
    with trio.socket.socket() as sock:  # a port nobody listens on
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with ServerClient(f"http://127.0.0.1:{port}", token=TOKEN, retries=0) as down:
        ctx = share_ctx(tmp_path, workspace, down, **SHARING)
        with pytest.raises(ToolError) as raised:
            await run(ctx, "sys_session_share", user_id="alice")
    assert str(raised.value) == "sys_session_share: the server could not be reached"


# -- sys_session_create ------------------------------------------------------------------------


async def test_s38_create_spawns_child_under_caller(
    server: FakeOmnigentServer, ctx: ToolContext, published: Published
) -> None:
    agent_id = tree(server)
    out = await run(
        ctx, "sys_session_create", agent_id=agent_id, title="auth", message="start", model="m1"
    )
    (post,) = writes(server)
    assert (post.method, post.path) == ("POST", "/v1/sessions")
    body = post.json
    assert body["parent_session_id"] == CALLER
    assert (body["agent_id"], body["title"], body["model_override"]) == (agent_id, "auth", "m1")
    assert body["initial_items"][0]["data"]["content"][0]["text"] == "start"
    child = out["conversation_id"]
    assert server.sessions[child]["parent_session_id"] == CALLER
    assert out == {
        "conversation_id": child,
        "kind": "sub_agent",
        "agent_id": agent_id,
        "agent_name": "researcher",
        "title": "auth",
        "status": "idle",
    }
    assert published == [
        {
            "type": "session.created",
            "conversation_id": CALLER,
            "child_session_id": child,
            "agent_id": agent_id,
            "parent_session_id": CALLER,
        }
    ]


async def test_s39_create_bundle_mode_uploads_child_under_caller(
    server: FakeOmnigentServer, ctx: ToolContext, workspace: Path, published: Published
) -> None:
    tree(server)
    # ${VAR} stays as written: expanding it would upload the runner's secrets.
    text = "name: helper\nexecutor:\n  harness: openai-agents\n  model: ${SECRET_MODEL}\n"
    (workspace / "helper.yaml").write_text(text)
    args = {"config_path": "helper.yaml", "title": "auth", "message": "go"}
    out = await run(ctx, "sys_session_create", **args)
    create, message = writes(server)
    assert (create.method, create.path) == ("POST", "/v1/sessions")
    parts = parse_form(create.headers["content-type"], create.body)
    assert set(parts) == {"metadata", "bundle"}
    assert json.loads(parts["metadata"][1]) == {"parent_session_id": CALLER, "title": "auth"}
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(parts["bundle"][1]))) as archive:
        (member,) = archive.getmembers()
        assert member.name == "helper.yaml"
        extracted = archive.extractfile(member)
        assert extracted is not None and extracted.read().decode() == text
    child = out["conversation_id"]
    assert (message.method, message.path) == ("POST", f"/v1/sessions/{child}/events")
    assert message.json == {
        "type": "message",
        "data": {"role": "user", "content": [{"type": "input_text", "text": "go"}]},
    }
    new_agent = server.sessions[child]["agent_id"]
    assert out == {
        "conversation_id": child,
        "kind": "sub_agent",
        "agent_id": new_agent,
        "agent_name": "helper",
        "title": "auth",
        "status": "created",
    }
    assert [e["child_session_id"] for e in published] == [child]


async def test_s41_create_maps_agent_not_found(
    server: FakeOmnigentServer, ctx: ToolContext
) -> None:
    tree(server)
    out = await run(ctx, "sys_session_create", agent_id="ag_missing", message="m")
    assert out == {"error": "agent_not_found", "agent_id": "ag_missing"}


@pytest.mark.parametrize("status", [401, 403])
async def test_s41_create_maps_access_denied(
    server: FakeOmnigentServer, ctx: ToolContext, workspace: Path, status: int
) -> None:
    agent_id = tree(server)
    server.fail("POST", "/v1/sessions", status=status, times=2)
    out = await run(ctx, "sys_session_create", agent_id=agent_id)
    assert out == {"error": "access_denied", "agent_id": agent_id}
    (workspace / "helper.yaml").write_text("name: helper\n")
    out = await run(ctx, "sys_session_create", config_path="helper.yaml")
    assert out == {"error": "access_denied", "config_path": "helper.yaml"}


async def test_s39_a_failed_first_message_names_the_child(
    server: FakeOmnigentServer, ctx: ToolContext, workspace: Path, published: Published
) -> None:
    tree(server)
    (workspace / "helper.yaml").write_text("name: helper\n")
    server.fail("POST", "/v1/sessions/.*/events", status=500)
    out = await run(ctx, "sys_session_create", config_path="helper.yaml", message="go")
    (child,) = [s for s in server.sessions if s not in (CALLER, CHILD)]
    assert out == {
        "error": "child session created but message failed: 500",
        "conversation_id": child,
    }
    assert published == []


# -- sys_list_models ---------------------------------------------------------------------------


@pytest.fixture
def providers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "omnigent-home"
    home.mkdir()
    monkeypatch.setenv("OMNIGENT_CONFIG_HOME", str(home))
    return home / "config.yaml"


def _worker_spec(harness: str) -> dict[str, Any]:
    return {
        "executor": {"harness": "openai-agents"},
        "tools": {"agents": ["worker"]},
        "sub_agents": [{"name": "worker", "executor": {"harness": harness}}],
    }


SUBSCRIPTION = "providers:\n  claude:\n    kind: subscription\n    cli: claude\n    default: true\n"


async def test_s47_list_models_dispatches_locally_with_static_provider(
    server: FakeOmnigentServer,
    client: ServerClient,
    tmp_path: Path,
    workspace: Path,
    providers: Path,
) -> None:
    providers.write_text(SUBSCRIPTION)
    spec = _worker_spec("claude-native")
    ctx = tool_context(tmp_path, workspace=workspace, server=client, session_id=CALLER, spec=spec)
    payload = await run(ctx, "sys_list_models")
    assert set(payload) == {"worker", "self"}
    worker = payload["worker"]
    assert set(worker) == {"source", "verified", "models", "note"}
    assert (worker["source"], worker["verified"]) == ("static", False)
    assert [m["id"] for m in worker["models"]] == [
        "claude-fable-5",
        "claude-opus-4-8",
        "claude-sonnet-5",
        "claude-sonnet-4-6",
        "claude-haiku-4-5",
    ]
    assert worker["note"]
    assert server.requests == []  # a static provider asks no one


async def test_s47_a_worker_only_lists_its_harness_s_family(
    client: ServerClient, tmp_path: Path, workspace: Path, providers: Path
) -> None:
    providers.write_text(SUBSCRIPTION)
    spec = _worker_spec("codex-native")
    ctx = tool_context(tmp_path, workspace=workspace, server=client, session_id=CALLER, spec=spec)
    payload = await run(ctx, "sys_list_models")
    assert payload["worker"]["models"] == []
    assert len(payload["self"]["models"]) == 5  # openai-agents keeps every family


async def test_s47_without_a_provider_every_row_says_none(
    client: ServerClient, tmp_path: Path, workspace: Path, providers: Path
) -> None:
    spec = {"tools": {"agents": ["a", "b"]}}
    ctx = tool_context(tmp_path, workspace=workspace, server=client, session_id=CALLER, spec=spec)
    payload = await run(ctx, "sys_list_models")
    assert list(payload) == ["a", "b", "self"]
    for row in payload.values():
        assert (row["source"], row["models"]) == ("none", [])
        assert "no model provider" in row["note"]


async def test_s48_list_models_requires_agent_spec(
    client: ServerClient, tmp_path: Path, workspace: Path
) -> None:
    ctx = tool_context(tmp_path, workspace=workspace, server=client, session_id=CALLER)
    out = await _TOOLS["sys_list_models"].run(ctx, {})
    assert out.startswith("Error:") and "agent spec" in out
    assert out == "Error: sys_list_models requires an agent spec"


@pytest.mark.parametrize(
    ("config", "note"),
    [
        ("providers:\n  a:\n    kind: key\n    default: true\n", "'key' provider"),
        ("providers:\n  a: {kind: subscription, cli: claude}\n  b: {kind: key}\n", "no model"),
        ("providers: [not, a, mapping]\n", "no model provider"),
        (": not yaml :\n  - [\n", "no model provider"),
    ],
    ids=["api-key", "two-without-default", "not-a-mapping", "broken-yaml"],
)
async def test_s47_a_provider_it_cannot_list_is_a_none_row_saying_why(
    client: ServerClient,
    tmp_path: Path,
    workspace: Path,
    providers: Path,
    config: str,
    note: str,
) -> None:
    providers.write_text(config)
    spec = _worker_spec("claude-native")
    ctx = tool_context(tmp_path, workspace=workspace, server=client, session_id=CALLER, spec=spec)
    payload = await run(ctx, "sys_list_models")
    for row in payload.values():
        assert (row["source"], row["verified"], row["models"]) == ("none", False, [])
        assert note in row["note"]


@pytest.mark.parametrize("bundle", [False, True], ids=["json", "bundle"])
async def test_p16_a_created_session_is_always_the_caller_s_child(
    server: FakeOmnigentServer, ctx: ToolContext, workspace: Path, bundle: bool
) -> None:
    """The model cannot pick another parent (or none): a ``parent_session_id`` among the
    arguments, or in the bundle's metadata, changes nothing the server is sent."""
    agent_id = tree(server)
    if bundle:
        (workspace / "helper.yaml").write_text("name: helper\nexecutor:\n  harness: openai\n")
        args: dict[str, Any] = {
            "config_path": "helper.yaml",
            "metadata": {"parent_session_id": "conv_evil"},
        }
    else:
        args = {"agent_id": agent_id}
    await run(ctx, "sys_session_create", **args, parent_session_id="conv_evil", title="t")
    create = writes(server)[0]
    if bundle:
        parts = parse_form(create.headers["content-type"], create.body)
        assert json.loads(parts["metadata"][1])["parent_session_id"] == CALLER
    else:
        assert create.json["parent_session_id"] == CALLER
    assert all(s.get("parent_session_id") != "conv_evil" for s in server.sessions.values())
