"""Tool calls: the runner's side of a tool round trip, from a worker or from the server.

A worker's ``action_required`` function call goes to the policy actor as a durable
:class:`~corral.actors.policy.messages.ToolCall` (policy gates it, parks an ASK for a human, and the
tools actor runs it); the :class:`~corral.actors.dispatch.messages.ToolOutcome` comes back durably
and goes to the worker as a ``tool_result``. Both legs are crash-safe by their order of record, send
and ack (see :meth:`ToolCalls._send_tool_call` and :meth:`ToolCalls._forward_outcome`), and the turn
counts each call it waits on, so the idle watchdog spares it.
``POST /v1/sessions/{id}/mcp/execute`` is the server's leg: one call through policy, answered
with its output.
"""

from __future__ import annotations

import json
import logging
import uuid

from ..._jsonlines import JsonObject
from ...bus import Incoming
from ...harnesses.protocol import ToolResult
from ...routes import HttpRequest, HttpResponse, json_response, no_session
from .._actor import handles
from .._deferred import Deferred
from ..policy.messages import ToolCall, ToolOutcome
from ._events import BadEvent
from ._routes import GENERIC_DETAIL, error
from ._session import Session
from ._turn import Turn
from ._turns import TurnFlow
from ._watchdog import TurnError

log = logging.getLogger("corral.actors.dispatch")
#: The ``function_call`` output item's error of an unresolvable spec inside a turn.
SPEC_FAILED_IN_STREAM = "Failed to resolve the agent spec for this turn."


class ToolCalls(TurnFlow):
    """Tool calls: a part of :class:`~._actor.DispatchActor` (see :mod:`._base`)."""

    async def _tool_call(
        self, session: Session, turn: Turn, item: JsonObject, deferred: Deferred | None
    ) -> None:
        """Send a worker's call on (``deferred``: its durable request, None for the copy a
        worker sent again), acking the request once it is on its way."""
        try:
            await self._send_tool_call(session, turn, item)
        finally:
            if deferred is not None:
                deferred.ack()

    async def _send_tool_call(self, session: Session, turn: Turn, item: JsonObject) -> None:
        if not turn.spec_resolved:
            try:
                session.spec = await self._resolve_spec(session, session.record.agent_id)
                turn.spec_resolved = True
            except Exception as exc:
                log.warning("spec resolver failed inside turn %s: %s", turn.turn_id, exc)
                failure: TurnError = {
                    "type": type(exc).__name__,
                    "code": "spec_resolver_failed",
                    "message": SPEC_FAILED_IN_STREAM,
                }
                await self._fail(session, turn, failure)
                return
        call_id = str(item.get("call_id"))
        if self.options.policy is None:
            output = json.dumps(
                {"error": f"the tool {item.get('name')!r} is not available on this runner"}
            )
            await self._to_harness(
                ToolResult(session_id=session.id, call_id=call_id, output=output), durable=True
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

    @handles(ToolOutcome)
    async def tool_outcome(self, msg: ToolOutcome, incoming: Incoming) -> None:
        session = self.sessions.get(msg.session_id)
        turn = session.turn if session is not None else None
        if (
            session is None
            or turn is None
            or turn.turn_id != msg.turn_id
            or msg.call_id in turn.answered
        ):
            log.info("dropping the outcome of tool call %s: its turn is over", msg.call_id)
            return
        turn.answered.add(msg.call_id)
        turn.waiting.discard(msg.call_id)
        turn.heard()
        deferred = self.defer(incoming)
        self.in_order(
            msg.session_id, lambda: self._forward_outcome(session, turn, msg, deferred), deferred
        )

    async def _forward_outcome(
        self, session: Session, turn: Turn, msg: ToolOutcome, deferred: Deferred
    ) -> None:
        """Give the worker a call's output, then record the call answered, then ack.

        In this order, a crash anywhere leaves the outcome unacked or recorded: redelivered to
        the next incarnation, it goes to the worker again only if it was not recorded (the
        worker answers a call it no longer waits on with a 404). Recorded first, a crash before
        the worker had it would drop the redelivered copy and leave the worker waiting; acked
        first (on return from the handler), it would be lost with the turn still waiting.
        The result is durable: a harness actor that dies with it in hand gets it again when
        it restarts (sent as a stream call, it was lost with the actor, the worker waited on
        it for good — 40 turns of a harness-only chaos run).
        """
        result = ToolResult(session_id=msg.session_id, call_id=msg.call_id, output=msg.output)
        await self._to_harness(result, durable=True)
        if session.turn is turn:
            session.record.answered.append(msg.call_id)
            await self._save(session)
        deferred.ack()

    async def mcp_execute(self, msg: HttpRequest, session_id: str) -> HttpResponse:
        """``POST .../mcp/execute`` (§ii.9): the server's leg of a tool round trip."""
        body = msg.json()
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
            return error(501, "not_implemented", "Runner-side tools are not enabled.")
        session = await self._session(session_id, msg.runner_id)
        if session is None:
            return no_session(session_id)
        try:
            spec = await self._resolve_spec(session, session.record.agent_id)
        except Exception as exc:
            log.warning("spec resolver failed for mcp/execute in %s: %s", session_id, exc)
            return error(503, "spec_resolver_failed", GENERIC_DETAIL)
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
            return error(502, "tool_failed", GENERIC_DETAIL)
        return json_response(200, {"result": {"output": reply.output}})
