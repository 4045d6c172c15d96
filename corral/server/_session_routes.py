"""The routes of a session's record: create it, read it, relabel it, delete it, page its items.

=====================================  ========  ==============================================
``POST /v1/sessions``                  any       a client's new session of an agent
                                                 (``Idempotency-Key`` makes a retry create it
                                                 once); the runner's is a child session
                                                 (``sys_session_create``, ``_session_writes``)
``GET /v1/sessions/{id}``              any       the session's snapshot (§iii.4)
``PATCH /v1/sessions/{id}``            runner    its labels and title (§iii.5)
``DELETE /v1/sessions/{id}``           client    the session, and the runner told (§I.1)
``GET .../items?limit&order&after``    any       a page of its items (§iii.6)
``GET .../labels``                     any       its labels (§iii.7)
=====================================  ========  ==============================================

Listing sessions is one of the session tools' reads (``_discovery.py``).
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ._endpoint import Api, convert, endpoint, idempotency_key, int_param
from ._plane import Refused
from ._session_writes import create_child
from ._store import UnknownCursor

__all__ = [
    "create_session",
    "delete_session",
    "items",
    "labels",
    "patch_session",
    "read_session",
]


class CreateSession(msgspec.Struct, kw_only=True):
    """``POST /v1/sessions``."""

    agent: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    title: Annotated[str, msgspec.Meta(max_length=1000)] | None = None


class SessionPatch(msgspec.Struct, kw_only=True):
    """``PATCH /v1/sessions/{id}`` (the runner's labels)."""

    labels: dict[str, str] | None = None
    title: Annotated[str, msgspec.Meta(max_length=1000)] | None = None


@endpoint("any")
async def create_session(api: Api, request: Request) -> Response:
    """``POST /v1/sessions``: the client's, and the runner's (a child session)."""
    if request.state.caller == "runner":  # sys_session_create's child (_session_writes)
        return await create_child(api, request)
    body = convert(await api.json(request), CreateSession)
    key = idempotency_key(request)
    row = await api.plane.create_session(body.agent, body.title, key)
    return JSONResponse(api.plane.session_object(row), status_code=201)


@endpoint("any")
async def read_session(api: Api, request: Request) -> Response:
    """``GET /v1/sessions/{id}`` (§iii.4; client and runner)."""
    row = await api.plane.session(request.path_params["session_id"])
    return JSONResponse(await api.plane.snapshot(row), headers={"cache-control": "no-store"})


@endpoint("runner")
async def patch_session(api: Api, request: Request) -> Response:
    """``PATCH /v1/sessions/{id}`` (§iii.5): the runner's labels and title."""
    raw = await api.json(request, api.options.runner_max_body_bytes)
    await api.plane.session(request.path_params["session_id"])
    patch = convert(raw, SessionPatch)
    patched = await api.plane.store.patch_session(
        request.path_params["session_id"], patch.labels, patch.title
    )
    if patched is None:
        raise Refused(404, "not_found", "The session is gone.")
    return JSONResponse(await api.plane.snapshot(patched))


@endpoint("client")
async def delete_session(api: Api, request: Request) -> Response:
    """``DELETE /v1/sessions/{id}`` (PROTOCOL_0_19 §I.1)."""
    row = await api.plane.session(request.path_params["session_id"])
    return JSONResponse(await api.plane.delete_session(row))


@endpoint("any")
async def items(api: Api, request: Request) -> Response:
    """``GET .../items?limit&order&after`` (§iii.6)."""
    row = await api.plane.session(request.path_params["session_id"])
    limit = int_param(request, "limit", 20, 1, 100)
    order = request.query_params.get("order", "desc")
    if order not in ("asc", "desc"):
        raise Refused(422, "invalid_request", "order must be 'asc' or 'desc'.")
    after = request.query_params.get("after")
    try:
        page = await api.plane.store.list_items(row.id, limit=limit, order=order, after=after)
    except UnknownCursor:
        raise Refused(400, "invalid_cursor", f"No item {after!r} in this session.") from None
    return JSONResponse(page)


@endpoint("any")
async def labels(api: Api, request: Request) -> Response:
    """``GET .../labels`` (§iii.7)."""
    row = await api.plane.session(request.path_params["session_id"])
    return JSONResponse({"id": row.id, "labels": row.labels}, headers={"cache-control": "no-store"})
