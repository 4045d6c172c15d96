"""The read-only session tools through a real host and its embedded control plane: a scripted
agent's calls go harness → dispatch → policy → tools, and the tools actor asks the plane of
the session's runner (T-26) the routes the real server has (S-24, S-26, S-32, S-33, S-42,
S-45, E-06)."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import HostProcess, corral
from tests.integration.test_e2e import _config, _start, _stop

INSPECTOR = """
    name: inspector
    description: reads what the server knows
    executor:
      harness: scripted
      script:
        turns:
          - - {tool: sys_session_get_info, arguments: {}}
            - {tool: sys_session_list, arguments: {}}
            - {tool: sys_agent_list, arguments: {}}
            - {text: "done"}
    """


@pytest.fixture(scope="module")
def plane_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostProcess]:
    root = tmp_path_factory.mktemp("reads")
    agents = root / "agents"
    agents.mkdir()
    (agents / "inspector.yaml").write_text(textwrap.dedent(INSPECTOR))
    host = HostProcess(root / "state", _config(agents))
    try:
        yield _start(host)
    finally:
        _stop(host)


def _outputs(result: dict[str, Any]) -> list[Any]:
    return [
        json.loads(e["item"]["output"])
        for e in result["events"]
        if e["type"] == "response.output_item.done" and e["item"]["type"] == "function_call_output"
    ]


def test_s32_s45_read_tools_answer_from_the_control_plane(plane_host: HostProcess) -> None:
    out = corral(
        "send", "--state-dir", str(plane_host.state_dir), "--agent", "inspector", "go", "--json",
        timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["status"] == "idle", result
    info, listing, agents = _outputs(result)
    sid = result["session_id"]
    # S-32, S-33, E-06: the caller's own session, its runner online, nothing waiting.
    assert info["session_id"] == sid
    assert info["agent_name"] == "inspector" and info["status"] == "running"
    assert info["runner_online"] is True and info["runner_id"]
    assert (info["pending_elicitations"], info["pending_elicitation_count"]) == ([], 0)
    assert info["parent_session_id"] is None and "items" not in info
    # S-24, S-26: no children on the plane; the session in the global view, online.
    assert listing["sub_agents"] == []
    (mine,) = [s for s in listing["sessions"] if s["session_id"] == sid]
    assert mine["agent_name"] == "inspector"
    assert (mine["runner_id"], mine["runner_online"]) == (info["runner_id"], True)
    # S-45: the plane's agents, the sessions' agents; no agent configs in the cwd.
    builtins = {a["name"]: a for a in agents["builtins"]}
    assert {"inspector", "demo"} <= set(builtins)
    assert builtins["inspector"]["harness"] == "scripted"
    assert builtins["inspector"]["description"] == "reads what the server knows"
    assert {"session_id": sid, "agent_id": info["agent_id"]}.items() <= next(
        s for s in agents["session_agents"] if s["session_id"] == sid
    ).items()
    assert agents["local_configs"] == []


def test_s42_agent_get_reads_the_plane_s_agent_object(plane_host: HostProcess) -> None:
    """The plane's ``GET /v1/sessions/{id}/agent`` and ``/child_sessions`` answer the
    runner in the real server's shapes."""
    send = corral(
        "send", "--state-dir", str(plane_host.state_dir), "--agent", "inspector", "go", "--json",
        timeout=60,
    )  # fmt: skip
    sid = json.loads(send.stdout)["session_id"]
    server = json.loads((plane_host.state_dir / "server" / "server.json").read_text())
    runner = {"x-omnigent-runner-tunnel-token": _runner_token(plane_host)}
    with httpx.Client(base_url=server["url"], headers=runner, timeout=10) as http:
        agent = http.get(f"/v1/sessions/{sid}/agent").json()
        children = http.get(f"/v1/sessions/{sid}/child_sessions", params={"limit": 100}).json()
        listing = http.get("/v1/agents", params={"limit": 1000}).json()
        missing = http.get("/v1/sessions/conv_nope/agent")
    assert agent["object"] == "agent" and agent["name"] == "inspector"
    assert {"id", "version", "harness", "mcp_servers", "policies"} <= set(agent)
    assert children == {
        "object": "list",
        "data": [],
        "first_id": None,
        "last_id": None,
        "has_more": False,
    }
    assert listing["object"] == "list" and agent["id"] in [a["id"] for a in listing["data"]]
    assert missing.status_code == 404


def _runner_token(host: HostProcess) -> str:
    path: Path = host.state_dir / "server" / "runner_token"
    return path.read_text().strip()
