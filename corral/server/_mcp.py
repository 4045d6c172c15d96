"""Tool calls through the server: ``POST /v1/sessions/{id}/mcp`` (PROTOCOL_FACTS §iii.9).

The runner executes a harness's tool call by calling this JSON-RPC 2.0 endpoint
(``tools/call``). The ``[[server.policies]]`` rules and the agent's own policies decide, as
for ``/policies/evaluate`` (``_policy.py``):

* allow — the call goes back to the runner over the tunnel (``POST .../mcp/execute``, §ii.9) and
  its output is answered as MCP ``content``;
* deny — an ``isError`` result; nothing runs;
* ask — ``input_required`` with one elicitation, recorded as pending and published to the
  session's clients as ``response.elicitation_request``. Once a verdict arrived (and was
  forwarded to the runner), the runner retries with ``requestState`` and ``inputResponses``:
  accept runs the call, decline or cancel is an ``isError`` result.

An approval covers exactly the call that was shown (same name and arguments) and runs it once.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import TYPE_CHECKING, Any, Literal, NotRequired, TypedDict

import msgspec

from .._jsonlines import JsonObject
from ._policy import TOOL_CALL, Decision
from ._store import SessionRow
from ._tunnel import RunnerGone

if TYPE_CHECKING:
    from ._plane import ControlPlane

__all__ = ["ToolCalls", "error_detail"]

log = logging.getLogger("corral.server")

_encode = msgspec.json.Encoder().encode


class TextContent(TypedDict):
    """A text block of a tool result."""

    type: Literal["text"]
    text: str


class ToolResult(TypedDict):
    """A ``tools/call`` result: the output as text; ``isError`` for a call that did not run."""

    content: list[TextContent]
    isError: NotRequired[bool]


class InputRequired(TypedDict):
    """A ``tools/call`` result that waits for a person's verdict (MCP elicitation)."""

    resultType: Literal["input_required"]
    inputRequests: JsonObject
    requestState: str


class RpcResult(TypedDict):
    """A JSON-RPC 2.0 result."""

    jsonrpc: Literal["2.0"]
    id: Any
    result: ToolResult | InputRequired


class RpcFault(TypedDict):
    """The ``error`` of a JSON-RPC 2.0 error answer."""

    code: int
    message: str


class RpcError(TypedDict):
    """A JSON-RPC 2.0 error answer."""

    jsonrpc: Literal["2.0"]
    id: Any
    error: RpcFault


#: The answer to one JSON-RPC request.
RpcAnswer = RpcResult | RpcError


