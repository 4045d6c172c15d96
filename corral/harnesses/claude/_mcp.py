"""corral's MCP server inside Claude Code: the runner's tools, over the CLI's control channel.

Claude Code is started with ``--mcp-config`` naming one server of type ``sdk``: it then
speaks MCP (JSON-RPC 2.0) to it through ``control_request {subtype: mcp_message,
server_name, message}`` lines on its stdout, and takes the answer from a ``control_response``
whose ``response`` is ``{mcp_response: <the JSON-RPC answer>}``. No process, socket or port
is added: a ``tools/call`` goes to :meth:`TurnContext.call_tool`, the path every runner tool
takes (the call shown as a ``function_call``, policy, durable tool calls).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import corral

from ._settings import Settings, mapping

#: The MCP revision answered when the client names none.
PROTOCOL_VERSION = "2025-06-18"
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602

#: Runs a runner tool: ``(name, arguments) -> output``.
CallTool = Callable[[str, dict[str, Any]], Awaitable[str]]


async def answer(
    message: dict[str, Any], settings: Settings, call_tool: CallTool
) -> dict[str, Any]:
    """The JSON-RPC answer to ``message`` (for a notification, an empty result: the control
    channel answers every request)."""
    method = message.get("method")
    params = mapping(message.get("params"))
    result: dict[str, Any]
    if not isinstance(method, str):
        return _error(message, INVALID_PARAMS, "not a JSON-RPC request")
    if method == "initialize":
        result = {
            "protocolVersion": params.get("protocolVersion") or PROTOCOL_VERSION,
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": {"name": "corral", "version": corral.__version__},
        }
    elif method.startswith("notifications/") or method == "ping":
        result = {}
    elif method == "tools/list":
        result = {
            "tools": [
                {"name": name, "description": description, "inputSchema": json.loads(schema)}
                for name, description, schema in settings.tools
            ]
        }
    elif method == "tools/call":
        name, arguments = params.get("name"), params.get("arguments") or {}
        if name not in {row[0] for row in settings.tools} or not isinstance(arguments, dict):
            return _error(message, INVALID_PARAMS, f"no tool {name!r} with object arguments")
        output = await call_tool(name, arguments)
        result = {"content": [{"type": "text", "text": output}]}
    else:
        return _error(message, METHOD_NOT_FOUND, f"{method} is not supported")
    return {"jsonrpc": "2.0", "id": message.get("id"), "result": result}


def _error(message: dict[str, Any], code: int, text: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": message.get("id"), "error": {"code": code, "message": text}}
