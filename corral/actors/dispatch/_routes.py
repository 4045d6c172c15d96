"""Answers of the HTTP surface: the 0.19 error body, the 202, a harness's answer passed through."""

from __future__ import annotations

from ...bus import Message
from ...harnesses.protocol import InputAccepted
from ...routes import HttpResponse, empty_response, json_response

GENERIC_DETAIL = "Request failed on the runner; see runner logs for details."
#: D-03's answer on a host without a harness actor (the original names its missing part).
NO_HARNESS_DETAIL = (
    "Runner /v1/sessions/{}/events needs a HarnessProcessManager: this host runs no harness "
    "actor ([actors.harness] enabled = false)."
)


def _accepted() -> HttpResponse:
    return json_response(202, {"status": "accepted", "detail": "Turn started."})


def _error(status: int, code: str, message: str) -> HttpResponse:
    """The 0.19 error body (PROTOCOL_0_19.md §H.2): the server reads ``error.message``."""
    return json_response(status, {"error": {"code": code, "message": message}})


def _from_harness(reply: Message | None) -> HttpResponse:
    """The harness's answer to a control event, passed through (H-01, H-02)."""
    if not isinstance(reply, InputAccepted):
        return _error(502, "harness_forward_failed", GENERIC_DETAIL)
    if reply.status in (204, 304) or reply.error is None:
        return empty_response(reply.status)
    return json_response(reply.status, {"error": reply.error})
