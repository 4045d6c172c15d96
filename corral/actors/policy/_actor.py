"""The policy actor: the one place that decides whether a tool call runs (P-*, T-*).

What it handles and answers is the table in :mod:`corral.actors.policy.messages`.

A tool call of a turn passes, in order:

1. **Local gates** that never reach a server: the arguments must be a JSON object and the
   tool must be runner-local (T-26). Path containment (P-20..P-22) is enforced where the path
   is used, by the tools themselves (``corral.tools.paths``): a check made here and a use
   made later would race a symlink swap.
2. **The server's verdict** for ``PHASE_TOOL_CALL`` (``POST /policies/evaluate``,
   PROTOCOL_0_19 §F): ALLOW or UNSPECIFIED run it; DENY answers the model with the reason;
   ASK publishes ``response.elicitation_request`` and parks the call in this actor's mailbox
   until a human verdict arrives. A server that is unavailable (no connection, 502/503/504:
   the embedded control plane is back 2 to 4 s after a ``kill -9``) is asked again for
   ``server_wait_s`` from the first failure, with backoff, and the call waits meanwhile;
   after that, and at once on any other error, non-200 or malformed answer, it **fails
   closed**: the call does not run.
3. **The tools actor** runs it (a durable call; the tools actor answers a redelivered call
   from its results log, so nothing runs twice).
4. **The server's verdict** for ``PHASE_TOOL_RESULT``: DENY withholds the output from the
   model. An evaluation that fails here is logged and the output passes: the tool already
   ran, and only the phases that come before an action fail closed.

The bodies are the ones the server validates (§F.2; a body it rejects is a 400, which
would fail the phase)::

    {"event": {"type": "PHASE_TOOL_CALL", "data": {"name", "arguments": {...}, "call_id"}},
     "_omnigent_elicitation_id": "elicit_evaluate_<32 hex>"}
    {"event": {"type": "PHASE_TOOL_RESULT", "request_data": {"name", "arguments": {...}},
               "target": <name>, "data": {"result": <output string>}}}
    {"event": {"type": "PHASE_LLM_REQUEST", "data": <the worker's data object>},
     "_omnigent_elicitation_id": "elicit_evaluate_<32 hex>"}

Asking an evaluation again cannot act twice: a verdict changes nothing on the server but the
prompt of an ASK, and a held phase's body carries an elicitation id, so asking again
re-attaches to the prompt already shown. A held evaluation that timed out on its own deadline
(``ask_timeout_s``) is not asked again: that would only extend it. The turn's end cancels the
wait with the evaluation.

For the phases the server may hold until a person answers (TOOL_CALL, LLM_REQUEST: §F.3)
the read deadline is ``ask_timeout_s`` (a day), not the client's 30 s, and the body carries
an elicitation id derived from the call or evaluation: a redelivered evaluation (this actor
restarted while it was held) re-attaches to the prompt already shown instead of asking the
person again.

A worker's own evaluation (:class:`PolicyEvaluate`, the openai kinds' ``PHASE_LLM_REQUEST``
before a turn's first model call) fails closed as well (BEHAVIOURS P-03: no usable verdict
means the action does not happen); its verdict is marked ``failed`` so the turn can say the
check failed rather than that a policy denied it.

Crash safety. The :class:`ToolCall` is acked only after its :class:`ToolOutcome` has been
made durable towards dispatch, and a parked call stays parked until then; an approval is
acked last too. A crash at any point redelivers what is unfinished to the next incarnation,
which rebuilds its parked calls from the broker — every step is idempotent (the elicitation id
is derived from the call, the tools actor dedups by call id, dispatch ignores a second
outcome for a call).

Error hygiene (P-28): the model and clients get fixed messages; causes go to the log.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec
import trio

from ..._jsonlines import JsonObject
from ...bus import Incoming
from ...config import RunnerSettings
from ...harnesses.protocol import HARNESS_ACTOR, Approval, InputAccepted, PolicyVerdict
from ...server_client import ServerClient, pick_server
from ...server_wait import SERVER_WAIT_S, while_unavailable
from ...tools.registry import is_runner_local
from .._actor import Actor, ActorContext, handles
from .._crash import crash_point
from .._deferred import Deferred
from ..dispatch.messages import PublishEvents
from ..tools.messages import TOOLS_ACTOR, ToolCancel, ToolExec
from .messages import PolicyEvaluate, ToolCall, ToolOutcome, TurnEnded, elicitation_id_for

log = logging.getLogger("corral.actors.policy")

ALLOW, DENY, ASK, UNSPECIFIED = "ALLOW", "DENY", "ASK", "UNSPECIFIED"
TOOL_CALL, TOOL_RESULT, LLM_REQUEST = "PHASE_TOOL_CALL", "PHASE_TOOL_RESULT", "PHASE_LLM_REQUEST"
#: Phases whose evaluation fails closed (an error means "do not run").
FAIL_CLOSED = {TOOL_CALL, "PHASE_REQUEST", LLM_REQUEST}
#: Phases the server may hold until a person answers an ASK (PROTOCOL_0_19 §F.3).
HELD = {TOOL_CALL, "PHASE_REQUEST", LLM_REQUEST}

POLICY_FAILED = "The policy check failed, so the tool call was not run."
#: Why a failed-closed phase did not happen, per phase (the tool call's is POLICY_FAILED).
FAILED_CLOSED = {
    LLM_REQUEST: "the policy check failed, so the model was not called",
    "PHASE_REQUEST": "the policy check failed, so the message was not handled",
}
DECLINED = "The user declined this tool call."
CANCELLED = "The tool call was cancelled before it ran."
WITHHELD = "The tool's result was withheld by policy."
TOOL_FAILED = "The tool did not finish; see runner logs for details."
APPROVAL_SCHEMA = {
    "type": "object",
    "properties": {"approved": {"type": "boolean"}},
    "required": ["approved"],
}


class PolicyOptions(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """``[actors.policy.options]``."""

    #: A server for sessions of any runner (tests; hosts pass ``runners`` instead).
    server_url: str | None = None
    token: str | None = None
    runners: list[RunnerSettings] = []
    tools: str = TOOLS_ACTOR
    dispatch: str = "dispatch"
    #: How long a tool call may take in the tools actor, plus its own margin.
    tool_timeout_s: float = 900.0
    #: Evaluate ``PHASE_TOOL_RESULT`` as well (one more server round trip per call).
    evaluate_results: bool = True
    #: How long an evaluation the server holds for a person (an ASK) may take (§F.3).
    ask_timeout_s: float = 86400.0
    #: How long an evaluation keeps asking an unavailable server, from its first failure,
    #: before its phase fails closed (or open): the control plane's restart window.
    server_wait_s: float = SERVER_WAIT_S
    #: Crash tests only (:mod:`corral.actors._crash`): exit at once after an ASK's prompt is
    #: published and before its park is committed (``asked``). Empty: never.
    crash_at: Literal["", "asked"] = ""


class PolicyError(Exception):
    """An evaluation gave no usable verdict (unreachable server, non-200, bad shape)."""


@dataclass
class ParkedCall:
    """A tool call waiting on a human verdict."""

    incoming: Incoming
    call: ToolCall
    elicitation_id: str
    #: The approval being acted on (acked once the call's outcome is durable).
    verdict: Deferred | None = None
    #: Set once the broker holds the call parked (or the attempt to park it ended).
    ready: trio.Event = field(default_factory=trio.Event)


class PolicyActor(Actor):
    """Gates every runner-local tool call."""

    def __init__(self, ctx: ActorContext, peer: Any) -> None:
        super().__init__(ctx, peer)
        self.options = msgspec.convert(ctx.options, PolicyOptions)
        self.server: ServerClient | None = None
        self.servers: dict[str, ServerClient] = {}
        self.parked: dict[str, ParkedCall] = {}
        #: Calls in progress (call_id → the scope to cancel when the turn ends).
        self.running: dict[str, tuple[ToolCall, trio.CancelScope]] = {}
        #: Calls whose gate has not yet decided, by their elicitation id, and the approvals
        #: that arrived for them meanwhile (see :meth:`approval`).
        self.deciding: dict[str, ToolCall] = {}
        self.early: dict[str, tuple[str, Deferred]] = {}
        #: Evaluations in progress, per session (evaluation id → its scope): the server may
        #: hold one until a person answers, and the turn's end lets it go.
        self.evaluating: dict[str, dict[str, trio.CancelScope]] = {}
        self.stats = {"calls": 0, "allowed": 0, "denied": 0, "asked": 0, "failed_closed": 0}

    async def setup(self) -> None:
        from ...server_client import ServerClient

        held = self.options.ask_timeout_s
        if self.options.server_url:
            self.server = ServerClient(
                self.options.server_url, token=self.options.token, policy_timeout_s=held
            )
        for runner in self.options.runners:
            assert runner.id is not None
            self.servers[runner.id] = ServerClient(
                runner.server, token=runner.token, policy_timeout_s=held
            )
        for incoming, _age in await self.peer.parked():
            if isinstance(incoming.msg, ToolCall):
                call = incoming.msg
                eid = elicitation_id_for(call.session_id, call.call_id)
                parked = self.parked[eid] = ParkedCall(incoming, call, eid)
                parked.ready.set()
        if self.parked:
            log.info("recovered %d tool calls waiting on approval", len(self.parked))

    async def terminate(self) -> None:
        for client in {id(c): c for c in (self.server, *self.servers.values()) if c}.values():
            await client.aclose()

    def snapshot(self) -> dict[str, Any]:
        return {
            **super().snapshot(),
            **self.stats,
            "parked": sorted(self.parked),
            "running": sorted(self.running),
        }

    def _server(self, runner_id: str | None) -> ServerClient | None:
        return pick_server(self.server, self.servers, runner_id)

    # --- tool calls --------------------------------------------------------------------------

    @handles(ToolCall)
    async def tool_call(self, msg: ToolCall, incoming: Incoming) -> None:
        eid = elicitation_id_for(msg.session_id, msg.call_id)
        if eid in self.parked or msg.call_id in self.running:
            return  # a redelivered copy of a call already in hand (acked now)
        deferred = self.defer(incoming)
        # Registered here, not in the task: an Approval or TurnEnded handled next must find it.
        scope = trio.CancelScope()
        self.running[msg.call_id] = (msg, scope)
        self.deciding[eid] = msg
        assert self.nursery is not None
        self.nursery.start_soon(self._gate, msg, deferred, scope)

    async def _gate(self, call: ToolCall, deferred: Deferred, scope: trio.CancelScope) -> None:
        self.stats["calls"] += 1
        eid = elicitation_id_for(call.session_id, call.call_id)
        with scope:
            try:
                outcome = await self._decide(call, deferred)
            except Exception:
                log.exception(
                    "tool call %s (%s) failed in the policy gate", call.call_id, call.name
                )
                outcome = _outcome(call, "failed", TOOL_FAILED)
            finally:
                self.running.pop(call.call_id, None)
                self.deciding.pop(eid, None)
        if scope.cancelled_caught:
            outcome = _outcome(call, "cancelled", CANCELLED)
        early = self.early.pop(eid, None)
        if outcome is not None:
            await self._answer(call, outcome, held=deferred)
            if early is not None:
                # The call was decided without a person (the verdict changed, the turn
                # ended): the approval that came for it has nothing left to act on.
                log.info("approval of %s came for a call decided without it", eid)
                early[1].ack()
        elif early is not None:
            parked = self.parked.get(eid)
            if parked is None:  # its park failed (the gate answered it)
                early[1].ack()
            else:
                self._approved(parked, *early)

    async def _decide(self, call: ToolCall, deferred: Deferred) -> ToolOutcome | None:
        """The outcome of a call, or None when it was parked to wait for a human."""
        try:
            arguments = json.loads(call.arguments or "{}")
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict):
            return _outcome(call, "failed", f"The arguments of {call.name} are not a JSON object.")
        if not is_runner_local(call.name):
            return _outcome(
                call, "failed", f"The tool {call.name!r} is not available on this runner."
            )
        if call.origin == "mcp":
            return await self._run(call)  # the server evaluated it before calling us
        event = {
            "type": TOOL_CALL,
            "data": {"name": call.name, "arguments": arguments, "call_id": call.call_id},
        }
        action, reason, _ = await self._verdict(
            call.session_id, call.runner_id, event, call.call_id
        )
        if action == DENY:
            self.stats["denied"] += 1
            return _outcome(call, "denied", reason or "The tool call was denied by policy.")
        if action == ASK:
            self.stats["asked"] += 1
            await self._ask(call, deferred, arguments, reason)
            return None
        self.stats["allowed"] += 1
        return await self._run(call)

    async def _ask(
        self, call: ToolCall, deferred: Deferred, arguments: JsonObject, reason: str | None
    ) -> None:
        eid = elicitation_id_for(call.session_id, call.call_id)
        preview = json.dumps(arguments, ensure_ascii=False)
        if len(preview) > 200:
            preview = preview[:200] + "…"
        params = {
            "message": reason or f"Agent wants to call {call.name}({preview}). Approve?",
            "requestedSchema": APPROVAL_SCHEMA,
            "tool": {"name": call.name, "call_id": call.call_id},
        }
        # Known before it is announced: the broker delivers the announcement while its commit
        # runs, so a quick client's verdict can arrive before the publish returns.
        parked = self.parked[eid] = ParkedCall(deferred.incoming, call, eid)
        try:
            # Published before parking: a crash in between redelivers the call, which asks
            # again under the same id — a repeated prompt, never a lost one.
            await self._publish(
                call.session_id,
                {"type": "response.elicitation_request", "elicitation_id": eid, "params": params},
            )
            crash_point(self.ctx.data_dir, "asked", self.options.crash_at, log)
            await deferred.park()
        except BaseException:
            self.parked.pop(eid, None)
            raise
        finally:
            parked.ready.set()

    @handles(Approval)
    async def approval(self, msg: Approval, incoming: Incoming) -> InputAccepted:
        eid = msg.elicitation_id
        parked = self.parked.get(eid)
        deciding = self.deciding.get(eid)
        if parked is None and deciding is not None and deciding.session_id == msg.session_id:
            # The prompt was published by an incarnation that died before its park was
            # committed; the redelivered call is being evaluated again and will park under
            # the same id. Answering 404 now would lose the person's answer and leave the
            # re-asked prompt to nobody: the approval waits for the park instead.
            if eid not in self.early:
                self.early[eid] = (msg.action, self.defer(incoming))
            return InputAccepted(status=204)
        if parked is None or parked.call.session_id != msg.session_id:
            return InputAccepted(
                status=404,
                error={"code": "not_found", "message": f"no tool call waits on {eid!r}"},
            )
        if parked.verdict is not None:
            return InputAccepted(status=204)  # already being acted on; this copy is redundant
        self._approved(parked, msg.action, self.defer(incoming))
        return InputAccepted(status=204)

    def _approved(self, parked: ParkedCall, action: str, verdict: Deferred) -> None:
        """Act on a person's verdict for a parked call; ``verdict`` is acked once done."""
        parked.verdict = verdict
        assert self.nursery is not None
        self.nursery.start_soon(self._resume, parked, action)

    async def _resume(self, parked: ParkedCall, action: str) -> None:
        call = parked.call
        await parked.ready.wait()
        if self.parked.get(parked.elicitation_id) is not parked:
            # Its turn ended while it was being announced; the gate answered it.
            if parked.verdict is not None:
                parked.verdict.ack()
            return
        await self._publish(
            call.session_id,
            {
                "type": "response.elicitation_resolved",
                "elicitation_id": parked.elicitation_id,
                "action": action,
            },
        )
        if action == "accept":
            with trio.CancelScope() as scope:
                self.running[call.call_id] = (call, scope)
                try:
                    outcome = await self._run(call)
                except Exception:
                    log.exception("approved tool call %s failed", call.call_id)
                    outcome = _outcome(call, "failed", TOOL_FAILED)
                finally:
                    self.running.pop(call.call_id, None)
            if scope.cancelled_caught:
                outcome = _outcome(call, "cancelled", CANCELLED)
        else:
            outcome = _outcome(call, "denied", DECLINED)
        await self._answer(call, outcome, parked=parked, state_reason=action)

    @handles(TurnEnded)
    async def turn_ended(self, msg: TurnEnded, incoming: Incoming) -> None:
        # A session runs one turn at a time, and its next turn's evaluations come after this
        # message: every evaluation of the session in progress is the ended turn's.
        for scope in self.evaluating.pop(msg.session_id, {}).values():
            scope.cancel()
        for call, scope in list(self.running.values()):
            if call.session_id == msg.session_id and call.turn_id == msg.turn_id:
                scope.cancel()
                await self.peer.cast(self.options.tools, ToolCancel(call_id=call.call_id))
        for parked in list(self.parked.values()):
            call = parked.call
            ours = call.session_id == msg.session_id and call.turn_id == msg.turn_id
            # One with a verdict, or still being announced, is running: cancelled above.
            if ours and parked.verdict is None and call.call_id not in self.running:
                outcome = _outcome(call, "cancelled", CANCELLED)
                await self._answer(call, outcome, parked=parked, state_reason="turn_ended")

    async def _run(self, call: ToolCall) -> ToolOutcome:
        """Run the call in the tools actor, then gate its result."""
        request = ToolExec(
            session_id=call.session_id,
            call_id=call.call_id,
            name=call.name,
            arguments=call.arguments,
            spec=call.spec,
            runner_id=call.runner_id,
        )
        try:
            reply = await self.peer.call(
                self.options.tools,
                request,
                durable=True,
                timeout=self.options.tool_timeout_s,
                session_id=call.session_id,
            )
        except Exception as exc:
            log.warning(
                "the tools actor did not answer call %s (%s): %s", call.call_id, call.name, exc
            )
            return _outcome(call, "failed", TOOL_FAILED)
        outcome = ToolOutcome(
            session_id=call.session_id,
            turn_id=call.turn_id,
            call_id=call.call_id,
            output=reply.output,
            status=reply.status,
        )
        if call.origin == "mcp" or not self.options.evaluate_results:
            return outcome
        event = {
            "type": TOOL_RESULT,
            "request_data": {"name": call.name, "arguments": _arguments(call.arguments)},
            "target": call.name,
            "data": {"result": reply.output},
        }
        action, reason, _ = await self._verdict(call.session_id, call.runner_id, event)
        if action == DENY:
            self.stats["denied"] += 1
            return _outcome(call, "denied", reason or WITHHELD)
        return outcome

    async def _answer(
        self,
        call: ToolCall,
        outcome: ToolOutcome,
        *,
        held: Deferred | None = None,
        parked: ParkedCall | None = None,
        state_reason: str | None = None,
    ) -> None:
        """Deliver an outcome, then release what it came from (in this order: crash-safe):
        the call ``held`` in flight, or the ``parked`` one and the verdict that resumed it."""
        if call.origin == "mcp":
            assert held is not None  # an mcp call is never parked: the server evaluated it
            await self.peer.reply(held.incoming, outcome)
        else:
            await self.peer.cast(call.reply_to, outcome, durable=True, session_id=call.session_id)
        if parked is not None:
            self.parked.pop(parked.elicitation_id, None)
            state = "cancelled" if outcome.status == "cancelled" else "resolved"
            await self.peer.unpark(parked.incoming.env.id, state, state_reason)
            if parked.verdict is not None:
                parked.verdict.ack()
        elif held is not None:
            held.ack()

    # --- verdicts ----------------------------------------------------------------------------

    async def _verdict(
        self,
        session_id: str,
        runner_id: str | None,
        event: JsonObject,
        hold_key: str | None = None,
    ) -> tuple[str, str | None, bool]:
        """``(action, reason, failed)`` for one evaluation ``event``; no server allows all.

        ``hold_key`` names what is evaluated (a call id, an evaluation id) for the
        elicitation id of a held phase. ``failed`` is true when the server gave no usable
        verdict and the phase failed closed (DENY) or open (ALLOW).
        """
        phase = event["type"]
        server = self._server(runner_id)
        if server is None:
            return ALLOW, None, False
        body: JsonObject = {"event": event}
        if phase in HELD and hold_key is not None:
            body["_omnigent_elicitation_id"] = evaluate_elicitation_id(session_id, hold_key)
        held = phase in HELD
        try:
            answer = await while_unavailable(
                lambda: server.evaluate_policy(session_id, body, held=held),
                what=f"policy evaluation ({phase}) for session {session_id}",
                wait_s=self.options.server_wait_s,
                timeouts=not held,
            )
            action, reason = parse_verdict(answer)
        except Exception as exc:
            if phase in FAIL_CLOSED:
                self.stats["failed_closed"] += 1
                log.warning(
                    "policy evaluation (%s) for session %s failed closed: %s",
                    phase,
                    session_id,
                    exc,
                )
                return DENY, FAILED_CLOSED.get(phase, POLICY_FAILED), True
            log.warning(
                "policy evaluation (%s) for session %s failed; allowing: %s", phase, session_id, exc
            )
            return ALLOW, None, True
        return (ALLOW if action == UNSPECIFIED else action), reason, False

    @handles(PolicyEvaluate)
    async def evaluate(self, msg: PolicyEvaluate, incoming: Incoming) -> None:
        deferred = self.defer(incoming)
        assert self.nursery is not None
        # Registered here, not in the task: a TurnEnded handled next must find it.
        scope = trio.CancelScope()
        self.evaluating.setdefault(msg.session_id, {})[msg.evaluation_id] = scope
        self.nursery.start_soon(self._evaluate, msg, deferred, scope)

    async def _evaluate(
        self, msg: PolicyEvaluate, deferred: Deferred, scope: trio.CancelScope
    ) -> None:
        event = {"type": msg.phase, "data": msg.data}
        with scope:
            try:
                action, reason, failed = await self._verdict(
                    msg.session_id, msg.runner_id, event, msg.evaluation_id
                )
            finally:
                held = self.evaluating.get(msg.session_id, {})
                if held.get(msg.evaluation_id) is scope:
                    del held[msg.evaluation_id]
                    if not held:
                        del self.evaluating[msg.session_id]
        if scope.cancelled_caught:
            # The turn ended (an interrupt while the server held an ASK): nothing waits on
            # the verdict any more, and the held request is closed.
            deferred.ack()
            return
        verdict = PolicyVerdict(
            session_id=msg.session_id,
            evaluation_id=msg.evaluation_id,
            action=f"POLICY_ACTION_{action}",
            reason=reason,
            failed=failed,
        )
        try:
            await self.peer.cast(HARNESS_ACTOR, verdict, durable=True, session_id=msg.session_id)
        except Exception as exc:
            log.warning("could not deliver verdict %s: %s", msg.evaluation_id, exc)
            await deferred.nack(str(exc))
            return
        deferred.ack()

    async def _publish(self, session_id: str, event: JsonObject) -> None:
        await self.peer.cast(
            self.options.dispatch,
            PublishEvents(session_id=session_id, events=[event]),
            durable=True,
            session_id=session_id,
        )


