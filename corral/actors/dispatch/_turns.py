"""The life of a turn: start it (or buffer the message), end it, and what follows.

A message with no active turn starts one (202 ``accepted`` in the background, or 200 SSE when
streaming); a message during a turn is buffered (202 ``buffered``) and never enters the
running turn: when that turn ends, everything buffered runs as the next turn — ``session.
status running`` again, with no ``idle`` in between, and a history in which the first turn's
answer precedes the buffered messages (PROTOCOL_0_19.md §E.3). Each turn publishes ``session.
status running`` and exactly one terminal edge — ``idle``, or ``failed`` with ``error: {code,
message}`` — and edges are published only for the turn id that is active, so never two for
one turn. What an end publishes and what follows it are decided by the pure functions of
:mod:`._turn`; this part does the I/O they decide on.
"""

from __future__ import annotations

import functools
import logging
import uuid
from typing import Any

import msgspec
import trio

from ..._exceptions import MessageTooLarge
from ...harnesses.protocol import (
    HARNESS_ACTOR,
    Interrupt,
    Output,
    ResponseCancelled,
    ResponseCompleted,
    ResponseFailed,
    TurnStart,
)
from ...routes import HttpRequest, HttpResponse, json_response
from ...tools.registry import tool_schemas
from ..policy.messages import TurnEnded
from . import _history as history
from ._base import DispatchBase
from ._events import MessageEvent
from ._routes import GENERIC_DETAIL, accepted, error
from ._session import Session
from ._turn import Next, Terminal, Turn, after_end, on_message, on_terminal

log = logging.getLogger("corral.actors.dispatch")

#: How long a turn of a new session waits for the turn of a deleted one of the same id to
#: end on its worker.
_DRAIN_TIMEOUT_S = 15.0
_STREAM_HEADERS = [
    ("content-type", "text/event-stream; charset=utf-8"),
    ("cache-control", "no-cache"),
]


