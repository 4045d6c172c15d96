"""The runner's own HTTP calls to its server (PROTOCOL_FACTS §iii), besides the session reads
it shares with clients.

=======================================  ===================================================
``POST /v1/runners/{id}/token``          §iii.1: refused, as a header-token server does
``GET /v1/sessions/{id}/agent/contents`` §iii.3: the agent's bundle (gzip)
``POST .../policies/evaluate``           §iii.8: a policy verdict on a phase of a turn
``POST .../mcp``                         §iii.9: a JSON-RPC ``tools/call``
=======================================  ===================================================

Each is the runner's only (its tunnel token header). Their bodies may be larger than a
client's, up to ``PlaneOptions.runner_max_body_bytes``: tool outputs can be large.
"""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .._jsonlines import JsonObject
from ._endpoint import Api, SpacedJSON, convert, endpoint

__all__ = ["agent_contents", "evaluate", "mcp", "runner_token"]


class Evaluation(msgspec.Struct, kw_only=True):
    """``event`` of a policy evaluation: the phase, the harness's data and, for a tool
    result, the call it answers (``request_data``, or the tool name as ``target``, §F.2)."""

    type: str
    data: JsonObject | None = None
    request_data: JsonObject | None = None
    target: str | None = None


class EvaluateRequest(msgspec.Struct, kw_only=True):
    """``POST .../policies/evaluate`` (§iii.8)."""

    event: Evaluation


@endpoint("runner")
async def runner_token(api: Api, request: Request) -> Response:
    """``POST /v1/runners/{id}/token`` (§iii.1)."""
    # As the capture (§iii.1): a header-token server does not mint runner JWTs.
    message = "runner token minting is unsupported in this auth mode"
    return JSONResponse({"error": {"code": "invalid_input", "message": message}}, 400)


@endpoint("runner")
async def agent_contents(api: Api, request: Request) -> Response:
    """``GET .../agent/contents`` (§iii.3): the bundle."""
    row = await api.plane.session(request.path_params["session_id"])
    bundle, headers = await api.plane.agent_bundle(row)
    return Response(bundle, media_type="application/gzip", headers=headers)


@endpoint("runner")
async def evaluate(api: Api, request: Request) -> Response:
    """``POST .../policies/evaluate`` (§iii.8)."""
    raw = await api.json(request, api.options.runner_max_body_bytes)
    row = await api.plane.session(request.path_params["session_id"])
    body = convert(raw, EvaluateRequest)
    event = body.event
    decision = await api.plane.evaluate(
        row, event.type, event.data or {}, event.request_data, event.target
    )
    reason = decision.prompt or decision.reason
    return SpacedJSON({"result": decision.result, "reason": reason})


@endpoint("runner")
async def mcp(api: Api, request: Request) -> Response:
    """``POST .../mcp`` (§iii.9): JSON-RPC ``tools/call``."""
    raw = await api.json(request, api.options.runner_max_body_bytes)
    row = await api.plane.session(request.path_params["session_id"])
    return SpacedJSON(await api.plane.mcp(row, raw))
