"""The control plane's store keeps a child's place in its spawn tree and a session's grants,
and a database of schema 2 gets the new columns when it is opened (S-29, S-36, S-38)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from corral.server._store import SessionRow, Store
from corral.server._store._schema import SCHEMA_VERSION

V2_SESSIONS = """
CREATE TABLE sessions (
    id TEXT PRIMARY KEY, agent TEXT NOT NULL, agent_id TEXT NOT NULL,
    agent_yaml TEXT NOT NULL, runner_id TEXT, status TEXT NOT NULL, title TEXT,
    labels TEXT NOT NULL DEFAULT '{}', created_at REAL NOT NULL, updated_at REAL NOT NULL,
    last_event_id INTEGER NOT NULL DEFAULT 0, draft TEXT,
    runner_seq INTEGER NOT NULL DEFAULT 0
);
INSERT INTO sessions (id, agent, agent_id, agent_yaml, status, created_at, updated_at)
VALUES ('conv_old', 'demo', 'ag_demo', 'name: demo', 'idle', 1, 1);
PRAGMA user_version = 2;
"""


def _row(session_id: str, **fields: object) -> SessionRow:
    return SessionRow(
        id=session_id, agent="demo", agent_id="ag_demo", agent_yaml="name: demo", runner_id=None,
        **fields,  # type: ignore[arg-type]
    )  # fmt: skip


async def test_a_schema_2_database_gets_the_tree_columns(tmp_path: Path) -> None:
    path = tmp_path / "control.db"
    with sqlite3.connect(path) as con:
        con.executescript(V2_SESSIONS)
    store = Store(path)
    await store.open()
    try:
        old = await store.get_session("conv_old")
        assert old is not None
        assert (old.parent_session_id, old.root_session_id) == (None, None)
        await store.create_session(
            _row("conv_child", parent_session_id="conv_old", root_session_id="conv_old")
        )
        child = await store.get_session("conv_child")
        assert child is not None
        assert (child.parent_session_id, child.root_session_id) == ("conv_old", "conv_old")
    finally:
        await store.close()
    with sqlite3.connect(path) as con:
        assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 3


async def test_grants_are_kept_replaced_and_deleted_with_the_session(tmp_path: Path) -> None:
    store = Store(tmp_path / "control.db")
    await store.open()
    try:
        await store.create_session(_row("conv_a"))
        await store.grant("conv_a", "bob", 1)
        await store.grant("conv_a", "alice", 2)
        await store.grant("conv_a", "bob", 3)
        assert await store.grants("conv_a") == [("alice", 2), ("bob", 3)]
        assert await store.delete_session("conv_a")
        assert await store.grants("conv_a") == []
    finally:
        await store.close()


async def test_a_sub_agent_s_elicitation_is_mirrored_onto_its_ancestors_streams(
    tmp_path: Path,
) -> None:
    """As the 0.19.1 server does: the request reaches the parent's and the root's streams
    with ``params.target_session_id`` naming the child that owns it (a viewer of the parent
    answers it there), and so does its resolution; a top-level session mirrors nothing."""
    store = Store(tmp_path / "control.db")
    await store.open()
    try:
        await store.create_session(_row("conv_root"))
        await store.create_session(_row("conv_mid", parent_session_id="conv_root"))
        await store.create_session(_row("conv_leaf", parent_session_id="conv_mid"))
        ask = {
            "type": "response.elicitation_request",
            "elicitation_id": "elicit_1",
            "params": {"message": "May I?"},
        }
        changed = await store.append_runner_events("conv_leaf", [ask])
        assert changed == ["conv_leaf", "conv_mid", "conv_root"]
        resolved = {"type": "response.elicitation_resolved", "elicitation_id": "elicit_1"}
        await store.append_runner_events("conv_leaf", [resolved])
        for session_id in ("conv_mid", "conv_root"):
            events = [json.loads(e) for _, _, e in await store.events_after(session_id, 0, 10)]
            assert [e["type"] for e in events] == [ask["type"], resolved["type"]]
            assert events[0]["params"] == {"message": "May I?", "target_session_id": "conv_leaf"}
        (own,) = [json.loads(e) for _, _, e in await store.events_after("conv_leaf", 0, 1)]
        assert own["params"] == {"message": "May I?"}
        assert await store.append_runner_events("conv_root", [ask]) == ["conv_root"]
    finally:
        await store.close()
