"""One turn of the Codex app-server, relayed to the session as the §iv events.

What Codex says, and what the session sees of it:

===========================================  ===============================================
``item/agentMessage/delta``                  ``response.output_text.delta``
``item/reasoning/textDelta``, ``…/summary…``  ``response.reasoning_text.delta``
``item/completed`` ``agentMessage``          the assistant message, whole (its text if no
                                             delta came)
``item/started`` ``commandExecution``        ``function_call`` ``exec_command`` in_progress
``item/completed`` ``commandExecution``      ``function_call`` completed, then its
                                             ``function_call_output`` (``aggregatedOutput``)
``item/…`` ``fileChange``                    the same, as ``apply_patch`` with the changes
``thread/tokenUsage/updated``                the turn's usage
``model/rerouted``                           the serving model (``runtime_model``)
``turn/completed``                           the turn's end: completed, or failed with the
                                             error Codex reports
===========================================  ===============================================

A command or file change Codex asks to run (``item/commandExecution/requestApproval``,
``item/fileChange/requestApproval``) is decided by :func:`corral.harnesses._permission.decide`
— policy, then a person — and answered ``accept`` or ``decline``. A runner tool the model
called (``item/tool/call``: the turn's ``tools`` are the thread's dynamic tools) runs through
:meth:`TurnContext.call_tool`, which shows it as a ``function_call`` (Codex's own
``dynamicToolCall`` item is not shown again). Every other server request is refused with a
JSON-RPC error at once. Each is answered in a task of its own, so the relay goes on reading
meanwhile.
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
from ._rpc import (
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    ApprovalAnswer,
    AppServer,
    CommandApproval,
    Delta,
    ErrorNotice,
    FileChangeApproval,
    ItemEvent,
    ModelRerouted,
    Notification,
    ProtocolError,
    ServerRequest,
    ThreadItem,
    Tokens,
    TokenUsageUpdated,
    ToolAnswer,
    ToolCall,
    TurnInfo,
    TurnStarted,
    params_as,
)

log = logging.getLogger("corral.harnesses.codex")

COMMAND_APPROVAL = "item/commandExecution/requestApproval"
FILE_CHANGE_APPROVAL = "item/fileChange/requestApproval"
APPROVALS = (COMMAND_APPROVAL, FILE_CHANGE_APPROVAL)
#: The model called one of the runner's tools (Codex's dynamic tools).
TOOL_CALL = "item/tool/call"
#: The tool names the session's transcript shows for Codex's own tools.
SHELL_TOOL = "exec_command"
PATCH_TOOL = "apply_patch"


@dataclass
class Usage:
    """The thread's token totals, which Codex reports after each model call."""

    #: The thread's totals before this turn (None: not known in this process).
    before: Tokens | None = None
    #: The latest totals.
    now: Tokens | None = None


