"""The server's answers the session tools read, typed at the boundary, and their errors.

The read-only session and agent tools (:mod:`corral.tools.session_reads`) answer by asking the
session's server for their caller (T-26), with the routes omnigent 0.19.1's own runner uses:
``GET /v1/sessions[/{id}[/child_sessions|/items|/agent[/contents]]]``, ``GET /v1/agents``
and ``GET /v1/runners/{id}/status``. Each answer is decoded here into a Struct holding only
the fields a tool shows, so a server that answers in another shape is one clear error
(:data:`NOT_UNDERSTOOD`), never a ``KeyError`` deep in a projection.

A failed read is :class:`ReadFailed` with the server's status (None when there was no answer);
its message is fixed text that names the tool and the status, never the server's body, its
URL or the runner's credential.
"""

from __future__ import annotations

from typing import Any, TypeVar

import httpx
import msgspec

from .._exceptions import ServerError, ServerProtocolError, ServerRejected
from .._jsonlines import JsonObject
from ..server_client import ServerClient, safe_id
from ._api import ToolContext, ToolError

__all__ = [
    "AgentObject",
    "ChildRow",
    "ItemRow",
    "Page",
    "ReadFailed",
    "RunnerStatus",
    "SessionRow",
    "SessionSnapshot",
    "read",
    "read_bytes",
    "read_or_none",
    "rows",
    "runner_status_path",
    "server_of",
    "session_path",
]

#: A 2xx answer not in the shape the routes have.
NOT_UNDERSTOOD = "{tool}: the server's answer was not understood"
UNREACHABLE = "{tool}: the server could not be reached"
REFUSED = "{tool} returned {status}"

_T = TypeVar("_T")

Timestamp = int | float | str | None


class ReadFailed(ToolError):
    """A read the tool needed failed; ``status`` is the server's (None: no usable answer)."""

    def __init__(self, message: str, *, status: int | None) -> None:
        super().__init__(message)
        self.status = status


class SessionSnapshot(msgspec.Struct, kw_only=True):
    """``GET /v1/sessions/{id}``: the fields ``sys_session_get_info`` and the others show."""

    id: str
    status: str | None = None
    title: str | None = None
    agent_id: str | None = None
    agent_name: str | None = None
    runner_id: str | None = None
    host_id: str | None = None
    parent_session_id: str | None = None
    sub_agent_name: str | None = None
    reasoning_effort: str | None = None
    model_override: str | None = None
    llm_model: str | None = None
    workspace: str | None = None
    git_branch: str | None = None
    updated_at: Timestamp = None
    labels: dict[str, Any] | None = None
    #: The parked ``response.elicitation_request`` events, as the server stores them.
    pending_elicitations: list[JsonObject] | None = None


class ChildRow(msgspec.Struct, kw_only=True):
    """One row of ``GET /v1/sessions/{id}/child_sessions``."""

    id: str
    title: str | None = None
    tool: str | None = None
    session_name: str | None = None
    labels: dict[str, Any] | None = None


class SessionRow(msgspec.Struct, kw_only=True):
    """One row of ``GET /v1/sessions``."""

    id: str
    agent_id: str | None = None
    agent_name: str | None = None
    title: str | None = None
    status: str | None = None
    runner_id: str | None = None
    parent_session_id: str | None = None


class AgentObject(msgspec.Struct, kw_only=True):
    """``GET /v1/sessions/{id}/agent`` and a row of ``GET /v1/agents``."""

    id: str
    name: str | None = None
    version: int | str | None = None
    description: str | None = None
    harness: str | None = None
    mcp_servers: list[Any] | None = None
    policies: list[Any] | None = None


class ItemRow(msgspec.Struct, kw_only=True):
    """One item of ``GET /v1/sessions/{id}/items`` (the fields a history shows)."""

    type: str | None = None
    role: str | None = None
    name: str | None = None
    arguments: Any = None
    output: Any = None
    content: Any = None


class RunnerStatus(msgspec.Struct, kw_only=True):
    """``GET /v1/runners/{id}/status``."""

    online: bool | None = None


class Page(msgspec.Struct, kw_only=True):
    """A list answer: ``{"object": "list", "data": [...], "has_more", "last_id"}``."""

    data: list[Any]
    has_more: bool = False
    last_id: str | None = None


def server_of(ctx: ToolContext, tool: str) -> ServerClient:
    """The server of the calling session's runner.

    Raises:
        ToolError: the host knows no server for it.
    """
    if ctx.server is None:
        raise ToolError(f"{tool} requires server access")
    return ctx.server


def session_path(session_id: str) -> str:
    """``/v1/sessions/{id}`` for an id that is safe in a URL.

    Raises:
        ToolError: it is not (the id is not echoed).
    """
    return f"/v1/sessions/{_segment(session_id, 'session_id')}"


def runner_status_path(runner_id: str) -> str:
    """``/v1/runners/{id}/status``.

    Raises:
        ToolError: the id is not safe in a URL.
    """
    return f"/v1/runners/{_segment(runner_id, 'runner_id')}/status"


def _segment(value: str, what: str) -> str:
    try:
        return safe_id(value, what)
    except ValueError as exc:
        raise ToolError(str(exc)) from None


async def read(
    server: ServerClient,
    tool: str,
    path: str,
    shape: type[_T],
    params: dict[str, str] | None = None,
) -> _T:
    """``GET path`` decoded as ``shape``.

    Raises:
        ReadFailed: an error status (``status`` set), no answer, or an answer not in
            ``shape`` (``status`` None).
    """
    try:
        body = await server.read(path, params)
        return msgspec.convert(body, shape)
    except ServerRejected as exc:
        status = exc.status or 0
        raise ReadFailed(REFUSED.format(tool=tool, status=status), status=status) from None
    except (ServerProtocolError, msgspec.ValidationError):
        raise ReadFailed(NOT_UNDERSTOOD.format(tool=tool), status=None) from None
    except ServerError:
        raise ReadFailed(UNREACHABLE.format(tool=tool), status=None) from None


async def read_bytes(
    server: ServerClient, tool: str, path: str, max_bytes: int
) -> tuple[bytes, httpx.Headers]:
    """``GET path``: the raw answer and its headers.

    Raises:
        ReadFailed: as :func:`read`.
    """
    try:
        return await server.read_bytes(path, max_bytes=max_bytes)
    except ServerRejected as exc:
        status = exc.status or 0
        raise ReadFailed(REFUSED.format(tool=tool, status=status), status=status) from None
    except ServerProtocolError:
        raise ReadFailed(NOT_UNDERSTOOD.format(tool=tool), status=None) from None
    except ServerError:
        raise ReadFailed(UNREACHABLE.format(tool=tool), status=None) from None


async def read_or_none(
    server: ServerClient,
    tool: str,
    path: str,
    shape: type[_T],
    params: dict[str, str] | None = None,
) -> _T | None:
    """:func:`read`, or None when it failed: for the parts of an answer that degrade."""
    try:
        return await read(server, tool, path, shape, params)
    except ReadFailed:
        return None


def rows(page: Page | None, shape: type[_T]) -> list[_T] | None:
    """A page's rows as ``shape``; None when there is no page or a row is not in shape."""
    if page is None:
        return None
    try:
        return msgspec.convert(page.data, list[shape])  # type: ignore[valid-type]
    except msgspec.ValidationError:
        return None
