"""The control plane's durable state: one SQLite database in WAL mode (``control.db``).

Tables: ``sessions``, ``items`` (the conversation store of PROTOCOL_FACTS §iii.6), ``events``
(every session event with a per-session sequence number, the ids of the client stream),
``elicitations`` (pending and resolved approvals) and ``outbox`` (messages and verdicts for the
runner that must survive a restart until the runner has answered them).

Everything that must agree is written in one transaction: a user message and its outbox entry;
a verdict, its outbox entry and its ``response.elicitation_resolved`` event; a batch of runner
events together with the items they produce and the assistant-text draft. So a crash at any
point leaves either all of it or none, and a restarted server continues exactly where the
database says.

The conversation store (items built from the runner's events) is ``_conversation.py``.

Durability: a commit that a client is told about (a message, a verdict, a new session) is on
disk when it returns (``synchronous=FULL``); the runner's event stream is committed without an
fsync of its own (``NORMAL``: it survives a crash of this process, and the next durable commit
syncs it), because an fsync per relayed frame would cap the server at the disk's fsync rate.

SQLite calls block, so every call runs in a worker thread. One connection writes and one reads,
each behind a ``CapacityLimiter(1)`` (a connection is used by one thread at a time); WAL lets
the reader see every committed write without waiting for the writer. Worker threads are not
abandoned on cancellation, so a transaction that started always finishes.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import trio

from ._conversation import (
    EventLog,
    UnknownSession,
    append_runner_events,
    append_server_events,
    insert_item,
)

__all__ = [
    "ElicitationRow",
    "NotPending",
    "OutboxEntry",
    "SessionRow",
    "Store",
    "UnknownCursor",
    "UnknownSession",
]

log = logging.getLogger("corral.server.store")

SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    agent TEXT NOT NULL,
    agent_id TEXT NOT NULL,
    agent_yaml TEXT NOT NULL,
    runner_id TEXT,
    status TEXT NOT NULL,
    title TEXT,
    labels TEXT NOT NULL DEFAULT '{}',
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    last_event_id INTEGER NOT NULL DEFAULT 0,
    draft TEXT
);
CREATE TABLE IF NOT EXISTS items (
    pos INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    session_id TEXT NOT NULL,
    type TEXT NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS items_by_session ON items (session_id, pos);
CREATE TABLE IF NOT EXISTS events (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    type TEXT NOT NULL,
    data TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS elicitations (
    id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    source TEXT NOT NULL,
    params TEXT NOT NULL,
    tool TEXT,
    arguments TEXT,
    state TEXT NOT NULL,
    action TEXT,
    content TEXT,
    created_at REAL NOT NULL,
    resolved_at REAL
);
CREATE INDEX IF NOT EXISTS elicitations_by_session ON elicitations (session_id, state);
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    body TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',
    attempts INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    done_at REAL,
    result_status INTEGER,
    result TEXT
);
CREATE INDEX IF NOT EXISTS outbox_by_session ON outbox (session_id, state, id);
"""

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.decode
T = TypeVar("T")


class UnknownCursor(LookupError):
    """An items ``after`` cursor names no item of the session."""


class NotPending(Exception):
    """The elicitation exists but was already resolved (``state`` says how)."""

    def __init__(self, state: str) -> None:
        super().__init__(f"the elicitation is {state}")
        self.state = state


class SessionRow(msgspec.Struct, kw_only=True):
    """One row of ``sessions``."""

    id: str
    agent: str
    agent_id: str
    agent_yaml: str
    runner_id: str | None
    status: str = "idle"
    title: str | None = None
    labels: dict[str, Any] = {}
    created_at: float = 0.0
    updated_at: float = 0.0
    last_event_id: int = 0


class ElicitationRow(msgspec.Struct, kw_only=True):
    """One row of ``elicitations``: ``source`` is ``runner`` (seen on its stream) or ``policy``
    (asked by this server's ``/mcp``); ``state`` is ``pending``, ``resolved`` or ``consumed``
    (a policy elicitation whose approved call ran)."""

    id: str
    session_id: str
    source: str
    params: dict[str, Any]
    tool: str | None
    arguments: Any
    state: str
    action: str | None
    content: Any
    created_at: float

    def public(self) -> dict[str, Any]:
        """The entry of a snapshot's ``pending_elicitations``."""
        params = self.params
        return {
            "id": self.id,
            "elicitation_id": self.id,
            "params": params,
            "message": params.get("message") if isinstance(params, dict) else None,
            "source": self.source,
            "created_at": int(self.created_at),
        }


