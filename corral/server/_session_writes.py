"""The writes a runner's session tools send, in the shapes of the omnigent 0.19.1 server.

``sys_session_create`` and ``sys_session_share`` (``corral.tools.session_writes``) write
through the session's server; the control plane serves the same routes as the real server,
so the tools send one request whichever server they run against:

=================================================  =============================================
``POST /v1/sessions`` (the runner, JSON)           a child of ``parent_session_id`` from an
                                                   agent of the catalog (``agent_id``);
                                                   ``initial_items`` messages are its first
                                                   turn; 201 with the child's snapshot
``POST /v1/sessions`` (the runner, multipart)      a child from an uploaded ``bundle``, its
                                                   agent its own; ``metadata`` holds
                                                   ``parent_session_id`` and ``title``; 201
                                                   ``{"session_id", "agent_id", "agent_name"}``
``PUT /v1/sessions/{id}/permissions``              ``{"user_id", "level": 1..3}`` stored;
                                                   ``{"user_id", "conversation_id", "level"}``
``GET /v1/sessions/{id}/permissions``              ``{"permissions": [...], "next_cursor"}``
=================================================  =============================================

``GET /v1/sessions/{id}/child_sessions`` lists a session's children (:func:`child_sessions`).
``sys_session_close`` needs no route of its own: it reads snapshots (a child's carries its
``parent_session_id`` and ``root_conversation_id``) and sends the ``PATCH`` the runner's
labels already use; a closed child then leaves its parent's list. A child is bound to the
runner like any session, so its first message is delivered as a client's is.

The share refusals answer the real server's envelope ``{"error": {"code", "message"}}``,
whose message the tool shows the model (S-37). The plane has one user: a grant is kept and
listed, but it opens the session to no one, as there is no one else to open it to.
"""

from __future__ import annotations

import email.parser
import email.policy
import json
import time
from typing import Annotated

import msgspec
import yaml
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .._jsonlines import JsonObject
from ..spec import SpecError, load_bundle, spec_to_dict
from ._children import child_page
from ._children import create_child as create_sub_agent_child
from ._conversation import new_id
from ._endpoint import Api, convert, endpoint
from ._plane import Refused
from ._store import SessionRow

__all__ = [
    "PUBLIC_USER",
    "child_sessions",
    "create_child",
    "parse_form",
    "permissions",
]

PUBLIC_USER = "__public__"
#: The most a ``__public__`` grant may give: read (the real server's default ceiling).
PUBLIC_MAX_LEVEL = 1
#: A title is at most this long (as a client's create).
_TITLE = Annotated[str, msgspec.Meta(max_length=1000)]


class InitialItem(msgspec.Struct, kw_only=True):
    """One of ``initial_items``: ``{"type": "message", "data": {"role", "content"}}``."""

    type: str
    data: JsonObject


class CreateChild(msgspec.Struct, kw_only=True):
    """The runner's JSON ``POST /v1/sessions`` (``sys_session_create``, agent mode)."""

    agent_id: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    parent_session_id: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    title: _TITLE | None = None
    initial_items: list[InitialItem] = []


class BundleMetadata(msgspec.Struct, kw_only=True):
    """The ``metadata`` part of the runner's multipart ``POST /v1/sessions``."""

    parent_session_id: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    title: _TITLE | None = None


class Grant(msgspec.Struct, kw_only=True):
    """``PUT /v1/sessions/{id}/permissions``: 1 read, 2 edit, 3 manage."""

    user_id: Annotated[str, msgspec.Meta(min_length=1, max_length=320)]
    level: Annotated[int, msgspec.Meta(ge=1, le=3)]


