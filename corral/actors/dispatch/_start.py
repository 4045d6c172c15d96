"""Setting a turn up: its spec, its history, the message a worker starts from.

:class:`TurnSetup` is the part of :class:`~._actor.DispatchActor` below the life of a turn
(:mod:`._turns`): it resolves a session's agent spec (cached, else from the server, D-09),
assembles the history a turn is given (:mod:`._history`: a cold cache filled from
``/items``, the messages appended, media inlined), leaves out a history item too large for a
turn's message, and waits for a deleted session's turn to wind down before a new one of the
same id starts. The functions build the worker's message and choose its harness and tools.

A server that is unavailable while a turn is set up (no connection, 502/503/504: the embedded
control plane is back 2 to 4 s after a ``kill -9``, the host restarting it) is asked again for
the ``server_wait_s`` option (:data:`~corral.server_wait.SERVER_WAIT_S`, 10 s) from the first
failure, with backoff (:func:`~corral.server_wait.while_unavailable`), before the turn fails;
an answer that refuses (4xx, a 500, a malformed body) fails it at once, as the real server means it.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio

from ..._jsonlines import JsonObject
from ...server_wait import while_unavailable
from ...tools.registry import tool_schemas
from . import _history as history
from ._base import DispatchBase
from ._session import Session

log = logging.getLogger("corral.actors.dispatch")

#: How long a turn of a new session waits for the turn of a deleted one of the same id to
#: end on its worker.
_DRAIN_TIMEOUT_S = 15.0

T = TypeVar("T")


class TurnSetup(DispatchBase):
    """Setting a turn up: a part of :class:`~._actor.DispatchActor` (see :mod:`._base`)."""

    def _leave_out_largest(self, session: Session, content: list[JsonObject]) -> bool:
        """Replace the largest earlier item of a history too large to send by a note (in the
        session's history too, so later turns do not try again); False if none is left."""
        found = history.largest(content)
        if found is None:
            return False
        index, size = found
        note = history.left_out_note(size)
        log.warning(
            "session %s: a history item of %d bytes is left out of the turn: over the bus limit",
            session.id,
            size,
        )
        if session.history is not None and len(session.history) == len(content):
            session.history[index] = note
        content[index] = note
        return True

    async def _drained(self, session_id: str) -> None:
        """Wait until the worker has wound down the turn of a deleted session of this id: the
        harness actor holds a session's new turn until the old one has ended, and the wait
        is bounded here rather than there."""
        draining = self._draining.get(session_id)
        if draining is not None:
            with trio.move_on_after(_DRAIN_TIMEOUT_S):
                await draining[1].wait()
            self._draining.pop(session_id, None)

    async def _while_unavailable(
        self, session: Session, what: str, ask: Callable[[], Awaitable[T]]
    ) -> T:
        """``ask()`` through :func:`~corral.server_wait.while_unavailable`, for the
        ``server_wait_s`` option; it stops early once the turn being set up has ended meanwhile
        or the session is gone: nobody waits for that setup any more.

        Raises:
            ServerUnavailable: still unavailable after the wait.
            ServerError: any other failure of ``ask``, at once.
        """
        turn = session.turn
        return await while_unavailable(
            ask,
            what=f"session {session.id}: {what}",
            wait_s=self.options.server_wait_s,
            wanted=lambda: session.turn is turn and self.sessions.get(session.id) is session,
        )

    async def _resolve_spec(self, session: Session, agent_id: str | None) -> JsonObject:
        if session.spec is not None:
            return session.spec
        server = self._server(session)
        if server is None:
            return dict(self.options.default_spec)
        from ...spec import spec_to_dict

        if not (agent_id or session.record.agent_id):
            # The first-message race (D-09): the server's snapshot knows the agent.
            snapshot = await self._while_unavailable(
                session, "the session", lambda: server.session_snapshot(session.id)
            )
            session.record.agent_id = snapshot.get("agent_id")
        # A child session is served its parent's bundle and runs its own sub-agent's spec.
        sub_agent = session.record.sub_agent_name
        bundle = await self._while_unavailable(
            session, "the agent", lambda: server.agent_bundle(session.id, sub_agent=sub_agent)
        )
        spec = spec_to_dict(bundle)
        session.spec = spec
        return spec

    async def _history(self, session: Session, messages: list[JsonObject]) -> list[JsonObject]:
        server = self._server(session)
        if session.history is None:
            stored: list[JsonObject] = []
            if server is not None:
                stored = await self._while_unavailable(
                    session, "the history", lambda: server.items(session.id)
                )
            persisted = {
                str(m["persisted_item_id"]) for m in messages if m.get("persisted_item_id")
            }
            items = history.undelivered_dropped(stored, persisted)
            session.history = history.rehydrate(items, None)
            pending = session.record.note_pending
            if pending and not any(i.get("response_id") == pending for i in stored):
                # The last turn was interrupted and its note is not on the server yet.
                session.history.append(history.interrupt_note())
        for m in messages:
            session.history.append(history.user_item(m.get("content")))
        if server is not None:
            # The 0.19 server serves an upload only under its session (ServerClient.file_content).
            file_content = functools.partial(server.file_content, session_id=session.id)

            async def fetch(file_id: str) -> tuple[bytes, str]:
                return await self._while_unavailable(
                    session, f"file {file_id}", lambda: file_content(file_id)
                )

            session.history = await history.resolve_media(session.history, fetch)
        return list(session.history)


def turn_message(
    session_id: str, last: JsonObject, spec: JsonObject, content: list[JsonObject]
) -> JsonObject:
    """The message a worker's turn starts from: the last message's own settings, else the
    agent spec's."""
    return {
        "type": "message",
        "role": "user",
        "model": last.get("model") or spec.get("name") or "agent",
        "content": content,
        "instructions": last.get("instructions") or spec.get("prompt") or spec.get("instructions"),
        "tools": last.get("tools") or runner_tools(spec),
        "conversation_id": session_id,
    }


def spec_harness(spec: JsonObject) -> str | None:
    executor = spec.get("executor") or {}
    harness = executor.get("harness") or (executor.get("config") or {}).get("harness")
    return str(harness) if harness else None


def runner_tools(spec: JsonObject) -> list[JsonObject]:
    """The tools this runner runs for the agent, as function-tool schemas for the worker
    (PROTOCOL_FACTS.md §iv.1 ``tools``) when the server's message names none."""
    return [
        {"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}
        for tool in tool_schemas(spec)
    ]
