"""One pi run, relayed to the session as the §iv events.

What pi says, and what the session sees of it:

=================================  ==========================================================
``message_update`` ``text_delta``  ``response.output_text.delta``
``…`` ``thinking_delta``           ``response.reasoning_text.delta``
``message_end`` (assistant)        the assistant message, whole (its text if no delta came);
                                   its usage counted, its model the serving one
``tool_execution_start``           ``function_call`` (pi's tool name) in_progress
``tool_execution_end``             ``function_call`` completed, then its
                                   ``function_call_output`` (the result's text)
``auto_retry_start``               ``response.retry``
``agent_settled``                  the run's end: completed, or failed with the provider's
                                   error when its last model call failed
=================================  ==========================================================

Every call of pi's own tools reaches corral before it runs, as the gate extension's
``extension_ui_request`` ``confirm`` (``_home.py``): it is decided by
:func:`corral.harnesses._permission.decide` — policy, then a person, except for pi's
read-only tools (:data:`READ_ONLY`), which policy alone decides — and answered
``confirmed`` true or false. A call of one of the runner's tools arrives as the extension's
``input`` request: it runs through :meth:`TurnContext.call_tool` (the call shown, the
runner's policy, dispatch), which shows it, so pi's ``tool_execution_*`` of it are not shown
again; the answer is its output. Each is answered in a task of its own, so the relay goes on
reading meanwhile. Any other dialog an extension opens is dismissed at once.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from typing import Any

import trio

from .._permission import decide
from .._turn import TurnContext, TurnFailed
from ._home import GATE_TITLE, TOOL_TITLE
from ._rpc import (
    DIALOGS,
    MessageEvent,
    MessageUpdate,
    PiRpc,
    ProtocolError,
    RetryStart,
    Settled,
    ToolExecution,
    UiRequest,
    event_as,
)

log = logging.getLogger("corral.harnesses.pi")

#: pi's tools that change nothing: policy decides them, no person is asked.
READ_ONLY = frozenset({"read", "grep", "find", "ls"})


@dataclass
class Relay:
    """Relays one pi run to ``turn``; :meth:`run` returns how pi settled it."""

    turn: TurnContext
    rpc: PiRpc
    served: str
    provider: str
    idle_timeout_s: float
    #: The runner's tools pi was given (by name): their calls are the runner's to show.
    tools: frozenset[str] = frozenset()
    #: Whether pi may be running this turn: its prompt sent, and no ``agent_settled`` seen.
    outstanding: bool = False
    #: Whether pi took the prompt: its silence counts from then (its start does not).
    taken: bool = False
    #: The gate's questions not answered yet (an interrupt dismisses them).
    questions: dict[str, UiRequest] = field(default_factory=dict)
    #: The last model call's error, when it failed (a later success clears it).
    failure: str | None = None
    _idle: trio.CancelScope = field(default_factory=trio.CancelScope)
    _streamed: bool = False
    _started: dict[str, dict[str, Any]] = field(default_factory=dict)
    _tokens: dict[str, int] = field(default_factory=dict)

    async def run(
        self, events: trio.MemoryReceiveChannel[dict[str, Any]], nursery: trio.Nursery
    ) -> Settled:
        """Relay until pi settles.

        Raises:
            TurnFailed: ``harness_crashed`` (the CLI ended; ``harness_unavailable`` if it
                never answered: it did not start), ``timeout`` (it said nothing
                for ``idle_timeout_s`` after taking the prompt while no question was out).
        """
        self.turn.serve(self.served, self.provider)
        with self._idle:
            self._heard()
            async for event in events:
                self._heard()
                try:
                    if event.get("type") == "extension_ui_request":
                        await self._asked(event_as(event, UiRequest), nursery)
                        continue
                    settled = await self._on(event)
                except ProtocolError:
                    continue
                if settled is not None:
                    return settled
            why = self.rpc.ended or "its output ended"
            if not self.rpc.answered:
                raise TurnFailed("harness_unavailable", f"the pi CLI ended: {why}")
            raise TurnFailed("harness_crashed", f"the pi CLI ended mid-turn: {why}")
        raise TurnFailed(
            "timeout", f"the pi CLI said nothing for {self.idle_timeout_s:g}s (idle_timeout_s)"
        )

    def took(self) -> None:
        """pi answered the prompt: from now on its silence is counted."""
        self.taken = True
        self._heard()

    def _heard(self) -> None:
        if self.taken and not self.questions and self.idle_timeout_s:
            self._idle.deadline = trio.current_time() + self.idle_timeout_s

    # --- events ---------------------------------------------------------------------------

    async def _on(self, event: dict[str, Any]) -> Settled | None:
        """Relay one event; pi's settling when it is ``agent_settled``."""
        kind = event.get("type")
        if kind == "message_update":
            update = event_as(event, MessageUpdate).assistant_message_event
            if update.type == "text_delta" and update.delta:
                self._streamed = True
                await self.turn.text(update.delta)
            elif update.type == "thinking_delta" and update.delta:
                await self.turn.reasoning(update.delta)
        elif kind == "message_end":
            await self._message_end(event_as(event, MessageEvent))
        elif kind in ("tool_execution_start", "tool_execution_end") and (
            event.get("toolName") in self.tools
        ):
            return None
        elif kind == "tool_execution_start":
            call = event_as(event, ToolExecution)
            item = _call(call)
            self._started[call.tool_call_id] = item
            await self.turn.item({**item, "status": "in_progress"})
        elif kind == "tool_execution_end":
            call = event_as(event, ToolExecution)
            item = self._started.pop(call.tool_call_id, {}) or _call(call)
            await self.turn.item({**item, "status": "completed"})
            await self.turn.item(
                {
                    "type": "function_call_output",
                    "id": f"fco_{call.tool_call_id}",
                    "call_id": call.tool_call_id,
                    "output": _output(call),
                }
            )
        elif kind == "auto_retry_start":
            retry = event_as(event, RetryStart)
            await self.turn.retry(
                retry.attempt, retry.max_attempts, retry.delay_ms / 1000, retry.error_message
            )
        elif kind == "extension_error":
            log.warning("pi's gate extension failed (its call is blocked): %.500r", event)
        elif kind == "agent_settled":
            self.outstanding = False
            return event_as(event, Settled)
        return None

    async def _message_end(self, event: MessageEvent) -> None:
        message = event.message
        if message.role != "assistant":
            return
        if not self._streamed:
            text = "".join(
                str(p.get("text") or "")
                for p in message.content or []
                if isinstance(p, dict) and p.get("type") == "text"
            )
            if text:
                await self.turn.text(text)
        self._streamed = False
        await self.turn.end_message()
        served = message.response_model or message.model
        if served and served != self.served:
            self.served = served
            self.turn.serve(served, self.provider)
        if message.stop_reason == "error":
            self.failure = message.error_message or "the model call failed"
        elif message.stop_reason != "aborted":
            self.failure = None
        if message.usage is not None:
            self._count(message.usage.input, message.usage.output, message.usage.total_tokens)

    def _count(self, input_tokens: int, output_tokens: int, total: int) -> None:
        """Add one model call's figures to the turn's usage."""
        tokens = self._tokens
        tokens["input_tokens"] = tokens.get("input_tokens", 0) + input_tokens
        tokens["output_tokens"] = tokens.get("output_tokens", 0) + output_tokens
        tokens["total_tokens"] = tokens.get("total_tokens", 0) + total
        self.turn.usage = {**tokens, "context_tokens": total, "model": self.served}

    # --- the gate's questions -------------------------------------------------------------

    async def _asked(self, request: UiRequest, nursery: trio.Nursery) -> None:
        if request.method == "confirm" and request.title == GATE_TITLE:
            self.questions[request.id] = request
            self._idle.deadline = math.inf
            nursery.start_soon(self._decide, request)
        elif request.method == "input" and request.title == TOOL_TITLE:
            self.questions[request.id] = request
            self._idle.deadline = math.inf
            nursery.start_soon(self._run_tool, request)
        elif request.method in DIALOGS:
            await self.rpc.answer(request, cancelled=True)

    async def _decide(self, request: UiRequest) -> None:
        """Decide one tool call pi asks about (a task of its own) and answer it."""
        try:
            call = json.loads(request.message)
            tool, call_id = str(call["tool"]), str(call["call_id"])
            arguments = call.get("input")
            arguments = arguments if isinstance(arguments, dict) else {"input": arguments}
        except (ValueError, KeyError, TypeError):
            log.warning("pi's gate asked about a call corral cannot read: %.300r", request.message)
            allowed = False
        else:
            decision = await decide(
                self.turn,
                tool=tool,
                arguments=arguments,
                call_id=call_id,
                ask_person=tool not in READ_ONLY,
            )
            allowed = decision.allowed
        if self.questions.pop(request.id, None) is not None:
            await self.rpc.answer(request, confirmed=allowed)
        self._heard()

    async def _run_tool(self, request: UiRequest) -> None:
        """Run the runner tool pi's model called (a task of its own) and answer with its
        output; a call corral cannot read, or of a tool not offered, is not run."""
        try:
            call = json.loads(request.placeholder)
            tool, arguments = str(call["tool"]), call.get("arguments") or {}
        except (ValueError, KeyError, TypeError):
            tool, arguments = "", None
        if tool in self.tools and isinstance(arguments, dict):
            output = await self.turn.call_tool(tool, arguments)
            answer: dict[str, Any] = {"value": output}
        else:
            log.warning("pi asked to run a runner tool corral cannot: %.300r", request.placeholder)
            answer = {"cancelled": True}
        if self.questions.pop(request.id, None) is not None:
            await self.rpc.answer(request, **answer)
        self._heard()


def _call(call: ToolExecution) -> dict[str, Any]:
    """The ``function_call`` item (without its status) that shows pi's tool call."""
    return {
        "type": "function_call",
        "id": f"fc_{call.tool_call_id}",
        "call_id": call.tool_call_id,
        "name": call.tool_name,
        "arguments": json.dumps(call.args if call.args is not None else {}, ensure_ascii=False),
    }


def _output(call: ToolExecution) -> str:
    """What the transcript shows as the tool's output: the text of its result."""
    result = call.result if isinstance(call.result, dict) else {}
    text = "".join(
        str(p.get("text") or "")
        for p in result.get("content") or []
        if isinstance(p, dict) and p.get("type") == "text"
    )
    if call.is_error and not text:
        return "failed"
    return text