def parse_verdict(answer: Any) -> tuple[str, str | None]:
    """``(ALLOW|DENY|ASK|UNSPECIFIED, reason)`` from a ``/policies/evaluate`` answer.

    Accepts ``{"result": "POLICY_ACTION_ALLOW"}`` (the capture), ``{"action": "deny"}`` and
    an optional ``reason``/``message``.

    Raises:
        PolicyError: the answer names no known action.
    """
    if not isinstance(answer, dict):
        raise PolicyError(f"the answer is not an object: {type(answer).__name__}")
    raw = answer.get("result", answer.get("action"))
    if isinstance(raw, dict):
        raw = raw.get("action")
    if not isinstance(raw, str):
        raise PolicyError("the answer names no action")
    action = raw.upper().removeprefix("POLICY_ACTION_")
    if action not in (ALLOW, DENY, ASK, UNSPECIFIED):
        raise PolicyError(f"unknown action {raw!r}")
    reason = answer.get("reason", answer.get("message"))
    return action, reason if isinstance(reason, str) and reason else None


def evaluate_elicitation_id(session_id: str, key: str) -> str:
    """The ``_omnigent_elicitation_id`` of an evaluation: ``elicit_evaluate_`` + 32 hex, the
    same for every retry of it (§F.1)."""
    digest = hashlib.sha256(f"{session_id}\0{key}".encode()).hexdigest()
    return f"elicit_evaluate_{digest[:32]}"


def _arguments(raw: str) -> JsonObject:
    """A call's arguments as the object policies see (they passed the call gate as one)."""
    try:
        arguments = json.loads(raw or "{}")
    except ValueError:
        return {}
    return arguments if isinstance(arguments, dict) else {}


def _outcome(call: ToolCall, status: Any, message: str) -> ToolOutcome:
    return ToolOutcome(
        session_id=call.session_id,
        turn_id=call.turn_id,
        call_id=call.call_id,
        output=json.dumps({"error": message}),
        status=status,
    )
