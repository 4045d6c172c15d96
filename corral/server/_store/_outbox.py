"""The SQL of the outbox: forwards to the runner (messages, verdicts) until it answered."""

from __future__ import annotations

import sqlite3
import time

from ..._jsonlines import JsonObject
from .._conversation import append_server_events
from ._rows import OutboxEntry
from ._schema import _encode


def _add_outbox(con: sqlite3.Connection, session_id: str, kind: str, body: JsonObject) -> int:
    cursor = con.execute(
        "INSERT INTO outbox (session_id, kind, body, created_at) VALUES (?,?,?,?)",
        (session_id, kind, _encode(body).decode(), time.time()),
    )
    assert cursor.lastrowid is not None
    return cursor.lastrowid


def _next_outbox(con: sqlite3.Connection, session_id: str) -> OutboxEntry | None:
    row = con.execute(
        "SELECT id, session_id, kind, body, attempts FROM outbox "
        "WHERE session_id = ? AND state = 'pending' ORDER BY id LIMIT 1",
        (session_id,),
    ).fetchone()
    if row is None:
        return None
    return OutboxEntry(
        id=row[0], session_id=row[1], kind=row[2], body=row[3].encode(), attempts=row[4]
    )


def _has_pending_message(con: sqlite3.Connection, session_id: str) -> bool:
    row = con.execute(
        "SELECT 1 FROM outbox WHERE session_id = ? AND state = 'pending' AND kind = 'message' "
        "LIMIT 1",
        (session_id,),
    ).fetchone()
    return row is not None


def _finish_outbox(
    con: sqlite3.Connection,
    entry_id: int,
    state: str,
    status: int | None,
    result: bytes | None,
    events: list[JsonObject],
) -> None:
    row = con.execute("SELECT session_id FROM outbox WHERE id = ?", (entry_id,)).fetchone()
    if row is None:
        return
    con.execute(
        "UPDATE outbox SET state = ?, result_status = ?, result = ?, done_at = ? WHERE id = ?",
        (
            state,
            status,
            None if result is None else result.decode("utf-8", "replace"),
            time.time(),
            entry_id,
        ),
    )
    if events:
        append_server_events(con, row[0], events)


def _count_attempt(con: sqlite3.Connection, entry_id: int) -> int:
    con.execute("UPDATE outbox SET attempts = attempts + 1 WHERE id = ?", (entry_id,))
    row = con.execute("SELECT attempts FROM outbox WHERE id = ?", (entry_id,)).fetchone()
    return 0 if row is None else row[0]
