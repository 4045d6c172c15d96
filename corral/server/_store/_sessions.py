"""The SQL of sessions and what hangs off one: its items and its events (run in threads)."""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from ..._jsonlines import JsonObject
from .._conversation import (
    UnknownSession,
    insert_item,
)
from ._elicitations import _ELICITATION_COLUMNS, _elicitation_row
from ._outbox import _add_outbox
from ._rows import ItemsPage, PendingElicitation, SessionRow, UnknownCursor
from ._schema import _decode, _encode

_SESSION_COLUMNS = (
    "id, agent, agent_id, agent_yaml, runner_id, status, title, labels, created_at, "
    "updated_at, last_event_id, parent_session_id, root_session_id, sub_agent_name"
)


def _session_row(row: tuple[Any, ...]) -> SessionRow:
    return SessionRow(
        id=row[0],
        agent=row[1],
        agent_id=row[2],
        agent_yaml=row[3],
        runner_id=row[4],
        status=row[5],
        title=row[6],
        labels=_decode(row[7]),
        created_at=row[8],
        updated_at=row[9],
        last_event_id=row[10],
        parent_session_id=row[11],
        root_session_id=row[12],
        sub_agent_name=row[13],
    )


def _create_session(con: sqlite3.Connection, row: SessionRow, key: str | None) -> SessionRow:
    if key is not None:
        found = con.execute("SELECT session_id FROM session_keys WHERE key = ?", (key,)).fetchone()
        existing = None if found is None else _get_session(con, found[0])
        if existing is not None:
            return existing
        con.execute(
            "INSERT OR REPLACE INTO session_keys (key, session_id) VALUES (?,?)", (key, row.id)
        )
    con.execute(
        f"INSERT INTO sessions ({_SESSION_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (
            row.id,
            row.agent,
            row.agent_id,
            row.agent_yaml,
            row.runner_id,
            row.status,
            row.title,
            _encode(row.labels).decode(),
            row.created_at,
            row.updated_at,
            row.last_event_id,
            row.parent_session_id,
            row.root_session_id,
            row.sub_agent_name,
        ),
    )
    return row


def _get_session(con: sqlite3.Connection, session_id: str) -> SessionRow | None:
    row = con.execute(
        f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE id = ?", (session_id,)
    ).fetchone()
    return None if row is None else _session_row(row)


def _runner_seq(con: sqlite3.Connection, session_id: str) -> int:
    row = con.execute("SELECT runner_seq FROM sessions WHERE id = ?", (session_id,)).fetchone()
    return 0 if row is None else int(row[0])


def _list_sessions(con: sqlite3.Connection, limit: int) -> list[SessionRow]:
    rows = con.execute(
        f"SELECT {_SESSION_COLUMNS} FROM sessions ORDER BY created_at DESC, rowid DESC LIMIT ?",
        (limit,),
    ).fetchall()
    return [_session_row(r) for r in rows]


def _list_children(
    con: sqlite3.Connection, parent_id: str, limit: int, newest_first: bool
) -> list[SessionRow]:
    order = "DESC" if newest_first else "ASC"
    rows = con.execute(
        f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE parent_session_id = ? "
        f"ORDER BY created_at {order}, rowid {order} LIMIT ?",
        (parent_id, limit),
    ).fetchall()
    return [_session_row(r) for r in rows]


def _sessions_for_runner(con: sqlite3.Connection, runner_id: str) -> list[str]:
    rows = con.execute(
        """
        SELECT s.id FROM sessions s
        WHERE s.runner_id = ?
        ORDER BY EXISTS (SELECT 1 FROM outbox o WHERE o.session_id = s.id
                         AND o.state = 'pending') DESC,
                 s.updated_at DESC
        """,
        (runner_id,),
    ).fetchall()
    return [r[0] for r in rows]


def _snapshot_extras(
    con: sqlite3.Connection, session_id: str
) -> tuple[list[PendingElicitation], int]:
    rows = con.execute(
        f"SELECT {_ELICITATION_COLUMNS} FROM elicitations WHERE session_id = ? "
        "AND state = 'pending' ORDER BY created_at, id",
        (session_id,),
    ).fetchall()
    count = con.execute("SELECT COUNT(*) FROM items WHERE session_id = ?", (session_id,)).fetchone()
    return [_elicitation_row(r).public() for r in rows], count[0]