@dataclass
class Relay:
    """Relays one Codex turn to ``turn``; :meth:`run` returns how Codex ended it."""

    turn: TurnContext
    server: AppServer
    served: str
    provider: str
    usage: Usage
    idle_timeout_s: float
    #: The runner tools this turn offers (by name): what ``item/tool/call`` may run.
    tools: frozenset[str] = frozenset()
    #: Codex's id of this turn, once known.
    codex_turn: str | None = None
    #: Whether Codex may be running this turn: asked to start it, and not seen to end it.
    outstanding: bool = False
    #: Server requests being answered: no idle deadline meanwhile (a person, a runner tool
    #: may take long).
    asking: int = 0
    _idle: trio.CancelScope = field(default_factory=trio.CancelScope)
    _streamed: set[str] = field(default_factory=set)
    _started: dict[str, ThreadItem] = field(default_factory=dict)
    _failure: str | None = None

    async def run(
        self,
        events: trio.MemoryReceiveChannel[Notification | ServerRequest],
        nursery: trio.Nursery,
    ) -> TurnInfo:
        """Relay until Codex ends the turn.

        Raises:
            TurnFailed: ``harness_crashed`` (the CLI ended), ``timeout`` (it said nothing
                for ``idle_timeout_s`` while no approval was pending).
        """
        self.turn.serve(self.served, self.provider)
        with self._idle:
            self._heard()
            async for message in events:
                self._heard()
                if isinstance(message, ServerRequest):
                    self._begin_asking()
                    nursery.start_soon(self._answer, message)
                    continue
                try:
                    ended = await self._on(message)
                except ProtocolError:
                    continue
                if ended is not None:
                    return ended
            raise TurnFailed("harness_crashed", f"the codex CLI ended mid-turn: {self._why()}")
        raise TurnFailed(
            "timeout", f"the codex CLI said nothing for {self.idle_timeout_s:g}s (idle_timeout_s)"
        )

    def _why(self) -> str:
        return str(self.server.ended) if self.server.ended else "its output ended"

    def _heard(self) -> None:
        if not self.asking and self.idle_timeout_s:
            self._idle.deadline = trio.current_time() + self.idle_timeout_s

    def _begin_asking(self) -> None:
        self.asking += 1
        self._idle.deadline = math.inf

    def _end_asking(self) -> None:
        self.asking -= 1
        self._heard()

    # --- notifications ----------------------------------------------------------------------

    async def _on(self, message: Notification) -> TurnInfo | None:
        """Relay one notification; the turn's end when it is ``turn/completed`` for it."""
        method = message.method
        if method == "item/agentMessage/delta":
            delta = params_as(message, Delta)
            self._streamed.add(delta.item_id)
            await self.turn.text(delta.delta)
        elif method in ("item/reasoning/textDelta", "item/reasoning/summaryTextDelta"):
            await self.turn.reasoning(params_as(message, Delta).delta)
        elif method == "item/started":
            await self._item_started(params_as(message, ItemEvent).item)
        elif method == "item/completed":
            await self._item_completed(params_as(message, ItemEvent).item)
        elif method == "thread/tokenUsage/updated":
            self._count(params_as(message, TokenUsageUpdated))
        elif method == "model/rerouted":
            self.served = params_as(message, ModelRerouted).to_model
            self.turn.serve(self.served, self.provider)
        elif method == "error":
            notice = params_as(message, ErrorNotice)
            if not notice.will_retry:
                self._failure = notice.error.message
        elif method == "turn/started":
            self.codex_turn = self.codex_turn or params_as(message, TurnStarted).turn.id
        elif method == "turn/completed":
            ended = params_as(message, TurnStarted).turn
            if self.codex_turn is None or ended.id == self.codex_turn:
                self.outstanding = False
                return ended
        return None

    async def _item_started(self, item: ThreadItem) -> None:
        call = _call(item)
        if call is None:
            return
        self._started[item.id] = item
        await self.turn.item({**call, "status": "in_progress"})

    async def _item_completed(self, item: ThreadItem) -> None:
        if item.type == "agentMessage":
            if item.id not in self._streamed and item.text:
                await self.turn.text(item.text)
            await self.turn.end_message()
            return
        call = _call(self._started.pop(item.id, item))
        if call is None:
            return
        await self.turn.item({**call, "status": "completed"})
        await self.turn.item(
            {
                "type": "function_call_output",
                "id": f"fco_{item.id}",
                "call_id": item.id,
                "output": _output(item),
            }
        )

    def _count(self, update: TokenUsageUpdated) -> None:
        total, last = update.token_usage.total, update.token_usage.last
        if self.usage.before is None:
            # The first call of the turn whose totals before it are unknown (a resumed
            # thread): its own figures are what the thread had before it.
            self.usage.before = Tokens(
                total.input_tokens - last.input_tokens,
                total.output_tokens - last.output_tokens,
                total.total_tokens - last.total_tokens,
            )
        self.usage.now = total
        before = self.usage.before
        self.turn.usage = {
            "input_tokens": total.input_tokens - before.input_tokens,
            "output_tokens": total.output_tokens - before.output_tokens,
            "total_tokens": total.total_tokens - before.total_tokens,
            "context_tokens": last.total_tokens,
            "model": self.served,
        }

    def failure(self, ended: TurnInfo) -> str:
        """What to say of a turn Codex ended ``failed``."""
        message = (ended.error.message if ended.error else "") or self._failure or "no reason given"
        message = _provider_message(message)
        info = ended.error.codex_error_info if ended.error else None
        return f"codex: {message}" + (f" ({info})" if isinstance(info, str) and info else "")

    # --- server requests --------------------------------------------------------------------

    async def _answer(self, request: ServerRequest) -> None:
        """Answer one server request (a task of its own): an approval is decided, a runner
        tool is run, anything else is refused."""
        try:
            if request.method == TOOL_CALL:
                await self.server.answer(request, await self._run_tool(request))
                return
            asked = self._question(request)
            if asked is None:
                await self.server.refuse(
                    request, METHOD_NOT_FOUND, f"corral does not answer {request.method}"
                )
                return
            tool, arguments, call_id = asked
            decision = await decide(self.turn, tool=tool, arguments=arguments, call_id=call_id)
            answer = ApprovalAnswer(decision="accept" if decision.allowed else "decline")
            await self.server.answer(request, answer)
        except ProtocolError as exc:
            await self.server.refuse(request, INVALID_PARAMS, str(exc))
        finally:
            self._end_asking()

    async def _run_tool(self, request: ServerRequest) -> ToolAnswer:
        """Run the runner tool Codex's model called, the way every kind runs one
        (:meth:`TurnContext.call_tool`: the call shown, policy, the tools actor)."""
        call = params_as(request, ToolCall)
        if call.tool not in self.tools or not isinstance(call.arguments, dict | None):
            text = f"error: no runner tool {call.tool!r} taking an object of arguments here"
            return ToolAnswer(content_items=[{"type": "inputText", "text": text}], success=False)
        output = await self.turn.call_tool(call.tool, call.arguments or {})
        return ToolAnswer(content_items=[{"type": "inputText", "text": output}], success=True)

    def _question(self, request: ServerRequest) -> tuple[str, dict[str, Any], str] | None:
        """The tool, arguments and call id ``request`` asks about; None for one corral does
        not answer."""
        if request.method == COMMAND_APPROVAL:
            command = params_as(request, CommandApproval)
            arguments = {"command": command.command, "cwd": command.cwd}
            if command.reason:
                arguments["reason"] = command.reason
            return SHELL_TOOL, arguments, command.item_id
        if request.method == FILE_CHANGE_APPROVAL:
            change = params_as(request, FileChangeApproval)
            item = self._started.get(change.item_id)
            patch: dict[str, Any] = {"changes": _changes(item) if item else []}
            if change.reason:
                patch["reason"] = change.reason
            if change.grant_root:
                patch["grant_root"] = change.grant_root
            return PATCH_TOOL, patch, change.item_id
        return None


