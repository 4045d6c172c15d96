"""The life of a turn: start it (or buffer the message), end it, and what follows.

A message with no active turn starts one (202 ``accepted``, or 200 SSE when streaming); one
during a turn is buffered (202 ``buffered``) and runs, with everything buffered, as the next
turn — ``running`` again, no ``idle`` between, the first turn's answer before the buffered
messages in its history (PROTOCOL_0_19.md §E.3). Each turn publishes ``running`` and exactly
one terminal edge (``idle``, or ``failed`` with ``error: {code, message}``), edges only for
the active turn id. The pure functions of :mod:`._turn` decide what an end publishes and
what follows it; this part does the I/O they decide on.
"""

from __future__ import annotations

import logging
import uuid

import msgspec

from ..._exceptions import CallTimeout, MessageTooLarge
from ..._jsonlines import JsonObject
from ...harnesses.protocol import (
    HARNESS_ACTOR,
    Interrupt,
    Output,
    ResponseCancelled,
    ResponseCompleted,
    ResponseFailed,
    TurnStart,
)
from ...routes import HttpRequest, HttpResponse
from ..policy.messages import TurnEnded
from . import _history as history
from ._events import MessageEvent
from ._routes import GENERIC_DETAIL, accepted, answer, error
from ._session import Accepted, Session
from ._start import TurnSetup, spec_harness, turn_message
from ._turn import Next, Terminal, Turn, after_end, on_message, on_terminal
from ._watchdog import TurnError

log = logging.getLogger("corral.actors.dispatch")

_STREAM_HEADERS = [
    ("content-type", "text/event-stream; charset=utf-8"),
    ("cache-control", "no-cache"),
]


