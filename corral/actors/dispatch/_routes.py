"""The HTTP surface of dispatch: its route table, and the answers every route shares.

The gateway turns tunnelled requests into :class:`~corral.routes.HttpRequest` messages;
:data:`ROUTES` says, for each method and path pattern, which handler answers and where it
runs — a handler's work must not hold the actor's one-at-a-time message loop:

* ``inline``: answered in the message handler (nothing to wait on);
* ``session``: in the session's queue (after a turn start or an event being handled);
* ``init``: in one queue for every session init;
* ``background``: a task of its own (a tool may run for minutes while the turn goes on).

:func:`match` is the only place a path is cut into segments. ``{name}`` matches one segment;
a trailing or leading ``/`` is ignored. Every error body is the 0.19 shape
``{"error": {"code", "message"}}`` (PROTOCOL_0_19.md §H.2: the server reads ``error.message``).

Every session route answers a session bound through another runner id of this host as one it
does not have (:meth:`~._session.SessionRecord.reachable_by`, :func:`corral.routes.no_session`);
``GET /runner/sessions/{id}`` tells the gateway which id bound a session, for the routes it and
the tools actor answer (docs/security.md, "Runner isolation").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from ..._exceptions import BadInput
from ...harnesses.protocol import InputAccepted
from ...routes import HttpRequest, HttpResponse, empty_response, json_response

log = logging.getLogger("corral.actors.dispatch")

GENERIC_DETAIL = "Request failed on the runner; see runner logs for details."
#: D-03's answer on a host without a harness actor (the original names its missing part).
NO_HARNESS_DETAIL = (
    "Runner /v1/sessions/{}/events needs a HarnessProcessManager: this host runs no harness "
    "actor ([actors.harness] enabled = false)."
)

Runs = Literal["inline", "session", "init", "background"]


@dataclass(frozen=True, slots=True)
class Route:
    """One row of the route table."""

    method: str
    #: The path, with ``{name}`` for a segment passed to the handler as ``name``.
    pattern: str
    #: The name of the actor's method that answers.
    handler: str
    runs: Runs
    #: Answered 501 on a host that runs no harness actor (D-03).
    needs_harness: bool = False

    @property
    def segments(self) -> tuple[str, ...]:
        return tuple(self.pattern.strip("/").split("/"))


ROUTES: tuple[Route, ...] = (
    Route("POST", "/v1/sessions", "create_session", "init"),
    Route("GET", "/v1/sessions/{session_id}", "get_session", "inline"),
    Route("DELETE", "/v1/sessions/{session_id}", "delete_session", "session"),
    Route("POST", "/v1/sessions/{session_id}/events", "post_event", "session", needs_harness=True),
    Route("POST", "/v1/sessions/{session_id}/mcp/execute", "mcp_execute", "background"),
    # The gateway's question (never a tunnel's: it forwards ``/v1/sessions...`` alone).
    Route("GET", "/runner/sessions/{session_id}", "session_runner", "inline"),
)


def match(routes: tuple[Route, ...], method: str, path: str) -> tuple[Route, dict[str, str]] | None:
    """The route of ``method path`` and the values of its ``{name}`` segments (None: no route)."""
    parts = path.strip("/").split("/")
    for route in routes:
        pattern = route.segments
        if route.method != method or len(pattern) != len(parts):
            continue
        params: dict[str, str] = {}
        for want, got in zip(pattern, parts, strict=True):
            if want.startswith("{") and want.endswith("}"):
                params[want[1:-1]] = got
            elif want != got:
                break
        else:
            return route, params
    return None


def no_route(method: str, path: str) -> HttpResponse:
    return error(404, "not_found", f"no route {method} {path}")


def accepted() -> HttpResponse:
    """The 202 of a message that started a turn (D-08)."""
    return json_response(202, {"status": "accepted", "detail": "Turn started."})


def answer(status: str) -> HttpResponse:
    """The 202 of a message that started a turn (``accepted``) or waits (``buffered``)."""
    if status == "buffered":
        return json_response(
            202, {"status": "buffered", "detail": "Message buffered; active turn will process it."}
        )
    return accepted()


def error(status: int, code: str, message: str) -> HttpResponse:
    """The 0.19 error body (PROTOCOL_0_19.md §H.2): the server reads ``error.message``."""
    return json_response(status, {"error": {"code": code, "message": message}})


def refused(request: HttpRequest, exc: BadInput) -> HttpResponse:
    """The 4xx of a request that broke a rule where it entered, logged once (no traceback)."""
    log.warning("refused %s %s: %d %s: %s", request.method, request.path, exc.status, exc.code, exc)
    return error(exc.status, exc.code, str(exc))


def from_harness(reply: InputAccepted | None) -> HttpResponse:
    """The harness's answer to a control event, passed through (H-01, H-02)."""
    if reply is None:
        return error(502, "harness_forward_failed", GENERIC_DETAIL)
    if reply.status in (204, 304) or reply.error is None:
        return empty_response(reply.status)
    return json_response(reply.status, {"error": reply.error})