def _provider_message(message: str) -> str:
    """Codex quotes a provider's error body as it came: OpenAI's JSON error gives its
    ``error.message``; anything else stays as it is."""
    try:
        body = json.loads(message)
    except ValueError:
        return message
    error = body.get("error") if isinstance(body, dict) else None
    found = error.get("message") if isinstance(error, dict) else None
    return found if isinstance(found, str) and found else message


def _call(item: ThreadItem) -> dict[str, Any] | None:
    """The ``function_call`` item (without its status) that shows ``item``; None for an item
    that is not a tool call corral relays."""
    arguments: dict[str, Any]
    if item.type == "commandExecution":
        name, arguments = SHELL_TOOL, {"command": item.command, "cwd": item.cwd}
    elif item.type == "fileChange":
        name, arguments = PATCH_TOOL, {"changes": _changes(item)}
    else:
        return None
    return {
        "type": "function_call",
        "id": f"fc_{item.id}",
        "call_id": item.id,
        "name": name,
        "arguments": json.dumps(arguments, ensure_ascii=False),
    }


def _changes(item: ThreadItem) -> list[dict[str, Any]]:
    return [{"path": c.path, "kind": c.kind.get("type"), "diff": c.diff} for c in item.changes]


def _output(item: ThreadItem) -> str:
    """What the transcript shows as the tool's output."""
    if item.status == "declined":
        return "declined: it was not run"
    if item.type == "fileChange":
        paths = ", ".join(c.path for c in item.changes)
        return f"{item.status or 'completed'}: {paths}"
    output = item.aggregated_output or ""
    if item.exit_code:
        gap = "\n" if output and not output.endswith("\n") else ""
        output += f"{gap}(exit code {item.exit_code})"
    if item.status == "failed" and not output:
        output = "failed"
    return output