def _envelope(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


def parse_form(content_type: str, body: bytes) -> dict[str, tuple[str | None, bytes]]:
    """A ``multipart/form-data`` body's parts: name → (file name or None, bytes).

    Raises:
        Refused: 422 when it is not a multipart body with named parts.
    """
    header = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode()
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(header + body)
    if not message.is_multipart():
        raise Refused(422, "invalid_request", "The body is not multipart/form-data.")
    parts: dict[str, tuple[str | None, bytes]] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        if not isinstance(name, str) or not isinstance(payload, bytes):
            raise Refused(422, "invalid_request", "Every part needs a name and a body.")
        parts[name] = (part.get_filename(), payload)
    return parts


async def _parent(api: Api, parent_id: str) -> SessionRow:
    parent = await api.plane.store.get_session(parent_id)
    if parent is None:
        raise Refused(404, "not_found", f"No session {parent_id!r} to be the parent.")
    return parent


def _child_row(
    api: Api, parent: SessionRow, *, agent: str, agent_id: str, yaml_text: str, title: str | None
) -> SessionRow:
    now = time.time()
    return SessionRow(
        id=new_id(),
        agent=agent,
        agent_id=agent_id,
        agent_yaml=yaml_text,
        runner_id=api.plane.runner_id,
        title=title,
        created_at=now,
        updated_at=now,
        parent_session_id=parent.id,
        root_session_id=parent.root_session_id or parent.id,
    )


async def _store_child(api: Api, row: SessionRow) -> None:
    await api.plane.store.create_session(row)
    api.plane._bind(row.id)


async def create_child(api: Api, request: Request) -> Response:
    """The runner's ``POST /v1/sessions``: a child session, JSON or multipart (S-38, S-39)."""
    limit = api.options.runner_max_body_bytes
    kind = request.headers.get("content-type", "")
    if kind.startswith("multipart/form-data"):
        return await _child_from_bundle(api, parse_form(kind, await api.body(request, limit)))
    raw = await api.json(request, limit)
    if isinstance(raw, dict) and raw.get("sub_agent_name") is not None:
        # sys_session_send's child: the parent's bundle, running one of its sub-agents (§J).
        child = await create_sub_agent_child(api.plane, raw)
        return JSONResponse(await api.plane.snapshot(child), status_code=201)
    body: CreateChild = convert(raw, CreateChild)
    parent = await _parent(api, body.parent_session_id)
    agents = {a.agent_id: a for a in (await api.plane.agents()).values()}
    agent = agents.get(body.agent_id)
    if agent is None:
        raise Refused(404, "not_found", f"No agent {body.agent_id!r}.")
    row = _child_row(
        api, parent, agent=agent.name, agent_id=agent.agent_id, yaml_text=agent.yaml_text,
        title=body.title,
    )  # fmt: skip
    await _store_child(api, row)
    for item in body.initial_items:
        content = item.data.get("content")
        if item.type == "message" and isinstance(content, list) and content:
            await api.plane.post_message(row, content)
    return JSONResponse(await api.plane.snapshot(row), status_code=201)


async def _child_from_bundle(api: Api, parts: dict[str, tuple[str | None, bytes]]) -> Response:
    if "metadata" not in parts or "bundle" not in parts:
        raise Refused(422, "invalid_request", "A bundle create needs 'metadata' and 'bundle'.")
    try:
        raw = json.loads(parts["metadata"][1])
    except ValueError:
        raise Refused(422, "invalid_request", "metadata is not JSON.") from None
    metadata: BundleMetadata = convert(raw, BundleMetadata)
    parent = await _parent(api, metadata.parent_session_id)
    try:
        spec = load_bundle(parts["bundle"][1])
    except SpecError as exc:
        raise Refused(422, "invalid_bundle", str(exc)) from None
    name = spec.name or "agent"
    # The uploaded agent is the child's alone: an id of its own, never a catalog agent's.
    text = yaml.safe_dump(spec_to_dict(spec), sort_keys=False)
    row = _child_row(
        api, parent, agent=name, agent_id=f"ag_{new_id()}", yaml_text=text, title=metadata.title
    )
    await _store_child(api, row)
    answer = {"session_id": row.id, "agent_id": row.agent_id, "agent_name": name}
    return JSONResponse(answer, status_code=201)


@endpoint("any")
async def child_sessions(api: Api, request: Request) -> Response:
    """``GET .../child_sessions``: the session's open children, a closed one left out as the
    real server leaves out an archived one (a named send then makes a fresh child)."""
    page = await child_page(api.plane, request.path_params["session_id"], request.query_params)
    return JSONResponse(page)


@endpoint("any")
async def permissions(api: Api, request: Request) -> Response:
    """``PUT .../permissions`` (a grant) and ``GET .../permissions`` (the grants)."""
    row = await api.plane.session(request.path_params["session_id"])
    if request.method == "GET":
        grants = await api.plane.store.grants(row.id)
        data = [{"user_id": u, "conversation_id": row.id, "level": lv} for u, lv in grants]
        return JSONResponse({"permissions": data, "next_cursor": None})
    raw = await api.json(request, api.options.runner_max_body_bytes)
    try:
        grant = msgspec.convert(raw, Grant)
    except msgspec.ValidationError as exc:
        return _envelope(422, "invalid_input", str(exc).replace("`", ""))
    if grant.user_id == PUBLIC_USER and grant.level > PUBLIC_MAX_LEVEL:
        message = f"Public access is limited to read (level {PUBLIC_MAX_LEVEL})"
        return _envelope(400, "invalid_input", message)
    await api.plane.store.grant(row.id, grant.user_id, grant.level)
    return JSONResponse({"user_id": grant.user_id, "conversation_id": row.id, "level": grant.level})