class OutboxEntry(msgspec.Struct, kw_only=True):
    """A pending forward to the runner: ``kind`` ``message`` or ``approval``, its JSON body."""

    id: int
    session_id: str
    kind: str
    body: bytes
    attempts: int


class Store:
    """The database; call :meth:`open` first and :meth:`close` at the end."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._writer: sqlite3.Connection | None = None
        self._reader: sqlite3.Connection | None = None
        self._write_limiter = trio.CapacityLimiter(1)
        self._read_limiter = trio.CapacityLimiter(1)

    # -- lifecycle -------------------------------------------------------------------------

    async def open(self) -> None:
        """Open (creating if needed) the database and its schema."""
        await trio.to_thread.run_sync(self._open)

    def _open(self) -> None:
        writer = _connect(self.path)
        version = writer.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            writer.close()
            raise RuntimeError(
                f"{self.path} has schema version {version}; this corral knows {SCHEMA_VERSION}"
            )
        writer.executescript(_SCHEMA)
        writer.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        self._writer = writer
        self._reader = _connect(self.path)

    async def close(self) -> None:
        """Close both connections (after any running call finished)."""
        async with self._write_limiter, self._read_limiter:
            for con in (self._writer, self._reader):
                if con is not None:
                    con.close()
            self._writer = self._reader = None

    async def _write(self, fn: Callable[..., T], *args: Any, durable: bool = True) -> T:
        """Run ``fn(con, *args)`` in a write transaction.

        ``durable`` transactions are fsynced before they return (``synchronous=FULL``): what a
        client was told is stored (a message, a verdict) survives a power cut. The others
        (the runner's event stream, at up to hundreds of frames a second) survive a crash of
        this process but may lose their last moments to a power cut; the next durable commit
        syncs them too. An fsync per relayed frame would cap the whole server at the disk's
        fsync rate (about 100 a second on a busy disk).
        """
        sync = "PRAGMA synchronous = FULL" if durable else "PRAGMA synchronous = NORMAL"
        return await trio.to_thread.run_sync(
            _in_transaction, self._con(self._writer), "BEGIN IMMEDIATE", fn, args, sync,
            limiter=self._write_limiter,
        )  # fmt: skip

    async def _read(self, fn: Callable[..., T], *args: Any) -> T:
        return await trio.to_thread.run_sync(
            _in_transaction, self._con(self._reader), "BEGIN", fn, args, None,
            limiter=self._read_limiter,
        )  # fmt: skip

    @staticmethod
    def _con(con: sqlite3.Connection | None) -> sqlite3.Connection:
        if con is None:
            raise RuntimeError("the store is not open")
        return con

    # -- sessions --------------------------------------------------------------------------

    async def create_session(self, row: SessionRow) -> None:
        """Insert a new session."""
        await self._write(_create_session, row)

    async def get_session(self, session_id: str) -> SessionRow | None:
        """The session, or None."""
        return await self._read(_get_session, session_id)

    async def list_sessions(self, limit: int) -> list[SessionRow]:
        """Sessions, newest first."""
        return await self._read(_list_sessions, limit)

    async def sessions_for_runner(self, runner_id: str) -> list[str]:
        """Ids of the sessions bound to ``runner_id``: those with undelivered forwards first,
        then the most recently active, so a reconnect serves waiting work first."""
        return await self._read(_sessions_for_runner, runner_id)

    async def snapshot_extras(self, session_id: str) -> tuple[list[dict[str, Any]], int]:
        """The pending elicitations and the number of items of a session."""
        return await self._read(_snapshot_extras, session_id)

    async def delete_session(self, session_id: str) -> bool:
        """Delete a session with its items, events, elicitations and outbox; False if absent."""
        return await self._write(_delete_session, session_id)

    async def patch_session(
        self, session_id: str, labels: dict[str, Any] | None, title: str | None
    ) -> SessionRow | None:
        """Merge ``labels`` into the session's and set ``title`` (each when not None)."""
        return await self._write(_patch_session, session_id, labels, title)

    # -- items -----------------------------------------------------------------------------

    async def add_user_message(
        self, session_id: str, content: list[dict[str, Any]], forward: dict[str, Any]
    ) -> tuple[dict[str, Any], int]:
        """Persist a user message and its forward to the runner, in one transaction.

        ``forward`` is the event body for the runner (§ii.7) without ``persisted_item_id``,
        which is added here. Returns the stored item and the outbox entry id.
        """
        return await self._write(_add_user_message, session_id, content, forward)

    async def add_item(self, session_id: str, fields: dict[str, Any]) -> dict[str, Any]:
        """Persist one item (``type`` and its fields; ``response_id`` optional).

        An item with a ``source_id`` (the runner's idempotency key) that the session already
        holds is not stored again; the stored one is returned.
        """
        return await self._write(_add_item, session_id, fields)

    async def list_items(
        self, session_id: str, *, limit: int, order: str, after: str | None
    ) -> dict[str, Any]:
        """One page of items in the list shape of §iii.6.

        Raises:
            UnknownCursor: ``after`` names no item of this session.
        """
        return await self._read(_list_items, session_id, limit, order, after)

    # -- events ----------------------------------------------------------------------------

    async def append_runner_events(self, session_id: str, events: list[dict[str, Any]]) -> int:
        """Store events relayed from the runner (heartbeats are dropped), building items.

        Returns the session's last event id afterwards.

        Raises:
            UnknownSession: no such session.
        """
        return await self._write(append_runner_events, session_id, events, durable=False)

    async def append_server_events(self, session_id: str, events: list[dict[str, Any]]) -> int:
        """Store events the server itself publishes; returns the last event id."""
        return await self._write(append_server_events, session_id, events)

    async def events_after(
        self, session_id: str, after: int, limit: int
    ) -> list[tuple[int, str, str]]:
        """Up to ``limit`` events with ``seq > after``, in order: ``(seq, type, json)``."""
        return await self._read(_events_after, session_id, after, limit)

    # -- elicitations ----------------------------------------------------------------------

    async def get_elicitation(self, elicitation_id: str) -> ElicitationRow | None:
        """The elicitation, or None."""
        return await self._read(_get_elicitation, elicitation_id)

    async def add_policy_elicitation(
        self,
        session_id: str,
        elicitation_id: str,
        params: dict[str, Any],
        tool: str,
        arguments: Any,
        event: dict[str, Any],
    ) -> int:
        """Record an elicitation this server asked (a policy ``ask`` on ``/mcp``) and publish
        ``event`` (its ``response.elicitation_request``); returns the event id."""
        return await self._write(
            _add_policy_elicitation, session_id, elicitation_id, params, tool, arguments, event
        )

    async def resolve_elicitation(
        self,
        session_id: str,
        elicitation_id: str,
        action: str,
        content: Any,
        approval: dict[str, Any],
        event: dict[str, Any],
    ) -> int:
        """Store a verdict, its forward to the runner and ``event``, in one transaction.

        Returns the outbox entry id.

        Raises:
            KeyError: no such elicitation in this session.
            NotPending: it was already resolved.
        """
        return await self._write(
            _resolve_elicitation, session_id, elicitation_id, action, content, approval, event
        )

    async def consume_elicitation(self, elicitation_id: str, action: str) -> None:
        """Mark a policy elicitation as used by its retried call (with the action taken)."""
        await self._write(_consume_elicitation, elicitation_id, action)

    # -- outbox ----------------------------------------------------------------------------

    async def next_outbox(self, session_id: str) -> OutboxEntry | None:
        """The oldest undelivered forward of a session."""
        return await self._read(_next_outbox, session_id)

    async def has_pending_message(self, session_id: str) -> bool:
        """Whether a user message of the session still waits to be forwarded."""
        return await self._read(_has_pending_message, session_id)

    async def finish_outbox(
        self,
        entry_id: int,
        state: str,
        status: int | None,
        result: bytes | None,
        events: list[dict[str, Any]],
    ) -> None:
        """Close an outbox entry (``delivered`` or ``failed``) and publish ``events``."""
        await self._write(_finish_outbox, entry_id, state, status, result, events)

    async def count_attempt(self, entry_id: int) -> int:
        """Count one failed delivery attempt; returns the attempts so far."""
        return await self._write(_count_attempt, entry_id)


# --- the SQL, run in worker threads ----------------------------------------------------------


def _connect(path: Path) -> sqlite3.Connection:
    con = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
    con.execute("PRAGMA journal_mode = WAL")
    con.execute("PRAGMA synchronous = FULL")  # per transaction: see Store._write
    return con


def _in_transaction(
    con: sqlite3.Connection,
    begin: str,
    fn: Callable[..., T],
    args: tuple[Any, ...],
    sync: str | None,
) -> T:
    if sync is not None:
        con.execute(sync)  # a connection setting; it cannot change inside a transaction
    con.execute(begin)
    try:
        result = fn(con, *args)
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")
    return result


_SESSION_COLUMNS = (
    "id, agent, agent_id, agent_yaml, runner_id, status, title, labels, created_at, "
    "updated_at, last_event_id"
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
    )


def _create_session(con: sqlite3.Connection, row: SessionRow) -> None:
    con.execute(
        f"INSERT INTO sessions ({_SESSION_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
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
        ),
    )


