"""The database file: its tables, how a connection is opened, and one transaction.

Every SQL function of the store runs inside :func:`_in_transaction` on a connection made
by :func:`_connect`; ``_encode``/``_decode`` are the JSON codec of the stored columns.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec

#: 2 added ``sessions.runner_seq``, ``message_keys`` and ``session_keys``; 3 added
#: ``sessions.parent_session_id``, ``sessions.root_session_id``, ``sub_agent_name`` (child
#: sessions, PROTOCOL_0_19.md §J) and ``permissions`` (an older database gets them when it is
#: opened: :func:`_migrate`).
SCHEMA_VERSION = 3
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
    draft TEXT,
    runner_seq INTEGER NOT NULL DEFAULT 0,
    parent_session_id TEXT,
    root_session_id TEXT,
    sub_agent_name TEXT
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
CREATE TABLE IF NOT EXISTS message_keys (
    session_id TEXT NOT NULL,
    key TEXT NOT NULL,
    item_id TEXT NOT NULL,
    PRIMARY KEY (session_id, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS session_keys (
    key TEXT PRIMARY KEY,
    session_id TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS permissions (
    session_id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    level INTEGER NOT NULL,
    PRIMARY KEY (session_id, user_id)
) WITHOUT ROWID;
"""

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.decode
T = TypeVar("T")


def _connect(path: Path) -> sqlite3.Connection:
    con = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
    con.execute("PRAGMA journal_mode = WAL")
    con.execute("PRAGMA synchronous = FULL")  # per transaction: see Store._write
    return con


def _migrate(con: sqlite3.Connection) -> None:
    """Bring a database of an older schema version up to :data:`SCHEMA_VERSION`.

    ``CREATE TABLE IF NOT EXISTS`` adds new tables but not new columns of old ones.
    """
    columns = {row[1] for row in con.execute("PRAGMA table_info(sessions)")}
    if "runner_seq" not in columns:
        con.execute("ALTER TABLE sessions ADD COLUMN runner_seq INTEGER NOT NULL DEFAULT 0")
    for column in ("parent_session_id", "root_session_id", "sub_agent_name"):
        if column not in columns:
            con.execute(f"ALTER TABLE sessions ADD COLUMN {column} TEXT")
    # Here, not in the schema: an older ``sessions`` has the column only from the line above.
    con.execute(
        "CREATE INDEX IF NOT EXISTS sessions_by_parent ON sessions (parent_session_id, created_at)"
    )


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
