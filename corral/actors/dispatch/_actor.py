"""The dispatch actor: sessions and turns, end to end (BEHAVIOURS.md D-01..D-33, E-04).

Handles:
    HttpRequest (from the gateway)   POST /v1/sessions, GET /v1/sessions/{id},
                                     DELETE /v1/sessions/{id},
                                     POST /v1/sessions/{id}/events[?stream=true],
                                     POST /v1/sessions/{id}/mcp/execute
    Output (from harness workers)    response.* events of the session's active turn
    ResponseCompleted / ResponseFailed / ResponseCancelled (durable, from the harness actor)
                                     the turn's one terminal event
    ToolOutcome (durable, from policy)   a tool call's output → the worker as ``tool_result``
    PublishEvents (durable, from tools and policy)   events on the session stream, in order

Every error body is ``{"error": {"code", "message"}}`` (PROTOCOL_0_19.md §H.2).

Publishes, in order, per session: every event to each subscriber (the gateway), durably, in
:class:`~corral.routes.SessionEvents` batches, and to the journal actor (one run per turn). A
``?stream=true`` request gets the turn's events as SSE :class:`~corral.routes.HttpChunk`
messages too.

Turns. A message with no active turn starts one (202 ``accepted`` in the background, or 200
SSE when streaming); a message during a turn is buffered (202 ``buffered``) and never enters
the running turn: when that turn ends, everything buffered runs as the next turn — ``session.
status running`` again, with no ``idle`` in between, and a history in which the first turn's
answer precedes the buffered messages (PROTOCOL_0_19.md §E.3). Each turn publishes
``session.status running`` and exactly one terminal edge — ``idle``, or ``failed`` with
``error: {code, message}`` — and a per-turn watchdog guarantees that edge even if everything
else misbehaves. An interrupted turn (``interrupt``, ``stop_session``) ends ``idle`` with no
terminal ``response.*`` event upstream, and leaves an ``[System: interrupted]`` note in the
history, posted to the server too (§E.4).

Crash safety. Sessions (agent, overrides, the active turn's id, start and streaming caller,
whether it was interrupted, the tool calls it sent and got answered, buffered messages, the
stream sequence) are written to ``sessions.log`` (fsynced) before a request is answered; a
deleted session leaves a tombstone there, so it stays deleted. After a restart the state is
rebuilt from it; an active turn **resumes**: its worker keeps streaming to the new dispatch,
and its terminal event — durable, from the harness actor — still ends it. The resumed turn
knows what it has in flight (:meth:`Turn.resume`): it still tells policy when it ends, and
the idle watchdog still spares it while a call waits on a tool or a human. A turn whose
worker died with it ends ``failed`` by the harness actor (``harness_restarted``); one that
hears nothing at all is ended ``failed`` by the watchdog. Never two terminal edges for one
turn: edges are published only for the turn id that is active.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import uuid
from typing import Any
from urllib.parse import parse_qs

import msgspec
import trio

from ..._jsonlines import write_atomically
from ...bus import Incoming, Message, Outbox
from ...harnesses.protocol import (
    HARNESS_ACTOR,
    ElicitationRequest,
    ElicitationResolved,
    InputAccepted,
    Interrupt,
    Output,
    OutputItemDone,
    OutputTextDelta,
    PolicyEvaluationRequested,
    ResponseCancelled,
    ResponseCompleted,
    ResponseFailed,
    ResponseInProgress,
    ToolResult,
    TurnStart,
)
from ...routes import (
    HttpChunk,
    HttpRequest,
    HttpResponse,
    SessionEvent,
    empty_response,
    json_response,
    sse_frame,
)
from ...server_client import pick_server
from ...tools.protocol import (
    PolicyEvaluate,
    PublishEvents,
    ToolCall,
    ToolOutcome,
    TurnEnded,
)
from ...tools.registry import tool_schemas
from .. import _history as history
from .._actor import Actor, ActorContext, every, handles
from ..journal import JournalAppend, JournalEvent
from ._events import (
    ApprovalEvent,
    BadEvent,
    CostApprovalPopupEvent,
    InterruptEvent,
    MessageEvent,
    StopSessionEvent,
    flatten_approval,
    parse_event,
)
from ._fanout import _event_batches
from ._options import DispatchOptions
from ._routes import GENERIC_DETAIL, NO_HARNESS_DETAIL, _accepted, _error, _from_harness
from ._session import Session, SessionRecord
from ._turn import _ELICITATION, Turn

log = logging.getLogger("corral.actors.dispatch")

#: How long journal events gather before they go out as one append per run: a flood of
#: deltas otherwise costs one append (a bus message, a journal write) per delta.
_JOURNAL_WINDOW_S = 0.02
#: Stream sequence numbers of a dispatch incarnation start at ``epoch << _EPOCH_SHIFT``.
_EPOCH_SHIFT = 32
SPEC_FAILED_IN_STREAM = "Failed to resolve the agent spec for this turn."
#: Events the session stream never carries (PROTOCOL_FACTS.md §ii.6).
_NOT_ON_STREAM = {"response.created", "policy_evaluation.requested"}
#: How long a turn of a new session waits for the turn of a deleted one of the same id to
#: end on its worker.
_DRAIN_TIMEOUT_S = 15.0


class DispatchActor(Actor):
    """Owns every session of this host."""

    def __init__(self, ctx: ActorContext, peer: Any) -> None:
        super().__init__(ctx, peer)
        self.options = msgspec.convert(ctx.options, DispatchOptions)
        self.sessions: dict[str, Session] = {}
        self.outbox = Outbox(peer)
        self.state_path = ctx.data_dir / "sessions.log"
        self._io = trio.CapacityLimiter(1)
        self.server: Any = None
        self.servers: dict[str, Any] = {}
        self.epoch = 0
        self._journal: dict[tuple[str, str], list[JournalEvent]] = {}
        #: Runs' last appends, oldest first, for the journal loop to send durably.
        self._journal_final: list[JournalAppend] = []
        self._events: dict[str, list[SessionEvent]] = {}
        self._events_ready = trio.Event()
        self._journal_ready = trio.Event()
        #: Deleted sessions whose interrupted turn has not ended on its worker yet: the turn
        #: id, and an event set when its terminal arrives.
        self._draining: dict[str, tuple[str, trio.Event]] = {}
        #: The last stream sequence of each session deleted in this incarnation.
        self._deleted_seq: dict[str, int] = {}
        self.stats = {"turns": 0, "buffered": 0, "failed": 0, "watchdog": 0}

    # --- lifecycle -------------------------------------------------------------------------

    async def setup(self) -> None:
        assert self.nursery is not None
        self.nursery.start_soon(self.outbox.run)
        self.nursery.start_soon(self._journal_loop)
        self.nursery.start_soon(self._events_loop)
        from ...server_client import ServerClient

        if self.options.server_url:
            self.server = ServerClient(self.options.server_url, token=self.options.token)
        for runner in self.options.runners:
            assert runner.id is not None
            self.servers[runner.id] = ServerClient(runner.server, token=runner.token)
        self.epoch = await trio.to_thread.run_sync(self._next_epoch, limiter=self._io)
        for record in await trio.to_thread.run_sync(self._load, limiter=self._io):
            # Events published after the last save were numbered past record.seq; a new
            # epoch starts above anything the previous incarnation could have used.
            record.seq = max(record.seq, self.epoch << _EPOCH_SHIFT)
            session = Session(record)
            if record.turn_id:
                session.turn = Turn.resume(record)  # its terminal still comes
            self.sessions[record.id] = session
            if record.note_pending:  # the previous incarnation died before posting it
                self.nursery.start_soon(self._post_note, session, record.note_pending)
        if self.sessions:
            log.info("recovered %d sessions", len(self.sessions))

    async def terminate(self) -> None:
        await self._flush_journal()
        await self.outbox.flush()
        while self._journal_final:
            await self._append_final(self._journal_final.pop(0), timeout=2)
        for name, events in self._events.items():
            with contextlib.suppress(Exception):
                await self.peer.cast_many(name, _event_batches(events), durable=True, timeout=2)
        for client in {id(c): c for c in (self.server, *self.servers.values()) if c}.values():
            await client.aclose()

    def snapshot(self) -> dict[str, Any]:
        return {
            **super().snapshot(),
            **self.stats,
            "sessions": len(self.sessions),
            "active_turns": sum(1 for s in self.sessions.values() if s.turn),
        }

    def _next_epoch(self) -> int:
        path = self.ctx.data_dir / "epoch"
        try:
            epoch = int(path.read_text()) + 1
        except (FileNotFoundError, ValueError):
            epoch = 1
        write_atomically(path, str(epoch).encode())
        return epoch

    def _load(self) -> list[SessionRecord]:
        records: dict[str, SessionRecord] = {}
        try:
            data = self.state_path.read_bytes()
        except FileNotFoundError:
            return []
        for line in data.splitlines():
            try:
                record = msgspec.json.decode(line, type=SessionRecord)
            except msgspec.DecodeError:
                continue  # a torn last line
            records[record.id] = record
        live = [r for r in records.values() if not r.deleted]
        if len(data) > 4 * 1024 * 1024:
            self._rewrite(live)
        return live

    def _rewrite(self, records: list[SessionRecord]) -> None:
        write_atomically(self.state_path, b"".join(msgspec.json.encode(r) + b"\n" for r in records))

    async def _elicitation_closed(self, session: Session, elicitation_id: str) -> None:
        if elicitation_id in session.record.elicitations:
            session.record.elicitations.remove(elicitation_id)
            await self._save(session)

    async def _save(self, session: Session) -> None:
        if self.sessions.get(session.id) is not session:
            return  # deleted (or replaced) meanwhile: a late save must not bring it back
        line = msgspec.json.encode(session.record) + b"\n"
        await trio.to_thread.run_sync(self._append, line, limiter=self._io)

    def _append(self, line: bytes) -> None:
        fd = os.open(self.state_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)

    # --- HTTP routes -----------------------------------------------------------------------

    @handles(HttpRequest)
    async def http(self, msg: HttpRequest, incoming: Incoming) -> HttpResponse | None:
        parts = msg.path.strip("/").split("/")
        if parts[:2] != ["v1", "sessions"]:
            return _error(404, "not_found", f"no route {msg.method} {msg.path}")
        if msg.method == "POST" and len(parts) == 2:
            incoming.deferred = True
            self.in_order("init", lambda: self._reply(incoming, self._init(msg)))
            return None
        if len(parts) < 3:
            return _error(404, "not_found", f"no route {msg.method} {msg.path}")
        session_id = parts[2]
        if msg.method == "GET" and len(parts) == 3:
            return self._get_session(session_id)
        if msg.method == "DELETE" and len(parts) == 3:
            # In the session's queue: it waits for a turn start or an event being handled.
            incoming.deferred = True
            self.in_order(session_id, lambda: self._reply(incoming, self._delete(session_id)))
            return None
        if msg.method == "POST" and parts[3:] == ["events"]:
            if not self.options.harness_actor:
                return _error(501, "not_implemented", NO_HARNESS_DETAIL.format(session_id))
            incoming.deferred = True
            self.in_order(session_id, lambda: self._reply(incoming, self._event(session_id, msg)))
            return None
        if msg.method == "POST" and parts[3:] == ["mcp", "execute"]:
            # Not in the session's queue: a tool may run for minutes while the turn goes on.
            incoming.deferred = True
            assert self.nursery is not None
            self.nursery.start_soon(self._reply, incoming, self._mcp_execute(session_id, msg))
            return None
        return _error(404, "not_found", f"no route {msg.method} {msg.path}")

    async def _reply(self, incoming: Incoming, work: Any) -> None:
        try:
            response = await work
        except BadEvent as exc:
            response = _error(exc.status, exc.code, str(exc))
        except Exception:
            log.exception("request %s failed", incoming.env.id)
            response = _error(500, "runner_error", GENERIC_DETAIL)
        if response is not None:
            await self.peer.reply(incoming, response)
        self.peer.ack(incoming)

    async def _init(self, msg: HttpRequest) -> HttpResponse:
        try:
            body = msg.json()
        except ValueError:
            raise BadEvent(400, "invalid_request", "the body is not JSON") from None
        if not isinstance(body, dict) or not isinstance(body.get("session_id"), str):
            raise BadEvent(400, "invalid_request", "session_id is required")
        session_id = body["session_id"]
        init = body.get("session_init") if isinstance(body.get("session_init"), dict) else None
        snapshot = (init or {}).get("snapshot") or {}
        session = self._session(session_id, None)
        record = session.record
        # Re-init keeps the session's turn, buffer and state; only bindings refresh (D-32).
        # That is also how ``resume_interrupted_turn`` is honoured: a turn still running here
        # (its worker alive, dispatch restarted or the server reconnected) goes on, and the
        # 201 says ``running``. A turn whose worker died cannot be continued — corral has no
        # native harness session to resume it in — and has already ended ``failed``.
        # ``suppress_recovery_turn`` needs nothing: corral never starts a recovery turn.
        record.agent_id = body.get("agent_id") or record.agent_id
        record.sub_agent_name = body.get("sub_agent_name") or record.sub_agent_name
        record.runner_id = msg.runner_id or record.runner_id
        if init is not None:
            record.harness_override = snapshot.get("harness_override") or record.harness_override
            record.model_override = snapshot.get("model_override") or record.model_override
            _init_v2(record, init, snapshot)
            if record.inference_config is not None and not session.warned_inference:
                session.warned_inference = True
                log.warning(
                    "session %s has a saved inference_config; corral takes provider settings "
                    "from the agent spec only and does not verify it",
                    session_id,
                )
        await self._save(session)
        return json_response(
            201, {**self._view(session), "session_init_protocol_version": 2 if init else None}
        )

    def _view(self, session: Session) -> dict[str, Any]:
        r = session.record
        return {
            "id": r.id,
            "agent_id": r.agent_id,
            "status": r.status,
            "created_at": int(r.created_at),
            "title": None,
            "labels": {},
            # As omnigent's runner answers: the server owns the binding (PROTOCOL_0_19.md §B.2).
            "runner_id": None,
            "reasoning_effort": None,
            "items": [],
            "permission_level": None,
            "terminal_ready": None,
        }

    def _get_session(self, session_id: str) -> HttpResponse:
        session = self.sessions.get(session_id)
        if session is None:
            return _error(404, "not_found", f"No session '{session_id}' on this runner.")
        return json_response(200, self._view(session))

    async def _delete(self, session_id: str) -> HttpResponse:
        """``DELETE /v1/sessions/{id}`` (PROTOCOL_0_19.md §I.1): stop and forget the session.

        A running turn is interrupted and ends here with its one ``idle`` edge (the session
        is gone, so its worker's ``response.cancelled`` finds no turn and makes no second
        edge); buffered messages are dropped; a tombstone goes to ``sessions.log`` (fsynced)
        before the answer, so a restart does not resurrect the session; the tools actor closes
        its terminals. An unknown session gets the same answer (idempotent).
        """
        session = self.sessions.get(session_id)
        if session is not None:
            turn = session.turn
            if turn is not None:
                self._draining[session_id] = (turn.turn_id, trio.Event())
                self.in_order(
                    session_id, lambda: self._to_harness(Interrupt(session_id=session_id))
                )
                session.record.buffer = []
                await self._finish(session, turn, "idle", None)
            del self.sessions[session_id]
            self._deleted_seq[session_id] = session.record.seq
            tombstone = SessionRecord(id=session_id, deleted=True)
            await trio.to_thread.run_sync(
                self._append, msgspec.json.encode(tombstone) + b"\n", limiter=self._io
            )
        await self._close_terminals(session_id)
        return json_response(
            200, {"session_id": session_id, "object": "session.deleted", "deleted": True}
        )

    async def _close_terminals(self, session_id: str) -> None:
        """Ask the tools actor to close a deleted session's terminals (logged if it can't)."""
        if self.options.tools is None:
            return
        request = HttpRequest(
            request_id=f"delete_{uuid.uuid4().hex}",
            method="DELETE",
            path=f"/v1/sessions/{session_id}/resources",
        )
        try:
            reply = await self.peer.call(self.options.tools, request, timeout=15)
        except Exception as exc:
            log.warning("the terminals of deleted session %s may be open: %s", session_id, exc)
            return
        if not isinstance(reply, HttpResponse) or reply.status >= 300:
            status = getattr(reply, "status", None)
            log.warning(
                "the tools actor did not close session %s's terminals (%s)", session_id, status
            )

    async def _event(self, session_id: str, msg: HttpRequest) -> HttpResponse | None:
        event = parse_event(msg.body)
        session = self._session(session_id, msg.runner_id)
        stream = parse_qs(msg.query).get("stream", [""])[0].lower() == "true"
        if isinstance(event, MessageEvent):
            return await self._message(session, event, msg if stream else None)
        if isinstance(event, ApprovalEvent):
            # A control event: it goes to whoever parked the elicitation — the policy actor
            # (a tool call it asked about) or a worker — and never starts, buffers or ends a
            # turn (E-04).
            approval = flatten_approval(event, session_id)
            if self.options.policy is not None:
                reply = await self._call_policy(approval)
                if isinstance(reply, InputAccepted) and reply.status != 404:
                    return _from_harness(reply)
            reply = await self._to_harness(approval, durable=True)
            taken = isinstance(reply, InputAccepted) and reply.status < 300
            if session.turn is not None and taken:  # the harness has the verdict: it goes on
                session.turn.waiting.discard(_ELICITATION + approval.elicitation_id)
                session.turn.last_event = time.monotonic()
                await self._elicitation_closed(session, approval.elicitation_id)
            return _from_harness(reply)
        if isinstance(event, InterruptEvent | StopSessionEvent):
            # Both are recorded alike (PROTOCOL_0_19.md §E.4): the worker's cancelled ends the
            # turn, then ``_terminal`` leaves the note. Saved first, so a dispatch restarted
            # before the cancelled arrives still ends the turn as an interruption.
            turn = session.turn
            if turn is not None:
                if not turn.interrupted:
                    turn.interrupted = session.record.interrupted = True
                    await self._save(session)
                await self._to_harness(Interrupt(session_id=session_id))
            return empty_response(204)
        if isinstance(event, CostApprovalPopupEvent) and not event.elicitation_id:
            raise BadEvent(400, "invalid_input", "Body 'elicitation_id' must be a non-empty string")
        # The popup and every other control event (§C.3): no native terminal here acts on it.
        return empty_response(204)

    async def _call_policy(self, msg: Message) -> Message | None:
        assert self.options.policy is not None
        try:
            return await self.peer.call(self.options.policy, msg, durable=True, timeout=15)
        except Exception as exc:
            log.warning("the policy actor did not answer %s: %s", type(msg).__name__, exc)
            return None

    async def _mcp_execute(self, session_id: str, msg: HttpRequest) -> HttpResponse:
        """``POST .../mcp/execute`` (§ii.9): the server's leg of a tool round trip."""
        try:
            body = msg.json()
        except ValueError:
            raise BadEvent(400, "invalid_request", "the body is not JSON") from None
        params = body.get("params") if isinstance(body, dict) else None
        if (
            not isinstance(body, dict)
            or body.get("method") != "tools/call"
            or not isinstance(params, dict)
            or not isinstance(params.get("name"), str)
            or not isinstance(params.get("arguments", {}), dict)
        ):
            raise BadEvent(
                422, "invalid_request", "expected {method: tools/call, params: {name, arguments}}"
            )
        if self.options.policy is None:
            return _error(501, "not_implemented", "Runner-side tools are not enabled.")
        session = self._session(session_id, msg.runner_id)
        try:
            spec = await self._resolve_spec(session, session.record.agent_id)
        except Exception as exc:
            log.warning("spec resolver failed for mcp/execute in %s: %s", session_id, exc)
            return _error(503, "spec_resolver_failed", GENERIC_DETAIL)
        call = ToolCall(
            session_id=session_id,
            turn_id=session.record.turn_id or "",
            call_id=f"mcp_{uuid.uuid4().hex[:16]}",
            name=params["name"],
            arguments=json.dumps(params.get("arguments", {})),
            spec=spec,
            runner_id=session.record.runner_id,
            origin="mcp",
        )
        try:
            reply = await self.peer.call(
                self.options.policy, call, timeout=self.options.tool_timeout_s
            )
        except Exception as exc:
            log.warning("mcp/execute %s in %s got no answer: %s", call.name, session_id, exc)
            return _error(502, "tool_failed", GENERIC_DETAIL)
        if not isinstance(reply, ToolOutcome):
            return _error(502, "tool_failed", GENERIC_DETAIL)
        return json_response(200, {"result": {"output": reply.output}})

    def _session(self, session_id: str, runner_id: str | None) -> Session:
        session = self.sessions.get(session_id)
        if session is None:
            # Numbered past a deleted session of the same id: the gateway drops events whose
            # sequence it has seen for the id.
            seq = max(self.epoch << _EPOCH_SHIFT, self._deleted_seq.pop(session_id, 0))
            session = self.sessions[session_id] = Session(
                SessionRecord(id=session_id, created_at=time.time(), runner_id=runner_id, seq=seq)
            )
        return session

    async def _to_harness(self, msg: Message, *, durable: bool = False) -> Message | None:
        try:
            return await self.peer.call(HARNESS_ACTOR, msg, durable=durable, timeout=15)
        except Exception as exc:
            log.warning("the harness actor did not answer %s: %s", type(msg).__name__, exc)
            return None

    # --- turns -----------------------------------------------------------------------------

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
        if session.turn is not None:
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
        draining = self._draining.get(session.id)
        if draining is not None:
            # The worker still winds down the turn of the deleted session of this id: the
            # harness actor refuses a turn while it holds another (``turn_in_flight``).
            with trio.move_on_after(_DRAIN_TIMEOUT_S):
                await draining[1].wait()
            self._draining.pop(session.id, None)
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
        await self._publish(session, {"type": "session.status", "status": "running"})
        last = messages[-1]
        explicit_harness = last.get("harness")
        try:
            spec = await self._resolve_spec(session, last.get("agent_id"))
        except Exception as exc:
            if explicit_harness:
                # D-07: an explicit harness opens the turn; the spec is resolved when needed.
                log.warning("spec for session %s unresolved: %s", session.id, exc)
                spec, turn.spec_resolved = {}, False
            else:
                log.warning("spec resolver failed for session %s: %s", session.id, exc)
                await self._finish(
                    session,
                    turn,
                    "failed",
                    {"code": "spec_resolver_failed", "message": GENERIC_DETAIL},
                )
                if stream is not None:
                    return _error(503, "spec_resolver_failed", GENERIC_DETAIL)
                return _accepted() if not continuation else None
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
            await self._finish(
                session,
                turn,
                "failed",
                {"code": "runner_error", "message": f"turn setup failed: {exc}"},
            )
            return (
                _accepted()
                if stream is None and not continuation
                else _error(503, "runner_error", GENERIC_DETAIL)
            )
        response: HttpResponse | None = _accepted() if not continuation else None
        if stream is not None:
            turn.stream_to = (stream.reply_to, stream.request_id)
            response = HttpResponse(
                status=200,
                headers=[
                    ("content-type", "text/event-stream; charset=utf-8"),
                    ("cache-control", "no-cache"),
                ],
                streaming=True,
            )
        message = {
            "type": "message",
            "role": "user",
            "model": last.get("model") or spec.get("name") or "agent",
            "content": content,
            "instructions": last.get("instructions")
            or spec.get("prompt")
            or spec.get("instructions"),
            "tools": last.get("tools") or runner_tools(spec),
            "conversation_id": session.id,
        }
        try:
            await self.peer.cast(
                HARNESS_ACTOR,
                TurnStart(
                    session_id=session.id,
                    turn_id=turn.turn_id,
                    spec=spec,
                    message=message,
                    harness=harness,
                    model_override=session.record.model_override,
                    harness_override=session.record.harness_override,
                    reply_to=self.peer.name,
                ),
                durable=True,
                session_id=session.id,
            )
        except Exception as exc:
            log.warning("could not start turn %s: %s", turn.turn_id, exc)
            await self._finish(
                session,
                turn,
                "failed",
                {"code": "runner_error", "message": f"turn setup failed: {exc}"},
            )
        return response

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
            session.history = await history.resolve_media(session.history, server.file_content)
        return list(session.history)

    def _server(self, session: Session) -> Any:
        """The server client of the session's runner (None: no server, the spec default)."""
        return pick_server(self.server, self.servers, session.record.runner_id)

    # --- harness output --------------------------------------------------------------------

    @handles(
        *(
            c
            for c in Output.__subclasses__()
            if c not in (ResponseCompleted, ResponseFailed, ResponseCancelled)
        )
    )
    async def output(self, msg: Output, incoming: Incoming) -> None:
        session = self.sessions.get(incoming.env.session_id or "")
        if session is None or session.turn is None or session.turn.turn_id != msg.turn_id:
            return
        turn = session.turn
        turn.last_event = time.monotonic()
        if isinstance(msg, OutputTextDelta):
            turn.text.append(msg.delta)
        elif isinstance(msg, ElicitationRequest):
            # The harness waits on a human: the turn is not silent until it is resolved.
            turn.waiting.add(_ELICITATION + msg.elicitation_id)
            if msg.elicitation_id not in session.record.elicitations:
                session.record.elicitations.append(msg.elicitation_id)
                await self._save(session)
        elif isinstance(msg, ElicitationResolved):
            turn.waiting.discard(_ELICITATION + msg.elicitation_id)
            await self._elicitation_closed(session, msg.elicitation_id)
        tag = msg.__struct_config__.tag
        if isinstance(msg, OutputItemDone) and msg.item.get("status") == "action_required":
            # Acked once the call is on its way to policy, not when this handler returns: a
            # crash in between redelivers the request instead of losing it (the worker would
            # wait for a result that never comes).
            incoming.deferred = True
            self.in_order(session.id, lambda: self._tool_call(session, turn, msg.item, incoming))
            await self._stream_chunk(turn, msg)
            return
        if isinstance(msg, PolicyEvaluationRequested) and self.options.policy is not None:
            request = PolicyEvaluate(
                session_id=session.id,
                evaluation_id=msg.evaluation_id,
                phase=msg.phase,
                data=msg.data,
                runner_id=session.record.runner_id,
            )
            self.in_order(session.id, lambda: self._to_policy(request))
        if isinstance(msg, ResponseInProgress):
            # As omnigent's runner says it (PROTOCOL_FACTS.md; §D.3a): a foreground, stored
            # response.
            msg.response.setdefault("background", False)
            msg.response.setdefault("store", True)
        await self._stream_chunk(turn, msg)
        if tag not in _NOT_ON_STREAM:
            await self._publish(
                session,
                msg,
                run_id=turn.turn_id,
                origin_at=incoming.env.created_at,
            )

    async def _tool_call(
        self, session: Session, turn: Turn, item: dict[str, Any], incoming: Incoming
    ) -> None:
        try:
            await self._send_tool_call(session, turn, item)
        finally:
            self.peer.ack(incoming)

    async def _send_tool_call(self, session: Session, turn: Turn, item: dict[str, Any]) -> None:
        if not turn.spec_resolved:
            try:
                session.spec = await self._resolve_spec(session, session.record.agent_id)
                turn.spec_resolved = True
            except Exception as exc:
                log.warning("spec resolver failed inside turn %s: %s", turn.turn_id, exc)
                error = {
                    "type": type(exc).__name__,
                    "code": "spec_resolver_failed",
                    "message": SPEC_FAILED_IN_STREAM,
                }
                await self._fail(session, turn, error)
                return
        call_id = str(item.get("call_id"))
        if self.options.policy is None:
            output = json.dumps(
                {"error": f"the tool {item.get('name')!r} is not available on this runner"}
            )
            await self._to_harness(
                ToolResult(session_id=session.id, call_id=call_id, output=output)
            )
            return
        if session.turn is not turn:
            # It ended while this waited in the queue; policy would park an ASK of it that
            # nothing ever cancels (its TurnEnded, if any, is already decided).
            log.info("dropping tool call %s: its turn is over", call_id)
            return
        if call_id in turn.answered:
            return  # a redelivered request whose outcome the worker already has
        turn.waiting.add(call_id)
        # Recorded before it is sent: after a crash in between, the resumed turn counts a call
        # policy never got (its TurnEnded is a no-op there; the turn waits for its worker,
        # which waits for the call, until turn_timeout_s) rather than forget one a human is
        # deciding, which the idle watchdog would end and nothing would tell policy about.
        # A redelivered request is sent again: policy and the tools actor dedup by call id.
        if call_id not in session.record.tool_calls:
            session.record.tool_calls.append(call_id)
            await self._save(session)
        arguments = item.get("arguments")
        call = ToolCall(
            session_id=session.id,
            turn_id=turn.turn_id,
            call_id=call_id,
            name=str(item.get("name")),
            arguments=arguments if isinstance(arguments, str) else json.dumps(arguments or {}),
            spec=session.spec or {},
            runner_id=session.record.runner_id,
            reply_to=self.peer.name,
        )
        await self._to_policy(call)

    async def _to_policy(self, msg: ToolCall | PolicyEvaluate | TurnEnded) -> None:
        """A durable cast to the policy actor. Called from the session's queue, never from a
        handler: awaiting the broker's acceptance in a handler stalls once the inbox is full
        (the handler is what drains it)."""
        assert self.options.policy is not None
        await self.peer.cast(self.options.policy, msg, durable=True, session_id=msg.session_id)

    @handles(ToolOutcome)
    async def tool_outcome(self, msg: ToolOutcome, incoming: Incoming) -> None:
        session = self.sessions.get(msg.session_id)
        turn = session.turn if session is not None else None
        if turn is None or turn.turn_id != msg.turn_id or msg.call_id in turn.answered:
            log.info("dropping the outcome of tool call %s: its turn is over", msg.call_id)
            return
        turn.answered.add(msg.call_id)
        turn.waiting.discard(msg.call_id)
        turn.last_event = time.monotonic()
        incoming.deferred = True
        self.in_order(msg.session_id, lambda: self._forward_outcome(session, turn, msg, incoming))

    async def _forward_outcome(
        self, session: Session, turn: Turn, msg: ToolOutcome, incoming: Incoming
    ) -> None:
        """Give the worker a call's output, then record the call answered, then ack.

        In this order, a crash anywhere leaves the outcome unacked or recorded: redelivered to
        the next incarnation, it goes to the worker again only if it was not recorded (the
        worker answers a call it no longer waits on with a 404). Recorded first, a crash before
        the worker had it would drop the redelivered copy and leave the worker waiting; acked
        first (on return from the handler), it would be lost with the turn still waiting.
        """
        result = ToolResult(session_id=msg.session_id, call_id=msg.call_id, output=msg.output)
        await self._to_harness(result)
        if session.turn is turn:
            session.record.answered.append(msg.call_id)
            await self._save(session)
        self.peer.ack(incoming)

    @handles(PublishEvents)
    async def publish_events(self, msg: PublishEvents, incoming: Incoming) -> None:
        session = self.sessions.get(msg.session_id)
        if session is None:
            log.info("dropping %d events of unknown session %s", len(msg.events), msg.session_id)
            return
        run_id = session.turn.turn_id if session.turn is not None else None
        for event in msg.events:
            await self._publish(session, event, run_id=run_id)

    @handles(ResponseCompleted, ResponseFailed, ResponseCancelled)
    async def terminal(self, msg: Output, incoming: Incoming) -> None:
        session_id = incoming.env.session_id or ""
        draining = self._draining.get(session_id)
        if draining is not None and draining[0] == msg.turn_id:
            del self._draining[session_id]
            draining[1].set()
        session = self.sessions.get(session_id)
        if session is None or session.turn is None or session.turn.turn_id != msg.turn_id:
            log.info("ignoring a terminal event for turn %s, which is not active", msg.turn_id)
            return
        await self._terminal(session, msg)

    async def _terminal(self, session: Session, msg: Output) -> None:
        turn = session.turn
        if turn is None or turn.turn_id != msg.turn_id:
            return
        # An interrupted turn has no terminal ``response.*`` upstream (§E.4): the server would
        # save the partial text as the answer. The journal and a ``?stream=true`` caller
        # still get the worker's ``response.cancelled``.
        interrupted = turn.interrupted and isinstance(msg, ResponseCancelled)
        await self._stream_chunk(turn, msg)
        await self._publish(session, msg, run_id=turn.turn_id, upstream=not interrupted)
        if isinstance(msg, ResponseFailed):
            error = dict(msg.error)
            code = str(error.get("code") or error.get("type") or "runner_error")
            message = str(error.get("message") or "turn failed")
            await self._finish(session, turn, "failed", {"code": code, "message": message})
            return
        if isinstance(msg, ResponseCompleted) and session.history is not None and turn.text:
            session.history.append(history.assistant_item("".join(turn.text)))
        if not interrupted:
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
        self, session: Session, turn: Turn, status: str, error: dict[str, Any] | None
    ) -> None:
        """End a turn: one terminal edge, or straight into the continuation turn (D-31)."""
        if session.turn is not turn:
            return
        session.turn = None
        if session.record.tool_calls and self.options.policy is not None:
            ended = TurnEnded(session_id=session.id, turn_id=turn.turn_id)
            self.in_order(session.id, lambda: self._to_policy(ended))
        if turn.stream_to is not None:
            await self.outbox.flush()
            await self.peer.cast(
                turn.stream_to[0], HttpChunk(request_id=turn.stream_to[1], end=True)
            )
        buffered, session.record.buffer = session.record.buffer, []
        session.record.end_turn()
        if status == "failed":
            self.stats["failed"] += 1
        if buffered and status == "idle":
            self.in_order(
                session.id, lambda: self._start_turn(session, buffered, None, continuation=True)
            )
            return
        session.record.status = status
        edge: dict[str, Any] = {"type": "session.status", "status": status}
        if error is not None:
            edge["error"] = error
        await self._publish(session, edge, run_id=turn.turn_id, terminal=True)
        await self._save(session)
        if buffered:
            self.in_order(session.id, lambda: self._start_turn(session, buffered, None))

    # --- publishing ------------------------------------------------------------------------

    async def _publish(
        self,
        session: Session,
        event: dict[str, Any] | Output,
        *,
        run_id: str | None = None,
        terminal: bool = False,
        origin_at: float = 0.0,
        upstream: bool = True,
    ) -> None:
        """Publish one event to the subscribers (unless not ``upstream``) and the journal."""
        # Output events encode to exactly their protocol JSON; no dict in between.
        kind = event["type"] if isinstance(event, dict) else event.__struct_config__.tag
        session.record.seq += 1
        data = msgspec.json.encode(event)
        for name in self.options.subscribers if upstream else ():
            self._events.setdefault(name, []).append(
                SessionEvent(
                    session_id=session.id,
                    seq=session.record.seq,
                    event=data,
                    runner_id=session.record.runner_id,
                    origin_at=origin_at,
                )
            )
        self._events_ready.set()
        journal = self.options.journal
        run = run_id or session.record.turn_id
        if not (journal and run):
            return
        pending = self._journal.setdefault((session.id, run), [])
        pending.append(JournalEvent(event=kind, payload=event))
        if not terminal:
            self._journal_ready.set()
            return
        # The run's last append carries what is still pending, durably. The journal loop
        # sends it: a handler awaiting its acceptance would stall while the peer is not
        # reading (a flood past its inbox and overflow), and the handler is what drains them.
        del self._journal[(session.id, run)]
        self._journal_final.append(JournalAppend(session_id=session.id, run_id=run, events=pending))
        self._journal_ready.set()

    async def _events_loop(self) -> None:
        """Send published events to each subscriber, durably, in batches.

        Durable, so that events published while the gateway restarts (or is killed) wait in
        its mailbox instead of being lost. Batched by acceptance: while one round waits for
        its group commit, the events published meanwhile gather and go out together in
        :class:`~corral.routes.SessionEvents` messages — one commit, one ack, one buffer write
        per message — while a lone event finds the loop idle and goes at once. A round's
        messages are all in flight at once (the broker keeps their order): their acceptance
        can queue behind a flood of incoming deltas, and one round trip per message would
        then cap the rate at one message's events per round trip.
        """
        while True:
            await self._events_ready.wait()
            self._events_ready = trio.Event()
            pending, self._events = self._events, {}
            for name, events in pending.items():
                try:
                    await self.peer.cast_many(
                        name, _event_batches(events), durable=True, timeout=60
                    )
                except Exception as exc:
                    log.warning(
                        "%d session events for %s may not have been delivered: %s",
                        len(events),
                        name,
                        exc,
                    )

    async def _flush_journal(self) -> None:
        """Queue one append per run for everything pending (a delta per append would
        make the journal the bottleneck of every turn)."""
        journal = self.options.journal
        pending, self._journal = self._journal, {}
        for (session_id, run), events in pending.items():
            self.outbox.put_nowait(
                journal or "journal",
                JournalAppend(session_id=session_id, run_id=run, events=events),
                session_id=session_id,
            )

    async def _journal_loop(self) -> None:
        """Flush journal events after a short window, so that an append carries many; send
        runs' last appends durably, each after every earlier append of its run.

        The window costs nothing a client sees: the stream does not wait for the journal. A
        run's last append skips it.
        """
        while True:
            await self._journal_ready.wait()
            if not self._journal_final:
                await trio.sleep(_JOURNAL_WINDOW_S)
            self._journal_ready = trio.Event()
            await self._flush_journal()
            if not self._journal_final:
                continue
            # The run's stream appends go first: a durable one sent meanwhile could overtake
            # them (the journal orders appends only within a durability class).
            await self.outbox.flush()
            while self._journal_final:
                # Shielded, and taken off the list only once answered: a stop in the middle
                # neither loses the append nor leaves terminate() to send it twice.
                with trio.CancelScope(shield=True):
                    await self._append_final(self._journal_final[0])
                self._journal_final.pop(0)

    async def _append_final(self, append: JournalAppend, timeout: float | None = None) -> None:
        """Send a run's last append durably (a failure is logged: the stream goes on)."""
        journal = self.options.journal or "journal"
        try:
            await self.peer.cast(
                journal, append, durable=True, session_id=append.session_id, timeout=timeout
            )
        except Exception as exc:
            log.warning("journal append failed: %s", exc)

    async def _stream_chunk(self, turn: Turn, msg: Output) -> None:
        if turn.stream_to is None:
            return
        frame = sse_frame(msg.__struct_config__.tag, msgspec.json.encode(msg))
        self.outbox.put_nowait(
            turn.stream_to[0], HttpChunk(request_id=turn.stream_to[1], data=frame)
        )

    # --- the watchdog ----------------------------------------------------------------------

    @every(1.0)
    async def _watchdog(self) -> None:
        now = time.monotonic()
        for session in list(self.sessions.values()):
            turn = session.turn
            if turn is None:
                continue
            too_long = now - turn.started > self.options.turn_timeout_s
            silent = not turn.waiting and now - turn.last_event > self.options.turn_idle_timeout_s
            if too_long or silent:
                self.stats["watchdog"] += 1
                why = "took too long" if too_long else "went silent"
                log.warning("turn %s %s; ending it", turn.turn_id, why)
                error = {
                    "code": "turn_watchdog",
                    "message": f"the turn {why} and was ended by the runner",
                }
                await self._fail(session, turn, error)


def _spec_harness(spec: dict[str, Any]) -> str | None:
    executor = spec.get("executor") or {}
    harness = executor.get("harness") or (executor.get("config") or {}).get("harness")
    return str(harness) if harness else None


def _init_v2(record: SessionRecord, init: dict[str, Any], snapshot: dict[str, Any]) -> None:
    """Keep the session-init v2 fields (§B.1) a well-formed envelope carries."""
    if isinstance(init.get("recovery_id"), str):
        record.recovery_id = init["recovery_id"]
    record.resume_interrupted_turn = init.get("resume_interrupted_turn") is True
    config = snapshot.get("inference_config")
    record.inference_config = config if isinstance(config, dict) else None


def runner_tools(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The tools this runner runs for the agent, as function-tool schemas for the worker
    (PROTOCOL_FACTS.md §iv.1 ``tools``) when the server's message names none."""
    return [
        {"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}
        for tool in tool_schemas(spec)
    ]
