"""``/v1/runners/{runner_id}/tunnel``: the WebSocket handshake of PROTOCOL_FACTS §i.3, then the
link.

The checks, in order, each with its close code:

* a browser origin other than a loopback page: no accept at all (the upgrade is answered 403);
* no tunnel token, a wrong one, or a runner id not derived from it: 4004 with the reason;
* no ``hello`` within ``hello_timeout_s``, or a frame that is not a valid one: 4001;
* a ``frame_protocol_version`` other than :data:`FRAME_PROTOCOL_VERSION`: 4002.

A runner that passes gets a :class:`RunnerLink`, which the plane runs until the tunnel closes.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import Any

import trio
from starlette.websockets import WebSocket, WebSocketDisconnect

from .._exceptions import BadInput
from .._input import load_json
from .._jsonlines import JsonObject
from ..server_client import runner_id_for_token
from ._endpoint import TOKEN_HEADER, Api, check_origin
from ._plane import Refused
from ._tunnel import FRAME_PROTOCOL_VERSION, RunnerLink

__all__ = ["tunnel"]

log = logging.getLogger("corral.server.http")


async def tunnel(api: Api, ws: WebSocket) -> None:
    """``/v1/runners/{runner_id}/tunnel``: handshake checks of §i.3, then serve the link."""
    try:
        check_origin(ws.headers)
    except Refused:
        log.warning("refused a tunnel from origin %r", ws.headers.get("origin"))
        await ws.close(code=1008)  # before accept: the upgrade is answered 403
        return
    await ws.accept()
    runner_id = ws.path_params["runner_id"]
    token = ws.headers.get(TOKEN_HEADER)
    refusal = None
    if not token:
        refusal = "runner tunnel token is required"
    elif not api.is_runner_token(token):
        refusal = "unauthenticated"
    elif runner_id != runner_id_for_token(token):
        refusal = "runner_id does not match tunnel token"
    if refusal is not None:
        log.warning("refused a tunnel for %r: %s", runner_id, refusal)
        await _close(ws, 4004, refusal)
        return
    hello = await _hello(ws, api.options.hello_timeout_s)
    if hello is None:
        return
    link = RunnerLink(
        ws,
        runner_id,
        hello,
        ping_interval_s=api.options.ping_interval_s,
        ping_timeout_s=api.options.ping_timeout_s,
        on_batch=api.plane.ingest_batch,
    )
    await api.plane.run_link(link)
    await _close(ws, 1000, "")  # a no-op when the tunnel is already closed


async def _hello(ws: WebSocket, timeout_s: float) -> JsonObject | None:
    """The first frame, if it is a valid ``hello``; else the tunnel is closed (4001/4002)."""
    message: Mapping[str, Any] | None = None
    with trio.move_on_after(timeout_s):
        try:
            message = await ws.receive()
        except WebSocketDisconnect:
            return None
    if message is None:
        await _close(ws, 4001, "expected hello frame")
        return None
    if message["type"] == "websocket.disconnect":
        return None
    try:
        frame = load_json((message.get("text") or "").encode(), "the hello frame")
    except BadInput:
        frame = None
    if not isinstance(frame, dict) or frame.get("kind") != "hello":
        await _close(ws, 4001, "expected hello frame")
        return None
    capabilities = frame.get("capabilities", [])
    if not isinstance(capabilities, list) or not all(isinstance(c, str) for c in capabilities):
        # The real server cannot decode such a hello either (§A.2).
        await _close(ws, 4001, "expected hello frame")
        return None
    version = frame.get("frame_protocol_version")
    if version != FRAME_PROTOCOL_VERSION:
        reason = (
            f"frame_protocol_version mismatch: server supports {FRAME_PROTOCOL_VERSION}, "
            f"runner sent {version}"
        )
        await _close(ws, 4002, reason)
        return None
    return frame


async def _close(ws: WebSocket, code: int, reason: str) -> None:
    with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
        await ws.close(code=code, reason=reason)
