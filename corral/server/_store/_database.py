"""The :class:`Store`: the async face of the database, each call one transaction in a thread.

The SQL it runs is in the modules named for their tables (``_sessions``,
``_elicitations``, ``_outbox``); ``_schema`` opens connections and runs transactions.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from ..._jsonlines import JsonObject
from .._conversation import (
    ancestors,
    append_runner_events,
    append_server_events,
)
from ._elicitations import (
    _add_policy_elicitation,
    _consume_elicitation,
    _get_elicitation,
    _resolve_elicitation,
)
from ._outbox import _count_attempt, _finish_outbox, _has_pending_message, _next_outbox
from ._rows import ElicitationRow, ItemsPage, OutboxEntry, PendingElicitation, SessionRow
from ._schema import _SCHEMA, SCHEMA_VERSION, T, _connect, _in_transaction, _migrate
from ._sessions import (
    _add_item,
    _add_user_message,
    _create_session,
    _delete_session,
    _events_after,
    _get_session,
    _grant,
    _grants,
    _list_children,
    _list_items,
    _list_sessions,
    _patch_session,
    _runner_seq,
    _sessions_for_runner,
    _snapshot_extras,
)


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
        _migrate(writer)
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

    async def create_session(self, row: SessionRow, key: str | None = None) -> SessionRow:
        """Insert a new session; returns the session stored.

        With ``key`` (the client's idempotency key), a key already used returns the session
        it made, and nothing is inserted.
        """
        return await self._write(_create_session, row, key)

    async def get_session(self, session_id: str) -> SessionRow | None:
        """The session, or None."""
        return await self._read(_get_session, session_id)

    async def list_sessions(self, limit: int) -> list[SessionRow]:
        """Sessions, newest first."""
        return await self._read(_list_sessions, limit)

    async def list_children(
        self, parent_id: str, limit: int, *, newest_first: bool = True
    ) -> list[SessionRow]:
        """The child sessions of ``parent_id`` (PROTOCOL_0_19.md §J), by creation time."""
        return await self._read(_list_children, parent_id, limit, newest_first)

    async def sessions_for_runner(self, runner_id: str) -> list[str]:
        """Ids of the sessions bound to ``runner_id``: those with undelivered forwards first,
        then the most recently active, so a reconnect serves waiting work first."""
        return await self._read(_sessions_for_runner, runner_id)

    async def snapshot_extras(self, session_id: str) -> tuple[list[PendingElicitation], int]:
        """The pending elicitations and the number of items of a session."""
        return await self._read(_snapshot_extras, session_id)

    async def delete_session(self, session_id: str) -> bool:
        """Delete a session with its items, events, elicitations and outbox; False if absent."""
        return await self._write(_delete_session, session_id)

    async def patch_session(
        self, session_id: str, labels: JsonObject | None, title: str | None
    ) -> SessionRow | None:
        """Merge ``labels`` into the session's and set ``title`` (each when not None)."""
        return await self._write(_patch_session, session_id, labels, title)

    async def grant(self, session_id: str, user_id: str, level: int) -> None:
        """Store (or replace) ``user_id``'s access ``level`` to a session."""
        await self._write(_grant, session_id, user_id, level)

    async def grants(self, session_id: str) -> list[tuple[str, int]]:
        """The session's grants as ``(user_id, level)``, by user."""
        return await self._read(_grants, session_id)

    # -- items -----------------------------------------------------------------------------

    async def add_user_message(
        self,
        session_id: str,
        content: list[JsonObject],
        forward: JsonObject,
        key: str | None = None,
    ) -> tuple[JsonObject, int | None]:
        """Persist a user message and its forward to the runner, in one transaction.

        ``forward`` is the event body for the runner (§ii.7) without ``persisted_item_id``,
        which is added here. ``key`` is the client's idempotency key: a message posted again
        with a key the session already holds is not stored again (nor forwarded), and the
        stored item is returned with no outbox entry. Returns the stored item and the outbox
        entry id (None for such a repeat).
        """
        return await self._write(_add_user_message, session_id, content, forward, key)

    async def add_item(self, session_id: str, fields: JsonObject) -> JsonObject:
        """Persist one item (``type`` and its fields; ``response_id`` optional).

        An item with a ``source_id`` (the runner's idempotency key) that the session already
        holds is not stored again; the stored one is returned.
        """
        return await self._write(_add_item, session_id, fields)

    async def list_items(
        self, session_id: str, *, limit: int, order: str, after: str | None
    ) -> ItemsPage:
        """One page of items in the list shape of §iii.6.

        Raises:
            UnknownCursor: ``after`` names no item of this session.
        """
        return await self._read(_list_items, session_id, limit, order, after)

    # -- events ----------------------------------------------------------------------------

    async def append_runner_events(
        self, session_id: str, events: list[JsonObject], runner_seq: int | None = None
    ) -> list[str]:
        """Store events relayed from the runner (heartbeats are dropped), building items.

        ``runner_seq`` is the runner's ``seq`` of the last of them (their SSE ``id``), kept
        in the same transaction: the cursor this server resumes the runner's stream from.
        Returns the sessions given events: this one, and the ancestors a sub-agent's
        elicitation event was mirrored to.

        Raises:
            UnknownSession: no such session.
        """
        return await self._write(
            append_runner_events, session_id, events, runner_seq, durable=False
        )

    async def ancestors(self, session_id: str) -> list[str]:
        """The session's parent, its parent's parent, ... (none for a top-level session)."""
        return await self._read(ancestors, session_id)

    async def runner_seq(self, session_id: str) -> int:
        """The runner's ``seq`` of the last runner event stored for the session (0: none)."""
        return await self._read(_runner_seq, session_id)

    async def append_server_events(self, session_id: str, events: list[JsonObject]) -> int:
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
        params: JsonObject,
        tool: str,
        arguments: Any,
        event: JsonObject,
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
        approval: JsonObject,
        event: JsonObject,
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
        events: list[JsonObject],
    ) -> None:
        """Close an outbox entry (``delivered`` or ``failed``) and publish ``events``."""
        await self._write(_finish_outbox, entry_id, state, status, result, events)

    async def count_attempt(self, entry_id: int) -> int:
        """Count one failed delivery attempt; returns the attempts so far."""
        return await self._write(_count_attempt, entry_id)
