"""A session's events: what clients and the runner post into it, and the stream clients read.

==================================================  ======  ===================================
``POST /v1/sessions/{id}/events``                   any     by type: the runner's
                                                            ``external_conversation_item``
                                                            (§iii.10); either's ``message``
                                                            (the runner's to a child it
                                                            drives); a client's ``approval``,
                                                            ``interrupt``, ``stop_session``,
                                                            ``compact``
``POST .../elicitations/{eid}/resolve``             client  a verdict on a pending approval
``GET .../stream``                                  client  the events as SSE, resumable by
                                                            ``Last-Event-ID`` or ``?after=``
==================================================  ======  ===================================

Posted events are answered 202. A message and a verdict are stored before the answer and
forwarded to the runner from the outbox; a control event is forwarded at once, never queued
(:meth:`ControlPlane.control` says why). The stream ends once the client token it was opened
with is rotated, so a revoked credential does not keep reading.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Mapping
from typing import Annotated, Literal

import msgspec
import trio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from .._jsonlines import JsonObject
from ._endpoint import Api, convert, endpoint, idempotency_key
from ._plane import Refused

__all__ = ["events", "resolve", "stream"]

_SSE_HEADERS = {
    "cache-control": "no-cache",
    "x-accel-buffering": "no",
}
_CONTROL_EVENTS = ("interrupt", "stop_session", "compact")


class MessageData(msgspec.Struct, kw_only=True):
    """``data`` of a ``message`` event."""

    content: Annotated[str, msgspec.Meta(min_length=1)] | list[JsonObject]
    role: Literal["user"] = "user"


class Verdict(msgspec.Struct, kw_only=True):
    """``POST .../elicitations/{eid}/resolve``."""

    action: Literal["accept", "decline", "cancel"]
    content: JsonObject | None = None


class ApprovalData(Verdict, kw_only=True):
    """``data`` of an ``approval`` event."""

    elicitation_id: Annotated[str, msgspec.Meta(min_length=1)]


@endpoint("any")
async def events(api: Api, request: Request) -> Response:
    """``POST .../events``: client events, and the runner's ``external_conversation_item``."""
    is_runner = request.state.caller == "runner"
    limit = api.options.runner_max_body_bytes if is_runner else None
    raw = await api.json(request, limit)
    if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
        raise Refused(422, "invalid_request", "An event is an object with a string 'type'.")
    kind = raw["type"]
    # The runner posts its own items, and messages to the sessions it drives (a child's
    # first message, a parent's wake, PROTOCOL_0_19 §J.4, §J.7); verdicts are a client's, and
    # so are controls but to a child session, which the runner stops for its parent
    # (``sys_cancel_task``).
    row = await api.plane.session(request.path_params["session_id"])
    cancel = is_runner and kind in _CONTROL_EVENTS and row.parent_session_id is not None
    if kind == "external_conversation_item":
        api.require(request, "runner")
    elif kind != "message" and not cancel:
        api.require(request, "client")
    data = raw.get("data", {})
    answer: Mapping[str, object]
    if kind == "external_conversation_item":
        answer = await api.plane.add_runner_item(row, data)
    elif kind == "message":
        message = convert(data, MessageData)
        key = idempotency_key(request)
        answer = await api.plane.post_message(row, _content_blocks(message.content), key)
    elif kind == "approval":
        approval = convert(data, ApprovalData)
        answer = await api.plane.resolve(
            row, approval.elicitation_id, approval.action, approval.content
        )
    elif kind in _CONTROL_EVENTS:
        answer = await api.plane.control(row, kind)
    else:
        known = ", ".join(("message", "approval", *_CONTROL_EVENTS))
        raise Refused(422, "unknown_event_type", f"Unknown event type {kind!r} (known: {known}).")
    return JSONResponse(answer, status_code=202)


@endpoint("client")
async def resolve(api: Api, request: Request) -> Response:
    """``POST .../elicitations/{eid}/resolve``."""
    raw = await api.json(request)
    row = await api.plane.session(request.path_params["session_id"])
    verdict = convert(raw, Verdict)
    answer = await api.plane.resolve(
        row, request.path_params["elicitation_id"], verdict.action, verdict.content
    )
    return JSONResponse(answer, status_code=202)


@endpoint("client")
async def stream(api: Api, request: Request) -> Response:
    """``GET .../stream``: the session's events as SSE, resumable by event id."""
    row = await api.plane.session(request.path_params["session_id"])
    cursor_text = request.headers.get("last-event-id") or request.query_params.get("after")
    if cursor_text is None:
        cursor = row.last_event_id  # only new events
    elif re.fullmatch(r"\d{1,18}", cursor_text.strip()):
        cursor = int(cursor_text)
    else:
        raise Refused(
            400, "invalid_cursor", "Last-Event-ID / after must be an event id (an integer)."
        )
    return StreamingResponse(
        _sse(api, row.id, cursor, _bearer(request)),
        media_type="text/event-stream; charset=utf-8",
        headers=_SSE_HEADERS,
    )


async def _sse(api: Api, session_id: str, cursor: int, credential: str) -> AsyncIterator[str]:
    """Stored events after ``cursor`` in order, then live ones; keepalives in silences.

    The stream ends once ``credential`` is no longer the client token (it was rotated).
    """
    plane = api.plane
    while (
        not plane.closing.is_set()
        and session_id not in plane.deleted
        and plane.client_token.matches(credential)
    ):
        changed = plane.changed(session_id)  # before reading: no append slips between
        rows = await plane.store.events_after(session_id, cursor, 500)
        if rows:
            frames = []
            for seq, kind, data in rows:
                frames.append(f"id: {seq}\nevent: {kind}\ndata: {data}\n\n")
                cursor = seq
            yield "".join(frames)
            continue
        with trio.move_on_after(api.options.keepalive_s) as waited:
            await changed.wait()
        if waited.cancelled_caught:
            yield ": keepalive\n\n"


def _bearer(request: Request) -> str:
    """The bearer credential of a request that passed :meth:`Api.authenticate`."""
    return request.headers.get("authorization", "").partition(" ")[2].strip()


def _content_blocks(content: str | list[JsonObject]) -> list[JsonObject]:
    """A message's content as a list of blocks (a plain string is one ``input_text``)."""
    if isinstance(content, str):
        return [{"type": "input_text", "text": content}]
    if not content:
        raise Refused(422, "invalid_request", "content must not be empty.")
    for i, block in enumerate(content):
        if not isinstance(block.get("type"), str):
            raise Refused(422, "invalid_request", f"content[{i}] needs a string 'type'.")
    return content