class ToolCalls:
    """The ``/mcp`` endpoint of one control plane."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane

    async def handle(self, row: SessionRow, rpc: Any) -> RpcAnswer:
        """``POST /mcp`` (§iii.9): one JSON-RPC 2.0 request → its answer."""
        if not isinstance(rpc, dict) or rpc.get("jsonrpc") != "2.0":
            return _rpc_error(None, -32600, "Invalid Request: expected a JSON-RPC 2.0 object")
        rpc_id = rpc.get("id")
        if rpc.get("method") != "tools/call":
            return _rpc_error(rpc_id, -32601, f"Method not found: {rpc.get('method')!r}")
        params = rpc.get("params")
        if not isinstance(params, dict):
            return _rpc_error(rpc_id, -32602, "Invalid params: expected an object")
        name, arguments = params.get("name"), params.get("arguments") or {}
        if not isinstance(name, str) or not name or not isinstance(arguments, dict):
            return _rpc_error(
                rpc_id, -32602, "Invalid params: name (string) and arguments (object)"
            )
        if "inputResponses" in params or "requestState" in params:
            return await self._mcp_retry(row, rpc_id, name, arguments, params)
        decision = await self.plane.decide(row, TOOL_CALL, name, arguments)
        if decision.action == "deny":
            log.info("session %s: tool %s denied by policy rule %s", row.id, name, decision.rule)
            text = f"Tool call {name!r} was denied by policy"
            text += f": {decision.reason}" if decision.reason else "."
            return _rpc_result(
                rpc_id, {"content": [{"type": "text", "text": text}], "isError": True}
            )
        if decision.action == "ask":
            return _rpc_result(rpc_id, await self._ask(row, name, arguments, decision))
        return _rpc_result(rpc_id, await self._execute(row, name, arguments))

    async def _ask(
        self, row: SessionRow, name: str, arguments: JsonObject, decision: Decision
    ) -> InputRequired:
        eid = f"elicit_{uuid.uuid4().hex}"
        preview = json.dumps(arguments, ensure_ascii=False)
        if len(preview) > 300:
            preview = preview[:299] + "…"
        message = f"Agent wants to call {name}({preview}). Approve?"
        if decision.prompt:
            message = decision.prompt  # an agent policy's own words (omnigent's format)
        elif decision.reason:
            message = f"{decision.reason}: {message}"
        params = {
            "message": message,
            "requestedSchema": {
                "type": "object",
                "properties": {"approved": {"type": "boolean"}},
                "required": ["approved"],
            },
            "mode": "form",
        }
        event = {
            "type": "response.elicitation_request",
            "elicitation_id": eid,
            "params": params,
            "session_id": row.id,
            "tool": name,
            "arguments": arguments,
        }
        await self.plane.store.add_policy_elicitation(row.id, eid, params, name, arguments, event)
        await self.plane.notify_tree(row.id)
        log.info("session %s: tool %s needs approval (%s)", row.id, name, eid)
        return {
            "resultType": "input_required",
            "inputRequests": {eid: {"method": "elicitation/create", "params": params}},
            "requestState": json.dumps({"elicitation_id": eid, "session_id": row.id}),
        }

    async def _mcp_retry(
        self,
        row: SessionRow,
        rpc_id: Any,
        name: str,
        arguments: JsonObject,
        params: JsonObject,
    ) -> RpcAnswer:
        state = params.get("requestState")
        try:
            state = json.loads(state) if isinstance(state, str) else state
        except ValueError:
            state = None
        eid = state.get("elicitation_id") if isinstance(state, dict) else None
        elicitation = await self.plane.store.get_elicitation(eid) if isinstance(eid, str) else None
        if (
            elicitation is None
            or elicitation.session_id != row.id
            or elicitation.source != "policy"
        ):
            return _rpc_error(rpc_id, -32602, "Invalid params: unknown elicitation in requestState")
        if elicitation.tool != name or _canonical(elicitation.arguments) != _canonical(arguments):
            # An approval covers exactly the call that was shown to the human.
            return _rpc_error(
                rpc_id, -32602, "Invalid params: the call differs from the approved one"
            )
        if elicitation.state == "consumed":
            return _rpc_error(rpc_id, -32602, f"Invalid params: elicitation {eid} was already used")
        responses = params.get("inputResponses")
        given = responses.get(eid) if isinstance(responses, dict) else None
        # The verdict stored here is the authority; the runner's copy is used only for an
        # elicitation the server never saw resolved.
        action = elicitation.action if elicitation.state == "resolved" else None
        if action is None and isinstance(given, dict):
            action = given.get("action")
        if action not in ("accept", "decline", "cancel"):
            return _rpc_error(rpc_id, -32602, f"Invalid params: no verdict for elicitation {eid}")
        await self.plane.store.consume_elicitation(elicitation.id, action)
        if action != "accept":
            log.info("session %s: tool %s %sd by the user", row.id, name, action)
            verb = "declined" if action == "decline" else "cancelled"
            text = f"Tool call {name!r} was {verb} by the user."
            return _rpc_result(
                rpc_id, {"content": [{"type": "text", "text": text}], "isError": True}
            )
        return _rpc_result(rpc_id, await self._execute(row, name, arguments))

    async def _execute(self, row: SessionRow, name: str, arguments: JsonObject) -> ToolResult:
        """Run an allowed tool call on the runner (``POST .../mcp/execute``, §ii.9)."""
        link = await self.plane.wait_link(self.plane.options.runner_wait_s)
        if link is None:
            text = f"Tool {name!r} could not run: the runner is not connected."
            return {"content": [{"type": "text", "text": text}], "isError": True}
        body = _encode({"method": "tools/call", "params": {"name": name, "arguments": arguments}})
        try:
            answer = await link.request(
                "POST",
                f"/v1/sessions/{row.id}/mcp/execute",
                body=body,
                timeout_s=self.plane.options.tool_timeout_s,
            )
        except RunnerGone as exc:
            text = f"Tool {name!r} did not finish: {exc}"
            return {"content": [{"type": "text", "text": text}], "isError": True}
        decoded = answer.json()
        result = decoded.get("result") if isinstance(decoded, dict) else None
        if 200 <= answer.status < 300 and result is not None:
            output = result.get("output") if isinstance(result, dict) else result
            text = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
            wrapped: ToolResult = {"content": [{"type": "text", "text": text}]}
            if isinstance(result, dict) and (result.get("isError") or result.get("is_error")):
                wrapped["isError"] = True
            return wrapped
        detail = error_detail(decoded, answer.body)
        text = f"Tool {name!r} failed on the runner (HTTP {answer.status}): {detail}"
        return {"content": [{"type": "text", "text": text}], "isError": True}


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def error_detail(decoded: Any, raw: bytes) -> str:
    """A short human text from an error answer of the runner."""
    if isinstance(decoded, dict):
        error = decoded.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])[:300]
        if decoded.get("detail"):
            return str(decoded["detail"])[:300]
        if isinstance(error, str):
            return error[:300]
    return raw.decode("utf-8", "replace")[:300] or "(empty answer)"


def _rpc_result(rpc_id: Any, result: ToolResult | InputRequired) -> RpcResult:
    return {"jsonrpc": "2.0", "id": rpc_id, "result": result}


def _rpc_error(rpc_id: Any, code: int, message: str) -> RpcError:
    return {"jsonrpc": "2.0", "id": rpc_id, "error": {"code": code, "message": message}}
