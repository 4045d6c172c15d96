"""``sys_session_send`` through a real host and its embedded control plane (#17): a scripted
parent hands work to a scripted child, the child's answer reaches the parent's inbox exactly
once, and the parent is woken to drain it (PROTOCOL_0_19.md §J; S-01..S-06, S-11..S-15,
S-20, S-22, S-23, P-17, P-19).

The crash tests stop dispatch, or the tools actor, at the points between the child's end and
the delivery (the ``crash_at`` option: the actor exits there as ``kill -9`` stops it, once),
and count the result in the parent's inbox file and the items the parent saw."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import HostProcess, corral, wait_until
from tests.integration.test_e2e import _config, _start, _stop

PARENT = """
    spec_version: 1
    name: team
    description: hands work to its helper
    executor:
      harness: scripted
      script:
        turns:
          - - {tool: sys_session_send, arguments: {agent: helper, title: t1, args: "hi child"}}
            - {text: "launched"}
          - - {tool: sys_read_inbox, arguments: {}}
            - {text: "merged"}
    tools:
      agents: [helper]
    """
CHILD = """
    spec_version: 1
    name: helper
    executor:
      harness: scripted
      script:
        turns:
          - - {text: "CHILD_MARKER"}
    """
#: A parent that sends to the same child twice, then by id, then with both modes.
REPEATER = """
    spec_version: 1
    name: repeater
    executor:
      harness: scripted
      script:
        turns:
          - - {tool: sys_session_send, arguments: {agent: helper, title: again, args: "one"}}
            - tool: sys_session_send
              arguments: {agent: helper, title: again, args: {input: "two"}}
            - {tool: sys_session_send, arguments: {session_id: conv_not_mine, args: "three"}}
            - {tool: sys_session_send, arguments: {session_id: x, agent: helper, args: "four"}}
    tools:
      agents: [helper]
    """


def _agents(root: Path) -> Path:
    agents = root / "agents"
    for name, parent in (("team", PARENT), ("repeater", REPEATER)):
        (agents / name / "agents" / "helper").mkdir(parents=True)
        (agents / name / "config.yaml").write_text(textwrap.dedent(parent))
        (agents / name / "agents" / "helper" / "config.yaml").write_text(textwrap.dedent(CHILD))
    return agents


def _host(root: Path, extra: str = "") -> HostProcess:
    return HostProcess(root / "state", _config(_agents(root), extra))


@pytest.fixture(scope="module")
def plane_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostProcess]:
    host = _host(tmp_path_factory.mktemp("subagents"))
    try:
        yield _start(host)
    finally:
        _stop(host)


def _send(host: HostProcess, agent: str) -> dict[str, Any]:
    out = corral(
        "send", "--state-dir", str(host.state_dir), "--agent", agent, "go", "--json", timeout=60
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout)
    assert result["status"] == "idle", result
    return result


def _plane(host: HostProcess) -> httpx.Client:
    """The plane, as the runner asks it (the runner token may read sessions and items)."""
    server = json.loads((host.state_dir / "server" / "server.json").read_text())
    token = (host.state_dir / "server" / "runner_token").read_text().strip()
    return httpx.Client(
        base_url=server["url"], headers={"x-omnigent-runner-tunnel-token": token}, timeout=10
    )


def _items(host: HostProcess, session_id: str) -> list[dict[str, Any]]:
    with _plane(host) as http:
        page = http.get(f"/v1/sessions/{session_id}/items", params={"limit": 100, "order": "asc"})
    data: list[dict[str, Any]] = page.json()["data"]
    return data


def _outputs(items: list[dict[str, Any]]) -> list[str]:
    return [i["output"] for i in items if i["type"] == "function_call_output"]


def _drained(host: HostProcess, session_id: str) -> str | None:
    """The parent's ``sys_read_inbox`` output, once its woken turn has run it."""
    outputs = _outputs(_items(host, session_id))
    return outputs[1] if len(outputs) > 1 else None


def _inbox_pushes(host: HostProcess, session_id: str) -> int:
    """How many times the parent's inbox file took a sub-agent result."""
    import hashlib

    name = hashlib.sha256(session_id.encode()).hexdigest()[:32] + ".jsonl"
    path = host.state_dir / "actors" / "tools" / "inbox" / name
    lines = [json.loads(line) for line in path.read_text().splitlines() if line]
    return sum(1 for r in lines if r.get("op") == "push" and r["item"].get("type") == "sub_agent")