class TurnFlow(DispatchBase):
    """The life of a turn: a part of :class:`~._actor.DispatchActor` (see :mod:`._base`)."""

    async def _message(
        self, session: Session, event: MessageEvent, stream: HttpRequest | None
    ) -> HttpResponse | None:
        record = session.record
        record.harness_override = event.harness_override or record.harness_override
        record.model_override = event.model_override or record.model_override
        if event.agent_id and event.agent_id != record.agent_id:
            record.agent_id = event.agent_id
            session.spec = None
        body = msgspec.to_builtins(event)
        if on_message(session.phase) == "buffer":
            # Its own turn, after this one (PROTOCOL_0_19.md §E.3): the server saves each
            # turn's answer as its own item. BEHAVIOURS.md D-30 offered it to the running turn
            # as an injection; the real server decides, and with that the first turn's answer
            # would hold both replies. The harness is not told: the 202 waits on nothing.
            record.buffer.append(body)
            await self._save(session)
            self.stats["buffered"] += 1
            return json_response(
                202,
                {"status": "buffered", "detail": "Message buffered; active turn will process it."},
            )
        return await self._start_turn(session, [body], stream)

    async def _start_turn(
        self,
        session: Session,
        messages: list[dict[str, Any]],
        stream: HttpRequest | None,
        *,
        continuation: bool = False,
    ) -> HttpResponse | None:
        """Start a turn of ``messages``; its answer (None for a continuation, whose messages
        were answered ``buffered``)."""
        await self._drained(session.id)
        turn = Turn(turn_id=f"turn_{uuid.uuid4().hex}")
        session.turn = turn
        session.record.begin_turn(
            turn.turn_id, [stream.reply_to, stream.request_id] if stream else None
        )
        session.record.status = "running"
        await self._save(session)
        self.stats["turns"] += 1
        # A continuation is a turn of its own: ``running`` again, with no ``idle`` before it
        # (§E.3; the server clears its text accumulator at each ``running``).
        self.fanout.publish(session.record, {"type": "session.status", "status": "running"})
        last = messages[-1]
        explicit_harness = last.get("harness")
        try:
            spec = await self._resolve_spec(session, last.get("agent_id"))
        except Exception as exc:
            if not explicit_harness:
                log.warning("spec resolver failed for session %s: %s", session.id, exc)
                failure = {"code": "spec_resolver_failed", "message": GENERIC_DETAIL}
                await self._finish(session, turn, "failed", failure)
                if stream is not None:
                    return error(503, "spec_resolver_failed", GENERIC_DETAIL)
                return accepted() if not continuation else None
            # D-07: an explicit harness opens the turn; the spec is resolved when needed.
            log.warning("spec for session %s unresolved: %s", session.id, exc)
            spec, turn.spec_resolved = {}, False
        harness = (
            explicit_harness
            or session.record.harness_override
            or _spec_harness(spec)
            or self.options.default_harness
        )
        try:
            content = await self._history(session, messages)
        except Exception as exc:
            log.warning("history for session %s failed: %s", session.id, exc)
            await self._setup_failed(session, turn, exc)
            return (
                accepted()
                if stream is None and not continuation
                else error(503, "runner_error", GENERIC_DETAIL)
            )
        response: HttpResponse | None = accepted() if not continuation else None
        if stream is not None:
            turn.stream_to = (stream.reply_to, stream.request_id)
            response = HttpResponse(status=200, headers=list(_STREAM_HEADERS), streaming=True)
        while True:
            start = TurnStart(
                session_id=session.id,
                turn_id=turn.turn_id,
                spec=spec,
                message=_turn_message(session.id, last, spec, content),
                harness=harness,
                model_override=session.record.model_override,
                harness_override=session.record.harness_override,
                reply_to=self.peer.name,
            )
            try:
                await self.peer.cast(HARNESS_ACTOR, start, durable=True, session_id=session.id)
            except MessageTooLarge as exc:
                if self._leave_out_largest(session, content):
                    continue
                log.warning("could not start turn %s: %s", turn.turn_id, exc)
                await self._setup_failed(session, turn, exc)
            except Exception as exc:
                log.warning("could not start turn %s: %s", turn.turn_id, exc)
                await self._setup_failed(session, turn, exc)
            return response

    def _leave_out_largest(self, session: Session, content: list[dict[str, Any]]) -> bool:
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
        """Wait until the worker has wound down the turn of a deleted session of this id:
        the harness actor refuses a turn while it holds another (``turn_in_flight``)."""
        draining = self._draining.get(session_id)
        if draining is not None:
            with trio.move_on_after(_DRAIN_TIMEOUT_S):
                await draining[1].wait()
            self._draining.pop(session_id, None)

    async def _setup_failed(self, session: Session, turn: Turn, exc: Exception) -> None:
        failure = {"code": "runner_error", "message": f"turn setup failed: {exc}"}
        await self._finish(session, turn, "failed", failure)

    async def _resolve_spec(self, session: Session, agent_id: str | None) -> dict[str, Any]:
        if session.spec is not None:
            return session.spec
        server = self._server(session)
        if server is None:
            return dict(self.options.default_spec)
        from ...spec import spec_to_dict

        if not (agent_id or session.record.agent_id):
            # The first-message race (D-09): the server's snapshot knows the agent.
            snapshot = await server.session_snapshot(session.id)
            session.record.agent_id = snapshot.get("agent_id")
        spec = spec_to_dict(await server.agent_bundle(session.id))
        session.spec = spec
        return spec

    async def _history(
        self, session: Session, messages: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        server = self._server(session)
        if session.history is None:
            stored: list[dict[str, Any]] = []
            if server is not None:
                stored = await server.items(session.id)
            persisted = {m.get("persisted_item_id") for m in messages} - {None}
            items = stored
            for pid in persisted:
                items = [i for i in items if i.get("id") != pid]
            session.history = history.rehydrate(items, None)
            pending = session.record.note_pending
            if pending and not any(i.get("response_id") == pending for i in stored):
                # The last turn was interrupted and its note is not on the server yet.
                session.history.append(history.interrupt_note())
        for m in messages:
            session.history.append(history.user_item(m.get("content")))
        if server is not None:
            # The 0.19 server serves an upload only under its session (ServerClient.file_content).
            fetch = functools.partial(server.file_content, session_id=session.id)
            session.history = await history.resolve_media(session.history, fetch)
        return list(session.history)

    async def _terminal(self, session: Session, msg: Output) -> None:
        """End the active turn on its terminal event ``msg`` (from its worker, or the
        runner's own ``failed``)."""
        turn = session.turn
        if turn is None or turn.turn_id != msg.turn_id:
            return
        end = on_terminal(turn.phase, _terminal_kind(msg))
        self.fanout.to_stream(turn.stream_to, msg)
        self.fanout.publish(session.record, msg, run_id=turn.turn_id, upstream=end.upstream)
        if isinstance(msg, ResponseFailed):
            if session.history is not None:
                # The server saves the streamed text at the response's terminal event, a
                # failed one too (its relay flushes the draft there).
                session.history.extend(history.commit(turn.items, turn.text, keep_draft=True))
            failure = dict(msg.error)
            code = str(failure.get("code") or failure.get("type") or "runner_error")
            message = str(failure.get("message") or "turn failed")
            await self._finish(session, turn, "failed", {"code": code, "message": message})
            return
        if session.history is not None:
            session.history.extend(
                history.commit(turn.items, turn.text, keep_draft=end.keep_answer)
            )
        if not end.note:
            await self._finish(session, turn, "idle", None)
            return
        # The note goes in before whatever runs next: its history is [..., user, note, next].
        note_id = f"cancel_{uuid.uuid4().hex}"
        if session.history is not None:
            session.history.append(history.interrupt_note())
        if self._server(session) is not None:
            session.record.note_pending = note_id  # saved as the turn ends
        await self._finish(session, turn, "idle", None)
        if session.record.note_pending == note_id:
            assert self.nursery is not None
            self.nursery.start_soon(self._post_note, session, note_id)

    async def _post_note(self, session: Session, note_id: str) -> None:
        """Post an interrupted turn's note to the server (``external_conversation_item``),
        as omnigent's runner records an interruption (§E.4).

        In the background: a slow or failing server never holds the next turn, which has
        the note in its history already. A failure is logged and the note is given up (this
        incarnation's history keeps it); a post a crash may have cut off is made again at
        start, with the same ``source_id``, which the server dedups on.
        """
        server = self._server(session)
        if server is None or self.sessions.get(session.id) is not session:
            return
        body = {
            "type": "external_conversation_item",
            "data": {
                "item_type": "message",
                "item_data": {k: v for k, v in history.interrupt_note().items() if k != "type"},
                "response_id": note_id,
                # The server derives the item's id from it: a post retried after a crash (it
                # may have landed) saves one note, not two.
                "source_id": note_id,
            },
        }
        try:
            await server.post_event(session.id, body)
        except Exception as exc:
            log.warning("the interrupt note of session %s was not saved: %s", session.id, exc)
        if session.record.note_pending == note_id:
            session.record.note_pending = None
            await self._save(session)

    async def _fail(self, session: Session, turn: Turn, error: dict[str, Any]) -> None:
        """End the active ``turn`` ``failed`` on the runner's own account, and stop its worker.

        The edge comes first: an interrupted worker ends its turn ``cancelled``, durably, and
        that terminal, racing this one, could publish ``idle`` for a turn the runner failed.
        The interrupt goes through the session's queue ahead of whatever ending the turn
        queues (the next turn's start), so it cannot stop that turn instead.
        """
        if session.turn is not turn:
            return
        self.in_order(session.id, lambda: self._to_harness(Interrupt(session_id=session.id)))
        await self._terminal(session, ResponseFailed(turn_id=turn.turn_id, error=error))

    async def _finish(
        self,
        session: Session,
        turn: Turn,
        status: str,
        failure: dict[str, Any] | None,
    ) -> None:
        """End a turn: one terminal edge, or straight into the continuation turn (D-31)."""
        if session.turn is not turn:
            return
        session.turn = None
        if (session.record.tool_calls or turn.evaluated) and self.options.policy is not None:
            ended = TurnEnded(session_id=session.id, turn_id=turn.turn_id)
            self.in_order(session.id, lambda: self._to_policy(ended))
        if turn.stream_to is not None:
            await self.fanout.end_stream(turn.stream_to)
        buffered, session.record.buffer = session.record.buffer, []
        session.record.end_turn()
        if status == "failed":
            self.stats["failed"] += 1
        after = after_end("failed" if status == "failed" else "idle", buffered=bool(buffered))
        if after is Next.CONTINUATION:
            self.in_order(
                session.id, lambda: self._start_turn(session, buffered, None, continuation=True)
            )
            return
        session.record.status = status
        edge: dict[str, Any] = {"type": "session.status", "status": status}
        if failure is not None:
            edge["error"] = failure
        self.fanout.publish(session.record, edge, run_id=turn.turn_id, terminal=True)
        await self._save(session)
        if after is Next.EDGE_THEN_TURN:
            self.in_order(session.id, lambda: self._start_turn(session, buffered, None))


def _terminal_kind(msg: Output) -> Terminal:
    if isinstance(msg, ResponseCompleted):
        return "completed"
    if isinstance(msg, ResponseCancelled):
        return "cancelled"
    return "failed"


def _turn_message(
    session_id: str, last: dict[str, Any], spec: dict[str, Any], content: list[dict[str, Any]]
) -> dict[str, Any]:
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


def _spec_harness(spec: dict[str, Any]) -> str | None:
    executor = spec.get("executor") or {}
    harness = executor.get("harness") or (executor.get("config") or {}).get("harness")
    return str(harness) if harness else None


def runner_tools(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The tools this runner runs for the agent, as function-tool schemas for the worker
    (PROTOCOL_FACTS.md §iv.1 ``tools``) when the server's message names none."""
    return [
        {"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}
        for tool in tool_schemas(spec)
    ]
