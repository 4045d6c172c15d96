"""One turn of Claude Code, relayed: its output lines become the turn's events.

What Claude Code writes (``--output-format stream-json --verbose --include-partial-messages``,
HARNESS_CLIS.md) and what the turn makes of it:

* ``stream_event`` — the provider's raw Messages API events: ``message_start`` names the
  serving model (``runtime_model`` before its first output); ``text_delta`` and
  ``thinking_delta`` stream as text and reasoning; ``message_delta`` carries the call's usage.
* ``assistant`` — each finished content block: a ``tool_use`` of one of Claude Code's own
  tools becomes a ``function_call`` item ``in_progress``.
* ``user`` — the tool's result: the call ``completed`` and its ``function_call_output``, so
  the server's transcript shows the call (PROTOCOL_0_19 §E.1).
* ``control_request`` — ``can_use_tool`` (may it run a tool?) goes to
  :func:`corral.harnesses._permission.decide` and is answered allow or deny;
  ``mcp_message`` is corral's MCP server (:mod:`._mcp`). Each is handled in a task of its
  own, so two parallel tool calls can wait on two people at once.
* ``system`` ``init`` — the CLI's session id, kept for ``--resume``; ``result`` — the turn's
  end, with its usage or its error.

Lines of a sub-agent (``parent_tool_use_id`` set) stay inside Claude Code.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from .._cli_process import CliError, CliExited
from .._permission import decide
from .._turn import TurnContext, TurnFailed
from . import _mcp
from ._session import START_TIMEOUT_S, ClaudeSession, ControlError, collapsed, save_state
from ._settings import MCP_PREFIX, MCP_SERVER, Settings, mapping

log = logging.getLogger("corral.harnesses.claude")

#: How long an interrupted turn waits for Claude Code to end it before the CLI is ended.
INTERRUPT_GRACE_S = 5.0
INTERRUPTED = "The turn was interrupted."


class Relay:
    """The relay of one turn (see the module docstring)."""

    def __init__(
        self, turn: TurnContext, session: ClaudeSession, settings: Settings, home: Path
    ) -> None:
        self.turn = turn
        self.session = session
        self.settings = settings
        self.home = home
        #: Where control requests are handled: the turn's own nursery, set by :meth:`serving`.
        self.handlers: trio.Nursery | None = None
        #: Claude Code's own tool calls shown in progress, by tool_use id.
        self._calls: dict[str, dict[str, Any]] = {}
        self._running: dict[str, trio.CancelScope] = {}
        self._receive: trio.CancelScope | None = None
        #: The current model call's input tokens (its ``message_start``), and the context
        #: the last call left (input plus output).
        self._call_input = 0
        self._context = 0
        #: Set once the turn is being ended: requests are refused without asking anyone.
        self.stopping = False
        #: Claude Code ended its turn (a result, an interrupt it finished): the CLI can take
        #: the next one, whatever this one's end.
        self.settled = False

    # --- the turn --------------------------------------------------------------------------

    async def control(self, subtype: str, **fields: Any) -> dict[str, Any]:
        """A control request of ours (``initialize``), relaying the CLI's output meanwhile."""
        with collapsed():
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._pump, False, START_TIMEOUT_S)
                answer = await self.session.request(subtype, **fields)
                nursery.cancel_scope.cancel()
        return answer

    async def run(self, content: list[dict[str, Any]]) -> None:
        """Send the user's message and relay until Claude Code's ``result``.

        Raises:
            TurnFailed: the CLI exited or broke its protocol, went silent past
                ``idle_timeout_s``, or its result is an error.
        """
        await self._send(
            {
                "type": "user",
                "message": {"role": "user", "content": content},
                "parent_tool_use_id": None,
                "session_id": "",
            }
        )
        result = await self._pump(True)
        self.settled = True  # its turn is over, whatever its result says
        self._finish(result)

    async def interrupt(self) -> None:
        """End Claude Code's turn (its ``interrupt`` control request) and read up to its
        ``result``; end the CLI when it does not within :data:`INTERRUPT_GRACE_S`."""
        self.stopping = True
        with trio.move_on_after(INTERRUPT_GRACE_S) as grace:
            try:
                with collapsed():
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self.session.request, "interrupt")
                        await self._pump(True)
                        nursery.cancel_scope.cancel()
                self.settled = True
            except (TurnFailed, CliError, ControlError):
                self.session.stop()
        if grace.cancelled_caught:
            log.warning("Claude Code did not end its interrupted turn; ending it")
            self.session.stop()

    # --- reading ---------------------------------------------------------------------------

    async def _pump(self, until_result: bool, silence: float | None = None) -> dict[str, Any]:
        """Relay the CLI's lines; return its ``result`` (or relay forever). ``silence``: how
        long it may write nothing (default ``idle_timeout_s``)."""
        limit = self.settings.idle_limit() if silence is None else silence
        while True:
            with trio.CancelScope(deadline=self._idle_deadline(limit)) as scope:
                self._receive = scope
                try:
                    line = await self.session.cli.receive()
                except CliExited as exc:
                    raise TurnFailed("harness_crashed", f"Claude Code {_tail(exc)}") from exc
                except CliError as exc:
                    raise TurnFailed("harness_error", str(exc)) from exc
                finally:
                    self._receive = None
            if scope.cancelled_caught:
                raise TurnFailed("timeout", f"no output from Claude Code for {limit:g}s")
            if await self._on_line(line) and until_result:
                return line

    def _idle_deadline(self, limit: float) -> float:
        if self._running:  # a person or a runner tool may take any time
            return math.inf
        return trio.current_time() + limit

    async def _on_line(self, line: dict[str, Any]) -> bool:
        """Relay one line; True for the turn's ``result``."""
        kind = line.get("type")
        if self.stopping and kind not in ("control_response", "control_request", "result"):
            return False  # an ended turn streams nothing more
        if kind == "control_response":
            self.session.answered(line)
        elif kind == "control_request":
            await self._on_request(line)
        elif kind == "control_cancel_request":
            scope = self._running.get(str(line.get("request_id")))
            if scope is not None:
                scope.cancel()
        elif kind == "result":
            return True
        elif line.get("parent_tool_use_id"):
            pass  # a sub-agent's work, inside Claude Code
        elif kind == "stream_event" and isinstance(line.get("event"), dict):
            await self._on_event(line["event"])
        elif kind == "assistant":
            await self._on_blocks(line, self._on_tool_use)
        elif kind == "user":
            await self._on_blocks(line, self._on_tool_result)
        elif kind == "system" and line.get("subtype") == "init":
            session_id = line.get("session_id")
            if isinstance(session_id, str) and session_id:
                await trio.to_thread.run_sync(save_state, self.home, session_id)
        elif kind == "system" and line.get("subtype") == "api_retry":
            log.info("Claude Code retries its model call: %.300r", line)
        return False

    async def _on_event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message") or {}
            model = message.get("model")
            if isinstance(model, str) and model:
                self.turn.serve(model, self.settings.provider)
            self._call_input = _input_tokens(message.get("usage"))
        elif kind == "content_block_delta":
            delta = event.get("delta") or {}
            if delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
                await self.turn.text(delta["text"])
            elif delta.get("type") == "thinking_delta" and isinstance(delta.get("thinking"), str):
                await self.turn.reasoning(delta["thinking"])
        elif kind == "message_delta":
            usage = event.get("usage") or {}
            self._call_input = _input_tokens(usage) or self._call_input
            self._context = self._call_input + int(usage.get("output_tokens") or 0)

    async def _on_blocks(
        self, line: dict[str, Any], handle: Callable[[dict[str, Any]], Awaitable[None]]
    ) -> None:
        content = (line.get("message") or {}).get("content")
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict):
                await handle(block)

    async def _on_tool_use(self, block: dict[str, Any]) -> None:
        name, call_id = block.get("name"), block.get("id")
        if block.get("type") != "tool_use" or not isinstance(name, str) or not call_id:
            return
        if name.startswith(MCP_PREFIX):
            return  # a runner tool: turn.call_tool shows it
        item = {
            "type": "function_call",
            "id": f"fc_{call_id}",
            "call_id": str(call_id),
            "name": name,
            "arguments": json.dumps(block.get("input") or {}, ensure_ascii=False),
        }
        self._calls[str(call_id)] = item
        await self.turn.item({**item, "status": "in_progress"})

    async def _on_tool_result(self, block: dict[str, Any]) -> None:
        item = self._calls.pop(str(block.get("tool_use_id")), None)
        if block.get("type") != "tool_result" or item is None:
            return
        await self.turn.item({**item, "status": "completed"})
        await self.turn.item(
            {
                "type": "function_call_output",
                "id": f"fco_{item['call_id']}",
                "call_id": item["call_id"],
                "output": _text_of(block.get("content")),
            }
        )

    # --- Claude Code's requests ------------------------------------------------------------

    async def _on_request(self, line: dict[str, Any]) -> None:
        request_id = str(line.get("request_id"))
        request = mapping(line.get("request"))
        if self.stopping or self.handlers is None:
            await self._refuse(request_id, request, INTERRUPTED)
            return
        self._running[request_id] = trio.CancelScope()
        self.handlers.start_soon(self._handle, request_id, request)

    async def _handle(self, request_id: str, request: dict[str, Any]) -> None:
        scope = self._running[request_id]
        answered = False
        try:
            with scope:
                response = await self._decide(request)
                await self._respond(request_id, response)
                answered = True
        except TurnFailed:
            raise
        except Exception as exc:
            log.exception("Claude Code's %s request failed", request.get("subtype"))
            await self._respond(request_id, error=f"{type(exc).__name__}: {exc}")
            answered = True
        finally:
            del self._running[request_id]
            if not answered:  # cancelled: by the CLI, or with the turn
                with (
                    trio.CancelScope(shield=True),
                    trio.move_on_after(2),
                    contextlib.suppress(TurnFailed),
                ):
                    await self._refuse(request_id, request, INTERRUPTED)
            if not self._running and self._receive is not None:
                self._receive.deadline = self._idle_deadline(self.settings.idle_limit())

    async def _decide(self, request: dict[str, Any]) -> dict[str, Any]:
        subtype = request.get("subtype")
        if subtype == "can_use_tool":
            tool, arguments = str(request.get("tool_name")), request.get("input")
            arguments = arguments if isinstance(arguments, dict) else {}
            if tool.startswith(MCP_PREFIX):
                return _allow(arguments)  # the runner's own path decides its tools
            decision = await decide(
                self.turn, tool=tool, arguments=arguments, call_id=request.get("tool_use_id")
            )
            if decision.allowed:
                return _allow(arguments)
            return {"behavior": "deny", "message": decision.reason}
        if subtype == "mcp_message" and request.get("server_name") == MCP_SERVER:
            message = mapping(request.get("message"))
            answer = await _mcp.answer(message, self.settings, self.turn.call_tool)
            return {"mcp_response": answer}
        raise ValueError(f"unsupported control request {subtype!r}")

    async def _refuse(self, request_id: str, request: dict[str, Any], reason: str) -> None:
        if request.get("subtype") == "can_use_tool":
            await self._respond(request_id, {"behavior": "deny", "message": reason})
        else:
            await self._respond(request_id, error=reason)

    async def _respond(
        self, request_id: str, response: dict[str, Any] | None = None, *, error: str = ""
    ) -> None:
        body: dict[str, Any] = {"subtype": "success", "request_id": request_id}
        if response is None:
            body = {"subtype": "error", "request_id": request_id, "error": error}
        else:
            body["response"] = response
        await self._send({"type": "control_response", "response": body})

    async def _send(self, message: dict[str, Any]) -> None:
        try:
            await self.session.cli.send(message)
        except CliExited as exc:
            raise TurnFailed("harness_crashed", f"Claude Code {_tail(exc)}") from exc

    # --- the end ---------------------------------------------------------------------------

    def _finish(self, result: dict[str, Any]) -> None:
        """The turn's usage from ``result``, or its failure."""
        usage = mapping(result.get("usage"))
        inputs, outputs = _input_tokens(usage), int(usage.get("output_tokens") or 0)
        self.turn.usage.update(
            input_tokens=inputs,
            output_tokens=outputs,
            total_tokens=inputs + outputs,
            context_tokens=self._context,
        )
        if result.get("subtype") == "success" and not result.get("is_error"):
            return
        text = result.get("result") or "; ".join(map(str, result.get("errors") or []))
        text = f"Claude Code: {text or result.get('subtype') or 'failed'}"
        status = result.get("api_error_status")
        if status:
            raise TurnFailed(
                "provider_error", f"{text} (HTTP {status} from {self.settings.provider})"
            )
        raise TurnFailed("harness_error", text)


def _allow(arguments: dict[str, Any]) -> dict[str, Any]:
    return {"behavior": "allow", "updatedInput": arguments}


def _input_tokens(usage: Any) -> int:
    """A Messages API usage's input: fresh, cache-created and cache-read tokens."""
    if not isinstance(usage, dict):
        return 0
    keys = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    return sum(int(usage.get(k) or 0) for k in keys)


def _text_of(content: Any) -> str:
    """A ``tool_result``'s content as one string (its text blocks joined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(b.get("text") or "") for b in content if isinstance(b, dict) and "text" in b
        )
    return "" if content is None else json.dumps(content)


def _tail(exc: CliExited) -> str:
    return str(exc).removeprefix("claude ")
