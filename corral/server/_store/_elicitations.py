"""The SQL of elicitations: approvals asked by the runner or by this server's policy."""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from ..._jsonlines import JsonObject
from .._conversation import EventLog
from ._outbox import _add_outbox
from ._rows import ElicitationRow, NotPending
from ._schema import _decode, _encode

_ELICITATION_COLUMNS = (
    "id, session_id, source, params, tool, arguments, state, action, content, created_at"
)


def _elicitation_row(row: tuple[Any, ...]) -> ElicitationRow:
    return ElicitationRow(
        id=row[0],
        session_id=row[1],
        source=row[2],
        params=_decode(row[3]),
        tool=row[4],
        arguments=None if row[5] is None else _decode(row[5]),
        state=row[6],
        action=row[7],
        content=None if row[8] is None else _decode(row[8]),
        created_at=row[9],
    )


def _get_elicitation(con: sqlite3.Connection, elicitation_id: str) -> ElicitationRow | None:
    row = con.execute(
        f"SELECT {_ELICITATION_COLUMNS} FROM elicitations WHERE id = ?", (elicitation_id,)
    ).fetchone()
    return None if row is None else _elicitation_row(row)


def _add_policy_elicitation(
    con: sqlite3.Connection,
    session_id: str,
    elicitation_id: str,
    params: JsonObject,
    tool: str,
    arguments: Any,
    event: JsonObject,
) -> int:
    stored = EventLog(con, session_id)
    con.execute(
        "INSERT INTO elicitations (id, session_id, source, params, tool, arguments, state, "
        "created_at) VALUES (?,?,?,?,?,?,?,?)",
        (
            elicitation_id,
            session_id,
            "policy",
            _encode(params).decode(),
            tool,
            _encode(arguments).decode(),
            "pending",
            stored.now,
        ),
    )
    stored.emit(event)
    return stored.save()


def _resolve_elicitation(
    con: sqlite3.Connection,
    session_id: str,
    elicitation_id: str,
    action: str,
    content: Any,
    approval: JsonObject,
    event: JsonObject,
) -> int:
    current = _get_elicitation(con, elicitation_id)
    if current is None or current.session_id != session_id:
        raise KeyError(elicitation_id)
    if current.state != "pending":
        raise NotPending(current.state)
    stored = EventLog(con, session_id)
    con.execute(
        "UPDATE elicitations SET state = 'resolved', action = ?, content = ?, resolved_at = ? "
        "WHERE id = ?",
        (
            action,
            None if content is None else _encode(content).decode(),
            stored.now,
            elicitation_id,
        ),
    )
    entry = _add_outbox(con, session_id, "approval", approval)
    stored.emit(event)
    stored.save()
    return entry


def _consume_elicitation(con: sqlite3.Connection, elicitation_id: str, action: str) -> None:
    con.execute(
        "UPDATE elicitations SET state = 'consumed', action = COALESCE(action, ?), "
        "resolved_at = COALESCE(resolved_at, ?) WHERE id = ?",
        (action, time.time(), elicitation_id),
    )