def test_s01_s06_s14_the_child_s_answer_is_drained_from_the_parent_s_inbox(
    plane_host: HostProcess,
) -> None:
    result = _send(plane_host, "team")
    parent = result["session_id"]
    handle = json.loads(_outputs(_items(plane_host, parent))[0])
    # S-04: the handle at once, launching, never the child's answer.
    assert handle["status"] == "launching" and handle["kind"] == "sub_agent"
    assert (handle["agent"], handle["title"]) == ("helper", "t1")
    child = handle["conversation_id"]
    assert handle["task_id"] == handle["handle_id"] == child
    assert "CHILD_MARKER" not in handle["message"]
    # S-05: the parent's stream learned of the child, launching (the new child created first).
    kinds = [e["type"] for e in result["events"]]
    created = kinds.index("session.created")
    updated = kinds.index("session.child_session.updated")
    assert created < updated
    launching = result["events"][updated]
    assert launching["child_session_id"] == child
    assert launching["child"] == {
        "id": child,
        "title": "helper:t1",
        "tool": "helper",
        "session_name": "t1",
        "busy": False,
        "current_task_status": "launching",
    }
    # S-14, S-15: the woken parent drained the child's answer (the wake is §J step 7).
    drained = wait_until(lambda: _drained(plane_host, parent), 30, "the parent's drain")
    assert (
        drained == f"[System: sub-agent task {child} completed — helper:t1 returned: CHILD_MARKER]"
    )
    texts = [
        c["text"]
        for i in _items(plane_host, parent)
        if i["type"] == "message" and i["role"] == "user"
        for c in i["content"]
    ]
    assert texts[-1] == (
        "[System: sub-agent helper/t1 finished (completed) — 1 result waiting in inbox. "
        "Call sys_read_inbox to collect.]"
    )
    assert _inbox_pushes(plane_host, parent) == 1
    # §J step 8: the plane lists the child with its sub-agent and label.
    with _plane(plane_host) as http:
        page = http.get(f"/v1/sessions/{parent}/child_sessions").json()
        snap = http.get(f"/v1/sessions/{child}").json()
    (row,) = page["data"]
    assert {k: row[k] for k in ("id", "object", "parent_session_id", "title", "tool")} == {
        "id": child,
        "object": "child_session",
        "parent_session_id": parent,
        "title": "helper:t1",
        "tool": "helper",
    }
    assert (row["session_name"], row["kind"], row["busy"]) == ("t1", "sub_agent", False)
    assert row["labels"]["omnigent.subagent.dispatch_id"].startswith("subagent_")
    assert (snap["parent_session_id"], snap["sub_agent_name"]) == (parent, "helper")
    assert snap["root_conversation_id"] == parent


def test_s03_s12_p17_a_named_child_is_continued_and_by_id_is_child_only(
    plane_host: HostProcess,
) -> None:
    result = _send(plane_host, "repeater")
    parent = result["session_id"]
    first, second, stranger, both = (json.loads(o) for o in _outputs(_items(plane_host, parent)))
    # S-03: the second send continued the first child; S-01: both argument forms work.
    assert first["conversation_id"] == second["conversation_id"]
    assert second["status"] == "launching"
    with _plane(plane_host) as http:
        assert len(http.get(f"/v1/sessions/{parent}/child_sessions").json()["data"]) == 1
    # S-12, P-19: by id only to a direct child (an unknown one is not found).
    assert stranger == {"error": "session_not_found", "conversation_id": "conv_not_mine"}
    # P-17: never both modes.
    assert "both 'session_id' and 'agent'/'title'" in both["error"]
    kinds = [e["type"] for e in result["events"]]
    assert kinds.count("session.created") == 1  # one child, made once


@pytest.mark.parametrize(
    ("actor", "step"),
    [
        ("dispatch", "subagent_recorded"),
        ("dispatch", "subagent_pushed"),
        ("tools", "inbox_pushed"),
    ],
)
def test_s19_a_crash_between_the_child_s_end_and_delivery_delivers_once(
    tmp_path: Path, actor: str, step: str
) -> None:
    """``kill -9`` of dispatch after the result is recorded (before the push) or after the
    push (before the wake), or of the tools actor after the push (before its answer): the
    restarted actor delivers, and the parent's inbox takes the result exactly once."""
    host = _host(tmp_path, f'[actors.{actor}.options]\ncrash_at = "{step}"\n')
    try:
        _start(host)
        parent = _send(host, "team")["session_id"]
        drained = wait_until(lambda: _drained(host, parent), 60, "the parent's drain")
        assert "helper:t1 returned: CHILD_MARKER" in drained
        assert (host.state_dir / "actors" / actor / f"crashed-at-{step}").exists()
        assert _inbox_pushes(host, parent) == 1
        outputs = _outputs(_items(host, parent))
        assert sum("CHILD_MARKER" in o for o in outputs) == 1
    finally:
        _stop(host)