def _patch_session(
    con: sqlite3.Connection, session_id: str, labels: JsonObject | None, title: str | None
) -> SessionRow | None:
    session = _get_session(con, session_id)
    if session is None:
        return None
    if labels is not None:
        session.labels = {**session.labels, **labels}
    if title is not None:
        session.title = title
    session.updated_at = time.time()
    con.execute(
        "UPDATE sessions SET labels = ?, title = ?, updated_at = ? WHERE id = ?",
        (_encode(session.labels).decode(), session.title, session.updated_at, session_id),
    )
    return session


def _grant(con: sqlite3.Connection, session_id: str, user_id: str, level: int) -> None:
    con.execute(
        "INSERT OR REPLACE INTO permissions (session_id, user_id, level) VALUES (?,?,?)",
        (session_id, user_id, level),
    )


def _grants(con: sqlite3.Connection, session_id: str) -> list[tuple[str, int]]:
    rows = con.execute(
        "SELECT user_id, level FROM permissions WHERE session_id = ? ORDER BY user_id",
        (session_id,),
    ).fetchall()
    return [(r[0], int(r[1])) for r in rows]


def _touch(con: sqlite3.Connection, session_id: str) -> None:
    cursor = con.execute(
        "UPDATE sessions SET updated_at = ? WHERE id = ?", (time.time(), session_id)
    )
    if cursor.rowcount == 0:
        raise UnknownSession(session_id)


def _add_user_message(
    con: sqlite3.Connection,
    session_id: str,
    content: list[JsonObject],
    forward: JsonObject,
    key: str | None,
) -> tuple[JsonObject, int | None]:
    _touch(con, session_id)
    if key is not None:
        row = con.execute(
            "SELECT i.data FROM message_keys k JOIN items i ON i.id = k.item_id "
            "WHERE k.session_id = ? AND k.key = ?",
            (session_id, key),
        ).fetchone()
        if row is not None:
            return _decode(row[0]), None
    item = insert_item(con, session_id, {"type": "message", "role": "user", "content": content})
    if key is not None:
        con.execute(
            "INSERT INTO message_keys (session_id, key, item_id) VALUES (?,?,?)",
            (session_id, key, item["id"]),
        )
    body = {**forward, "persisted_item_id": item["id"]}
    entry = _add_outbox(con, session_id, "message", body)
    return item, entry


def _add_item(con: sqlite3.Connection, session_id: str, fields: JsonObject) -> JsonObject:
    _touch(con, session_id)
    source_id = fields.get("source_id")
    if isinstance(source_id, str):
        row = con.execute(
            "SELECT data FROM items WHERE session_id = ? AND json_extract(data, '$.source_id') = ?",
            (session_id, source_id),
        ).fetchone()
        if row is not None:
            return _decode(row[0])
    return insert_item(con, session_id, fields)


def _delete_session(con: sqlite3.Connection, session_id: str) -> bool:
    tables = ("items", "events", "elicitations", "outbox", "message_keys", "session_keys")
    for table in (*tables, "permissions"):
        con.execute(f"DELETE FROM {table} WHERE session_id = ?", (session_id,))
    return con.execute("DELETE FROM sessions WHERE id = ?", (session_id,)).rowcount > 0


def _list_items(
    con: sqlite3.Connection, session_id: str, limit: int, order: str, after: str | None
) -> ItemsPage:
    ascending = order == "asc"
    bound = None
    if after is not None:
        row = con.execute(
            "SELECT pos FROM items WHERE id = ? AND session_id = ?", (after, session_id)
        ).fetchone()
        if row is None:
            raise UnknownCursor(after)
        bound = row[0]
    sql = "SELECT data FROM items WHERE session_id = ?"
    params: list[Any] = [session_id]
    if bound is not None:
        sql += " AND pos > ?" if ascending else " AND pos < ?"
        params.append(bound)
    sql += " ORDER BY pos " + ("ASC" if ascending else "DESC") + " LIMIT ?"
    params.append(limit + 1)
    rows = con.execute(sql, params).fetchall()
    page = [_decode(r[0]) for r in rows[:limit]]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(rows) > limit,
    }


def _events_after(
    con: sqlite3.Connection, session_id: str, after: int, limit: int
) -> list[tuple[int, str, str]]:
    return con.execute(
        "SELECT seq, type, data FROM events WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?",
        (session_id, after, limit),
    ).fetchall()