class TurnFlow(TurnSetup):
    """The life of a turn: a part of :class:`~._actor.DispatchActor` (see :mod:`._base`)."""

    async def _message(
        self, session: Session, event: MessageEvent, stream: HttpRequest | None, key: str
    ) -> HttpResponse | None:
        """A ``message`` event of idempotency key ``key``: a turn, buffered, or — when the
        key was taken before (a server re-POST, a retry, a redelivery) — the turn it is."""
        record = session.record
        seen = record.accepted_as(key)
        if seen is not None:
            return await self._again(session, seen, stream)
        record.harness_override = event.harness_override or record.harness_override
        record.model_override = event.model_override or record.model_override
        if event.agent_id and event.agent_id != record.agent_id:
            record.agent_id = event.agent_id
            session.spec = None
        body = msgspec.to_builtins(event)
        # An idle session with messages buffered has their turn queued: this one joins them.
        # A stopping host starts no turn: the next one's dispatch runs the buffer at start.
        if self.stopping or on_message(session.phase) == "buffer" or record.buffer:
            # Its own turn, after this one (PROTOCOL_0_19.md §E.3): the server saves each
            # turn's answer as its own item. BEHAVIOURS.md D-30 offered it to the running turn
            # as an injection; the real server decides, and with that the first turn's answer
            # would hold both replies. The harness is not told: the 202 waits on nothing.
            record.buffer.append(body)
            record.accept(key, "buffered")
            await self._save(session)
            self.stats["buffered"] += 1
            return answer("buffered")
        record.accept(key, "accepted")
        return await self._start_turn(session, [body], stream)

    async def _again(
        self, session: Session, seen: Accepted, stream: HttpRequest | None
    ) -> HttpResponse:
        """Answer a message taken before as it was answered, and run nothing: it is the turn
        it already is (running, buffered or over). A ``?stream=true`` POST of the running
        turn gets the rest of its stream (the caller of the first one is gone)."""
        turn = session.turn
        log.info(
            "session %s: message already taken (%s, turn %s); not run again",
            session.id,
            seen.status,
            seen.turn_id,
        )
        self.stats["duplicates"] += 1
        if stream is not None and turn is not None and seen.turn_id == turn.turn_id:
            turn.stream_to = (stream.reply_to, stream.request_id)
            session.record.stream_to = list(turn.stream_to)
            await self._save(session)
            return HttpResponse(status=200, headers=list(_STREAM_HEADERS), streaming=True)
        return answer(seen.status)

    async def _start_turn(
        self,
        session: Session,
        messages: list[JsonObject],
        stream: HttpRequest | None,
        *,
        continuation: bool = False,
    ) -> HttpResponse | None:
        """Start a turn of ``messages``; its answer (None for a continuation, whose messages
        were answered ``buffered``).

        The turn's record (its id and messages) is saved before its ``running`` edge leaves
        and before its start goes to the harness actor; until that start is with the broker
        the record keeps the messages, so a crash anywhere in between leaves a turn that the
        next incarnation starts again (:meth:`_restart`), never one with no worker.
        """
        await self._drained(session.id)
        turn = Turn(turn_id=f"turn_{uuid.uuid4().hex}")
        session.turn = turn
        with self.fanout.held(session.id):
            session.record.begin_turn(
                turn.turn_id, [stream.reply_to, stream.request_id] if stream else None, messages
            )
            session.record.status = "running"
            # A continuation is a turn of its own: ``running`` again, with no ``idle`` before
            # it (§E.3; the server clears its text accumulator at each ``running``).
            self._publish_saved(session, {"type": "session.status", "status": "running"})
            session.record.turn_base = turn.base = session.record.seq  # numbers its stream
            await self._save(session)
            self._crash_point("turn_saved")
        self.stats["turns"] += 1
        self.work.started(session.id)  # a sub-agent's parent sees it busy (S-22)
        response = await self._launch(session, turn, messages, stream, continuation=continuation)
        self._crash_point("turn_sent")
        return response

    async def _restart(self, session: Session, why: str = "after a restart") -> None:
        """Start again a turn whose start a crash or a timeout may have cut off (seen: ignored)."""
        turn, messages = session.turn, session.record.starting
        if turn is None or messages is None:
            return
        log.warning("session %s: starting turn %s again %s", session.id, turn.turn_id, why)
        await self._launch(session, turn, messages, None, continuation=True, again=True)

    async def _continue(self, session: Session) -> None:
        """Run the buffered messages as the next turn (queued when a turn ends with messages
        buffered, and at start for a session whose turn ended before they began)."""
        await self._drained(session.id)
        if session.turn is not None or not session.record.buffer or self.stopping:
            return
        if self.sessions.get(session.id) is not session:
            return
        # Out of the buffer and into the turn's record in one save (``_start_turn`` reaches
        # it with no checkpoint before).
        buffered, session.record.buffer = session.record.buffer, []
        await self._start_turn(session, buffered, None, continuation=True)

    async def _launch(
        self,
        session: Session,
        turn: Turn,
        messages: list[JsonObject],
        stream: HttpRequest | None,
        *,
        continuation: bool,
        again: bool = False,
    ) -> HttpResponse | None:
        """Resolve the spec, the harness and the history of ``turn`` and send its start to
        the harness actor (``again``: maybe for the second time); the turn's answer."""
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
            or spec_harness(spec)
            or self.options.default_harness
        )
        if session.turn is not turn:
            # Ended during the spec's fetch: its messages must not join the history twice.
            return None if continuation else accepted()
        try:
            content = await self._history(session, messages)
            if session.turn is not turn and self._server(session) is not None:
                # Ended during the fetch: the cache lacks its answer; the server has both.
                session.history = None
            elif again and self._server(session) is not None:
                # Its first start may have run in part: the server's items then hold its
                # output before its message; the next turn reads them again (test_d23).
                session.history = None
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
            if session.turn is not turn:
                return response  # it ended meanwhile (its terminal came first)
            start = TurnStart(
                session_id=session.id,
                turn_id=turn.turn_id,
                spec=spec,
                message=turn_message(session.id, last, spec, content),
                harness=harness,
                model_override=session.record.model_override,
                harness_override=session.record.harness_override,
                reply_to=self.peer.name,
                again=again,
                batch=True,
            )
            try:
                await self.peer.cast(HARNESS_ACTOR, start, durable=True, session_id=session.id)
            except MessageTooLarge as exc:
                if self._leave_out_largest(session, content):
                    continue
                log.warning("could not start turn %s: %s", turn.turn_id, exc)
                await self._setup_failed(session, turn, exc)
            except CallTimeout as exc:
                # Slow, not refused: the broker is this host. Failed here, the turn ran once it
                # was stored, unheard; sent ``again``, it runs once (docs/dispatch.md).
                log.warning("turn %s: its start is not with the broker yet (%s)", turn.turn_id, exc)
                self.in_order(session.id, lambda: self._restart(session, "its start timed out"))
            except Exception as exc:
                log.warning("could not start turn %s: %s", turn.turn_id, exc)
                await self._setup_failed(session, turn, exc)
            else:
                if session.turn is turn:
                    # With the broker: the harness actor has it now, whatever happens here.
                    # The next save forgets the messages; a crash before it sends the start
                    # again, which the harness actor ignores.
                    session.record.starting = None
            return response

    async def _setup_failed(self, session: Session, turn: Turn, exc: Exception) -> None:
        failure = {"code": "runner_error", "message": f"turn setup failed: {exc}"}
        await self._finish(session, turn, "failed", failure)

    async def _terminal(self, session: Session, msg: Output) -> None:
        """End the active turn on its terminal event ``msg`` (from its worker, or the
        runner's own ``failed``).

        The end is saved once the turn's stream is with every receiver (its worker forgets
        it then), and its terminal event and edge before they leave: an incarnation that
        finds them in the record sends them again with their own ``seq`` (the gateway drops
        a ``seq`` it has seen); one that does not ends the turn on the redelivered terminal.
        """
        turn = session.turn
        if turn is None or turn.turn_id != msg.turn_id:
            return
        with self.fanout.held(session.id):
            await self.fanout.sent()  # never in a handler: acceptances may queue behind it
            if session.turn is turn:
                await self._end(session, turn, msg)

    async def _end(self, session: Session, turn: Turn, msg: Output) -> None:
        end = on_terminal(turn.phase, _terminal_kind(msg))
        end_seq = turn.end_seq(session.record, msg.sequence_number)
        self.fanout.to_stream(turn.stream_to, msg, end_seq)
        self._publish_saved(session, msg, run_id=turn.turn_id, upstream=end.upstream)
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

    async def _fail(self, session: Session, turn: Turn, error: TurnError) -> None:
        """End the active ``turn`` ``failed`` on the runner's own account, and stop its worker.

        The edge comes first: an interrupted worker ends its turn ``cancelled``, durably, and
        that terminal, racing this one, could publish ``idle`` for a turn the runner failed.
        The interrupt goes through the session's queue ahead of whatever ending the turn
        queues (the next turn's start), so it cannot stop that turn instead.
        """
        if session.turn is not turn:
            return
        self.in_order(session.id, lambda: self._to_harness(Interrupt(session_id=session.id)))
        await self._terminal(session, ResponseFailed(turn_id=turn.turn_id, error=dict(error)))

    async def _finish(
        self,
        session: Session,
        turn: Turn,
        status: str,
        failure: JsonObject | None,
    ) -> None:
        """End a turn: one terminal edge, or straight into the continuation turn (D-31).

        The end is saved before its edge leaves (see :meth:`_terminal`); buffered messages
        stay in the record until the next turn's start takes them, so a crash between the
        two runs them at the next start.
        """
        if session.turn is not turn:
            return
        with self._ending(turn, status, failure):
            session.turn = None
            if (session.record.tool_calls or turn.evaluated) and self.options.policy is not None:
                ended = TurnEnded(session_id=session.id, turn_id=turn.turn_id)
                self.in_order(session.id, lambda: self._to_policy(ended))
            if turn.stream_to is not None:
                await self.fanout.end_stream(turn.stream_to)
            buffered = bool(session.record.buffer)
            session.record.end_turn()
            after = after_end("failed" if status == "failed" else "idle", buffered=buffered)
            await self._child_ended(session, turn, status, failure, after is Next.EDGE)
            with self.fanout.held(session.id):
                if after is Next.CONTINUATION:
                    session.record.status = "running"
                else:
                    session.record.status = status
                    edge: JsonObject = {"type": "session.status", "status": status}
                    if failure is not None:
                        edge["error"] = failure
                    self._publish_saved(session, edge, run_id=turn.turn_id, terminal=True)
                await self._save(session)
                self._crash_point("end_saved")
            if after is not Next.EDGE:
                self.in_order(session.id, lambda: self._continue(session))


def _terminal_kind(msg: Output) -> Terminal:
    if isinstance(msg, ResponseCompleted):
        return "completed"
    return "cancelled" if isinstance(msg, ResponseCancelled) else "failed"