def _get_session(con: sqlite3.Connection, session_id: str) -> SessionRow | None:
    row = con.execute(
        f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE id = ?", (session_id,)
    ).fetchone()
    return None if row is None else _session_row(row)


def _list_sessions(con: sqlite3.Connection, limit: int) -> list[SessionRow]:
    rows = con.execute(
        f"SELECT {_SESSION_COLUMNS} FROM sessions ORDER BY created_at DESC, rowid DESC LIMIT ?",
        (limit,),
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


def _snapshot_extras(con: sqlite3.Connection, session_id: str) -> tuple[list[dict[str, Any]], int]:
    rows = con.execute(
        f"SELECT {_ELICITATION_COLUMNS} FROM elicitations WHERE session_id = ? "
        "AND state = 'pending' ORDER BY created_at, id",
        (session_id,),
    ).fetchall()
    count = con.execute("SELECT COUNT(*) FROM items WHERE session_id = ?", (session_id,)).fetchone()
    return [_elicitation_row(r).public() for r in rows], count[0]


def _patch_session(
    con: sqlite3.Connection, session_id: str, labels: dict[str, Any] | None, title: str | None
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


def _touch(con: sqlite3.Connection, session_id: str) -> None:
    cursor = con.execute(
        "UPDATE sessions SET updated_at = ? WHERE id = ?", (time.time(), session_id)
    )
    if cursor.rowcount == 0:
        raise UnknownSession(session_id)


def _add_user_message(
    con: sqlite3.Connection,
    session_id: str,
    content: list[dict[str, Any]],
    forward: dict[str, Any],
) -> tuple[dict[str, Any], int]:
    _touch(con, session_id)
    item = insert_item(con, session_id, {"type": "message", "role": "user", "content": content})
    body = {**forward, "persisted_item_id": item["id"]}
    entry = _add_outbox(con, session_id, "message", body)
    return item, entry


def _add_item(con: sqlite3.Connection, session_id: str, fields: dict[str, Any]) -> dict[str, Any]:
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
    for table in ("items", "events", "elicitations", "outbox"):
        con.execute(f"DELETE FROM {table} WHERE session_id = ?", (session_id,))
    return con.execute("DELETE FROM sessions WHERE id = ?", (session_id,)).rowcount > 0


def _list_items(
    con: sqlite3.Connection, session_id: str, limit: int, order: str, after: str | None
) -> dict[str, Any]:
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
    params: dict[str, Any],
    tool: str,
    arguments: Any,
    event: dict[str, Any],
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
    approval: dict[str, Any],
    event: dict[str, Any],
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


def _add_outbox(con: sqlite3.Connection, session_id: str, kind: str, body: dict[str, Any]) -> int:
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
    events: list[dict[str, Any]],
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
