"""The session tools that write, through a real host and its embedded control plane: a
scripted agent's ``sys_session_create`` / ``sys_session_share`` / ``sys_list_models`` go
harness → dispatch → policy → tools → the plane, and the plane's child runs on the same
runner (S-36, S-38, S-47); ``sys_session_close`` and both create modes are run against the
plane's HTTP routes as the tools actor asks them (S-24, S-29..S-31, S-37, S-39, S-41,
P-18)."""

from __future__ import annotations

import json
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.server._agents import agent_id_for
from corral.server_client import ServerClient
from corral.tools._api import ToolContext
from corral.tools.session_tools import TOOLS
from tests.conftest import HostProcess, corral, wait_until
from tests.integration.test_e2e import _config, _start, _stop

_TOOLS = {tool.name: tool for tool in TOOLS}

HELPER = """
    name: helper
    executor:
      harness: scripted
      script:
        turns:
          - - {text: "helper here"}
    """
SPAWNER = f"""
    name: spawner
    spawn: true
    agent_session_sharing: public
    executor:
      harness: scripted
      script:
        turns:
          - - {{tool: sys_session_create, arguments: {{agent_id: {agent_id_for("helper")},
                title: auth, message: start}}}}
            - {{tool: sys_session_share, arguments: {{user_id: __public__}}}}
            - {{tool: sys_list_models, arguments: {{}}}}
            - {{text: "done"}}
    """


PROVIDERS = "providers:\n  claude:\n    kind: subscription\n    cli: claude\n    default: true\n"


@pytest.fixture(scope="module")
def plane_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostProcess]:
    root = tmp_path_factory.mktemp("writes")
    agents = root / "agents"
    agents.mkdir()
    (agents / "helper.yaml").write_text(textwrap.dedent(HELPER))
    (agents / "spawner.yaml").write_text(textwrap.dedent(SPAWNER))
    # sys_list_models reads omnigent's providers file; the variable must reach the tools actor.
    omnigent_home = root / "omnigent-home"
    omnigent_home.mkdir()
    (omnigent_home / "config.yaml").write_text(PROVIDERS)
    host = HostProcess(root / "state", _config(agents))
    try:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("OMNIGENT_CONFIG_HOME", str(omnigent_home))
            _start(host)
        yield host
    finally:
        _stop(host)


def _info(host: HostProcess) -> dict[str, Any]:
    return json.loads((host.state_dir / "server" / "server.json").read_text())


def _runner_http(host: HostProcess) -> httpx.Client:
    info = _info(host)
    headers = {"x-omnigent-runner-tunnel-token": info["runner_token"]}
    return httpx.Client(base_url=info["url"], headers=headers, timeout=10)


def _send(host: HostProcess, agent: str) -> dict[str, Any]:
    out = corral(
        "send", "--state-dir", str(host.state_dir), "--agent", agent, "go", "--json", timeout=60
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout)
    assert result["status"] == "idle", result
    return result


def _outputs(result: dict[str, Any]) -> list[Any]:
    return [
        json.loads(e["item"]["output"])
        for e in result["events"]
        if e["type"] == "response.output_item.done" and e["item"]["type"] == "function_call_output"
    ]


def _assistant_texts(http: httpx.Client, session_id: str) -> list[str]:
    items = http.get(f"/v1/sessions/{session_id}/items", params={"order": "asc"}).json()
    return [
        block.get("text")
        for item in items["data"]
        if item["type"] == "message" and item.get("role") == "assistant"
        for block in item.get("content") or []
    ]


def test_s38_s36_s47_a_scripted_agent_creates_a_child_that_runs(plane_host: HostProcess) -> None:
    result = _send(plane_host, "spawner")
    sid = result["session_id"]
    created, shared, models = _outputs(result)
    child = created["conversation_id"]
    assert created == {
        "conversation_id": child,
        "kind": "sub_agent",
        "agent_id": agent_id_for("helper"),
        "agent_name": "helper",
        "title": "auth",
        "status": "idle",
    }
    assert shared == {"shared": True, "session_id": sid, "user_id": "__public__", "level": "read"}
    assert set(models) == {"self"}  # no declared sub-agents: the caller's own row
    assert (models["self"]["source"], len(models["self"]["models"])) == ("static", 5)
    with _runner_http(plane_host) as http:
        snap = http.get(f"/v1/sessions/{child}").json()
        assert (snap["parent_session_id"], snap["root_conversation_id"]) == (sid, sid)
        assert snap["title"] == "auth" and snap["agent_name"] == "helper"
        grants = http.get(f"/v1/sessions/{sid}/permissions").json()["permissions"]
        assert grants == [{"user_id": "__public__", "conversation_id": sid, "level": 1}]
        # The child is bound to the same runner: its first message ran a turn of its own.
        wait_until(lambda: "helper here" in _assistant_texts(http, child), 30, "the child's turn")
        first = http.get(f"/v1/sessions/{child}/items", params={"order": "asc"}).json()
        assert first["data"][0]["content"][0]["text"] == "start"


# -- the tools against the plane, as the tools actor runs them ------------------------------


@pytest.fixture
async def plane(plane_host: HostProcess) -> AsyncIterator[ServerClient]:
    info = _info(plane_host)
    async with ServerClient(info["url"], token=info["runner_token"], retries=0) as client:
        yield client


