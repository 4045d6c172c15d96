"""The control plane's side of a runner's child sessions (PROTOCOL_0_19.md §J): the runner's
create, the reuse check's filters, the step 8 rows, the child's snapshot and its sub-agent's
spec out of the parent's bundle, and the runner's message to the child."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral._exceptions import ServerRejected
from tests.integration.test_control_plane import make_settings, running
from tests.integration.test_control_plane_omnigent_agents import omnigent_agents


async def test_j_the_plane_creates_lists_and_serves_a_runner_s_child_session(
    tmp_path: Path,
) -> None:
    """The server side of §J on the control plane, as the runner calls it: the create body
    of step 2, the reuse check's filters, the step 8 rows, the child's snapshot, and the
    sub-agent's spec out of the parent's bundle."""
    agents = omnigent_agents(tmp_path / "agents")
    async with running(tmp_path / "state", make_settings(agents)) as ctx:
        parent = await ctx.create("parent")
        async with ctx.runner_client() as client:
            body = {
                "agent_id": parent["agent_id"],
                "parent_session_id": parent["id"],
                "title": "child:t1",
                "sub_agent_name": "child",
                "labels": {"omnigent.subagent.dispatch_id": "subagent_0123456789ab"},
            }
            child = await client.create_session(body)
            with pytest.raises(ServerRejected) as refused:
                await client.create_session({**body, "sub_agent_name": "stranger"})
            assert refused.value.status == 422
            params = {"limit": "1", "order": "desc", "tool": "child", "session_name": "t1"}
            page = await client.read(f"/v1/sessions/{parent['id']}/child_sessions", params)
            other = {**params, "session_name": "t2"}
            none = await client.read(f"/v1/sessions/{parent['id']}/child_sessions", other)
            snap = await client.session_snapshot(child["id"])
            spec = await client.agent_bundle(child["id"], sub_agent="child")
            posted = await client.post_event(
                child["id"],
                {"type": "message", "data": {"content": [{"type": "input_text", "text": "hi"}]}},
                idempotency_key="k1",
            )
        (row,) = page["data"]
        assert row == {
            "id": child["id"],
            "object": "child_session",
            "parent_session_id": parent["id"],
            "title": "child:t1",
            "task_summary": None,
            "tool": "child",
            "session_name": "t1",
            "kind": "sub_agent",
            "created_at": row["created_at"],
            "updated_at": row["updated_at"],
            "agent_id": parent["agent_id"],
            "agent_name": "child",
            "current_task_id": None,
            "current_task_status": "launching",
            "busy": False,
            "labels": {"omnigent.subagent.dispatch_id": "subagent_0123456789ab"},
        }
        assert none["data"] == []
        assert (snap["parent_session_id"], snap["sub_agent_name"], snap["kind"]) == (
            parent["id"],
            "child",
            "sub_agent",
        )
        assert snap["root_conversation_id"] == parent["id"]
        assert (spec.name, spec.model, spec.system_prompt) == (
            "child",
            "echo",
            "You are the child.\n",
        )
        assert posted["queued"] is True


async def test_a_database_of_schema_2_gets_the_child_columns(tmp_path: Path) -> None:
    """A control plane of the previous version left a ``sessions`` table without a parent;
    opening it adds the columns and their index, and its sessions stay top-level."""
    import sqlite3

    from corral.server._store import Store

    path = tmp_path / "control.db"
    con = sqlite3.connect(path)
    con.executescript(
        "CREATE TABLE sessions (id TEXT PRIMARY KEY, agent TEXT NOT NULL, agent_id TEXT NOT NULL,"
        " agent_yaml TEXT NOT NULL, runner_id TEXT, status TEXT NOT NULL, title TEXT,"
        " labels TEXT NOT NULL DEFAULT '{}', created_at REAL NOT NULL, updated_at REAL NOT NULL,"
        " last_event_id INTEGER NOT NULL DEFAULT 0, draft TEXT,"
        " runner_seq INTEGER NOT NULL DEFAULT 0);"
        "INSERT INTO sessions (id, agent, agent_id, agent_yaml, status, created_at, updated_at)"
        " VALUES ('s1', 'a', 'id', 'name: a', 'idle', 1, 1);"
        "PRAGMA user_version = 2;"
    )
    con.close()
    store = Store(path)
    await store.open()
    try:
        row = await store.get_session("s1")
        assert row is not None and (row.parent_session_id, row.sub_agent_name) == (None, None)
        assert await store.list_children("s1", 10) == []
    finally:
        await store.close()
