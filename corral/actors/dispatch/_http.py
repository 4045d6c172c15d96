"""The session routes: create, read and delete a session, and take its events.

These are the handlers the route table (:data:`~._routes.ROUTES`) names; the actor's
``HttpRequest`` handler matches a request and runs one of them where its row says. A session
event is parsed into its typed union (:mod:`._events`) and acted on here: a ``message``
starts or is buffered behind a turn (:mod:`._turns`), an ``approval`` goes to whoever
parked its elicitation, ``interrupt``/``stop_session`` ask the active turn to stop, and every
other control event is answered 204.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any, TypedDict
from urllib.parse import parse_qs

import trio

from ..._input import check_session_id
from ..._jsonlines import JsonObject
from ...harnesses.protocol import Approval, InputAccepted, Interrupt
from ...routes import HttpRequest, HttpResponse, empty_response, json_response, no_session
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
from ._routes import from_harness, no_route
from ._session import Session, SessionRecord
from ._stream import StreamOrder
from ._turn import Phase, Trigger, transition

log = logging.getLogger("corral.actors.dispatch")


class SessionView(TypedDict):
    """A session as this runner answers it; what the server owns is null or empty."""

    id: str
    agent_id: str | None
    status: str
    created_at: int
    title: None
    labels: dict[str, str]
    runner_id: None
    reasoning_effort: None
    items: list[Any]
    permission_level: None
    terminal_ready: None


class SessionRoutes(StreamOrder):
    """The session routes: a part of :class:`~._actor.DispatchActor` (see :mod:`._base`)."""

    async def create_session(self, msg: HttpRequest) -> HttpResponse:
        body = msg.json()
        if not isinstance(body, dict) or not isinstance(body.get("session_id"), str):
            raise BadEvent(400, "invalid_request", "session_id is required")
        session_id = body["session_id"]
        check_session_id(session_id)  # an id in a path is checked before routing
        init = body.get("session_init") if isinstance(body.get("session_init"), dict) else None
        snapshot = (init or {}).get("snapshot") or {}
        session = await self._session(session_id, msg.runner_id)
        if session is None:
            return no_session(session_id)
        record = session.record
        # Re-init keeps the session's turn, buffer and state; only bindings refresh (D-32).
        # That is also how ``resume_interrupted_turn`` is honoured: a turn still running here
        # (its worker alive, dispatch restarted or the server reconnected) goes on, and the
        # 201 says ``running``. A turn whose worker died cannot be continued — corral has no
        # native harness session to resume it in — and has already ended ``failed``.
        # ``suppress_recovery_turn`` needs nothing: corral never starts a recovery turn.
        record.agent_id = body.get("agent_id") or record.agent_id
        record.sub_agent_name = body.get("sub_agent_name") or record.sub_agent_name
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

    def _view(self, session: Session) -> SessionView:
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

    async def get_session(self, msg: HttpRequest, session_id: str) -> HttpResponse:
        session = await self._known_to(session_id, msg.runner_id)
        if session is None:
            return no_session(session_id)
        return json_response(200, self._view(session))

    async def session_runner(self, msg: HttpRequest, session_id: str) -> HttpResponse:
        """``GET /runner/sessions/{id}``: the runner id the session is bound through, for the
        gateway, which answers a session's stream and routes its resources itself. Only for a
        request from inside the host: the tunnel forwards ``/v1/sessions...`` alone, and a
        request with a runner id is answered as an unknown route."""
        if msg.runner_id is not None:
            return no_route(msg.method, msg.path)
        session = await self._known(session_id)
        if session is None:
            return no_session(session_id)
        return json_response(200, {"runner_id": session.record.runner_id})

    async def delete_session(self, msg: HttpRequest, session_id: str) -> HttpResponse:
        """``DELETE /v1/sessions/{id}`` (PROTOCOL_0_19.md §I.1): stop and forget the session.

        A running turn is interrupted and ends here with its one ``idle`` edge (the session
        is gone, so its worker's ``response.cancelled`` finds no turn and makes no second
        edge); buffered messages are dropped; a tombstone goes to ``sessions.log`` (fsynced)
        before the answer, so a restart does not resurrect the session; the tools actor closes
        its terminals. An unknown session gets the same answer (idempotent); one bound through
        another runner id is not touched (its terminals neither) and answers 404.
        """
        session = await self._known(session_id)
        if session is not None and not session.record.reachable_by(msg.runner_id):
            return no_session(session_id)
        # A deleted (closed) sub-agent's parent is told its work is cancelled: a parent never
        # waits for a child that is gone.
        await self.work.ended(session_id, None, "cancelled", "")
        if session is not None:
            turn = session.turn
            transition(session.phase, Trigger.DELETE)
            if turn is not None:
                self._draining[session_id] = (turn.turn_id, trio.Event())
                self.in_order(
                    session_id, lambda: self._to_harness(Interrupt(session_id=session_id))
                )
                session.record.buffer = []
                await self._finish(session, turn, "idle", None)
                # The edge goes before the answer: the server ends the session's stream on
                # it, and an ``idle`` after that reaches no one.
                await self.fanout.sent()
            del self.sessions[session_id]
            self._deleted_seq[session_id] = session.record.seq
            await self.store.tombstone(session_id)
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
        if reply.status >= 300:
            log.warning(
                "the tools actor did not close session %s's terminals (%s)",
                session_id,
                reply.status,
            )

    async def post_event(self, msg: HttpRequest, session_id: str) -> HttpResponse | None:
        event = parse_event(msg.body)
        session = await self._session(session_id, msg.runner_id)
        if session is None:
            return no_session(session_id)
        stream = parse_qs(msg.query).get("stream", [""])[0].lower() == "true"
        if isinstance(event, MessageEvent):
            # Its idempotency key: the server's id of the saved user item (the real server and
            # the control plane send it again with a re-POST or a retry), else the request's
            # own id (the broker redelivers a request with it).
            key = event.persisted_item_id or f"request:{msg.request_id}"
            return await self._message(session, event, msg if stream else None, key)
        if isinstance(event, ApprovalEvent):
            # A control event: it goes to whoever parked the elicitation — the policy actor
            # (a tool call it asked about) or a worker — and never starts, buffers or ends a
            # turn (E-04).
            approval = flatten_approval(event, session_id)
            if self.options.policy is not None:
                reply = await self._call_policy(approval)
                if reply is not None and reply.status != 404:
                    return from_harness(reply)
            reply = await self._to_harness(approval, durable=True)
            taken = reply is not None and reply.status < 300
            if session.turn is not None and taken:  # the harness has the verdict: it goes on
                session.turn.elicitation_closed(approval.elicitation_id)
                session.turn.heard()
                await self._elicitation_closed(session, approval.elicitation_id)
            return from_harness(reply)
        if isinstance(event, InterruptEvent | StopSessionEvent):
            # Both are recorded alike (PROTOCOL_0_19.md §E.4): the worker's cancelled ends the
            # turn, then ``_terminal`` leaves the note. Saved first, so a dispatch restarted
            # before the cancelled arrives still ends the turn as an interruption.
            turn, phase = session.turn, session.phase
            if transition(phase, Trigger.INTERRUPT) is not Phase.IDLE:
                assert turn is not None
                if phase is Phase.RUNNING:
                    turn.interrupted = session.record.interrupted = True
                    await self._save(session)
                await self._to_harness(Interrupt(session_id=session_id))
            return empty_response(204)
        if isinstance(event, CostApprovalPopupEvent) and not event.elicitation_id:
            raise BadEvent(400, "invalid_input", "Body 'elicitation_id' must be a non-empty string")
        # The popup and every other control event (§C.3): no native terminal here acts on it.
        return empty_response(204)

    async def _call_policy(self, msg: Approval) -> InputAccepted | None:
        assert self.options.policy is not None
        try:
            return await self.peer.call(self.options.policy, msg, durable=True, timeout=15)
        except Exception as exc:
            log.warning("the policy actor did not answer %s: %s", type(msg).__name__, exc)
            return None


def _init_v2(record: SessionRecord, init: JsonObject, snapshot: JsonObject) -> None:
    """Keep the session-init v2 fields (§B.1) a well-formed envelope carries."""
    if isinstance(init.get("recovery_id"), str):
        record.recovery_id = init["recovery_id"]
    record.resume_interrupted_turn = init.get("resume_interrupted_turn") is True
    config = snapshot.get("inference_config")
    record.inference_config = config if isinstance(config, dict) else None