def _ctx(
    session_id: str, server: ServerClient, tmp_path: Path, spec: dict[str, Any] | None = None
) -> ToolContext:
    async def publish(event: Any) -> None:
        pass

    (tmp_path / "work").mkdir(exist_ok=True)
    return ToolContext(
        session_id=session_id,
        call_id="call_1",
        spec=spec or {},
        workspace=tmp_path / "work",
        os_env_root=tmp_path / "fallback",
        timeout_s=30.0,
        publish=publish,
        data_dir=tmp_path / "data",
        server=server,
    )


async def _run(ctx: ToolContext, name: str, **args: Any) -> Any:
    return json.loads(await _TOOLS[name].run(ctx, args))


async def test_s29_s31_p18_close_through_the_plane(
    plane_host: HostProcess, plane: ServerClient, tmp_path: Path
) -> None:
    sid = _send(plane_host, "helper")["session_id"]
    other = _send(plane_host, "helper")["session_id"]
    ctx = _ctx(sid, plane, tmp_path)
    helper = agent_id_for("helper")
    child = (await _run(ctx, "sys_session_create", agent_id=helper, title="researcher:auth"))[
        "conversation_id"
    ]
    foreign = await _run(_ctx(other, plane, tmp_path), "sys_session_create", agent_id=helper)
    # S-24: the plane lists the caller's child, by its (agent, title).
    entry = {"agent": "researcher", "title": "auth", "conversation_id": child}
    listing = await _run(ctx, "sys_session_list")
    assert listing["sub_agents"] == [entry]
    (row,) = [r for r in listing["sessions"] if r["session_id"] == child]
    assert row["parent_session_id"] == sid
    # S-30: a child of another tree is refused, and not written.
    out = await _run(ctx, "sys_session_close", conversation_id=foreign["conversation_id"])
    assert out == {"error": "session_out_of_tree", "conversation_id": foreign["conversation_id"]}
    # S-31: the caller's own (top-level) session is not a sub-agent.
    out = await _run(ctx, "sys_session_close", conversation_id=sid)
    assert out == {"error": "session_not_a_sub_agent", "conversation_id": sid}
    # S-29: the tombstoned title and the label, as the plane stores them.
    out = await _run(ctx, "sys_session_close", conversation_id=child)
    assert out == {"closed": True, "conversation_id": child, "agent": "researcher", "title": "auth"}
    snap = await plane.session_snapshot(child)
    assert snap["title"] == f"researcher:auth:closed:{child}"
    assert snap["labels"]["omnigent.closed"] == "true"
    # Closed, it leaves the caller's children: a named send would make a fresh one.
    assert (await _run(ctx, "sys_session_list"))["sub_agents"] == []
    with _runner_http(plane_host) as http:
        untouched = http.get(f"/v1/sessions/{foreign['conversation_id']}").json()
    assert untouched["labels"] == {} and "closed" not in (untouched["title"] or "")
    out = await _run(ctx, "sys_session_close", conversation_id="conv_nope")
    assert out == {"error": "session_not_found", "conversation_id": "conv_nope"}


async def test_s39_bundle_mode_through_the_plane(
    plane_host: HostProcess, plane: ServerClient, tmp_path: Path
) -> None:
    sid = _send(plane_host, "helper")["session_id"]
    ctx = _ctx(sid, plane, tmp_path)
    # Named like a catalog agent on purpose: the uploaded agent is the child's own.
    own = "name: helper\nexecutor:\n  harness: scripted\n  script:\n    turns:\n"
    own += "      - - {text: uploaded here}\n"
    (tmp_path / "work" / "mine.yaml").write_text(own)
    out = await _run(ctx, "sys_session_create", config_path="mine.yaml", title="t", message="hi")
    child = out["conversation_id"]
    assert out["agent_name"] == "helper" and out["agent_id"] != agent_id_for("helper")
    assert (out["kind"], out["title"], out["status"]) == ("sub_agent", "t", "created")
    with _runner_http(plane_host) as http:
        snap = http.get(f"/v1/sessions/{child}").json()
        assert snap["parent_session_id"] == sid and snap["agent_id"] == out["agent_id"]
        wait_until(lambda: "uploaded here" in _assistant_texts(http, child), 30, "its turn")


async def test_s41_s37_refusals_through_the_plane(
    plane_host: HostProcess, plane: ServerClient, tmp_path: Path
) -> None:
    sid = _send(plane_host, "helper")["session_id"]
    ctx = _ctx(sid, plane, tmp_path, {"agent_session_sharing": "public"})
    out = await _run(ctx, "sys_session_create", agent_id="ag_missing")
    assert out == {"error": "agent_not_found", "agent_id": "ag_missing"}
    out = await _run(ctx, "sys_session_share", user_id="__public__", level="edit")
    assert out == {
        "error": "Public access is limited to read (level 1)",
        "status_code": 400,
        "session_id": sid,
    }
    out = await _run(ctx, "sys_session_share", session_id="conv_nope", user_id="bob")
    assert out == {"error": "session_not_found", "session_id": "conv_nope"}
    out = await _run(ctx, "sys_session_share", user_id="bob", level="manage")
    assert out["shared"] is True
