"""The harness actor's protocol: turns in for workers, workers' news out.

The messages themselves are the harness protocol, :mod:`corral.harnesses.protocol`, which
workers import too (they sit below the actors and must not import this package).

Message → reply:
    TurnStart          → InputAccepted  (durable call, from dispatch) start a turn on the
                                        session's worker, spawning it lazily; 409
                                        ``turn_in_flight`` from a busy worker, and the turn
                                        then ends ``response.failed`` ``harness_busy``;
                                        a start for a session whose (stale) turn this
                                        actor still holds waits until that turn ends
                                        (its worker interrupted), then runs
    ToolResult         → InputAccepted  forwarded to the session's worker: 204, or 404
    PolicyVerdict      → InputAccepted  (``no_worker``, ``not_found``), 503
    Interrupt          → InputAccepted  ``worker_unreachable``
    Approval           → InputAccepted  (durable call) a verdict for a parked elicitation →
                                        its worker (E-01..E-03)
    ElicitationParked  → none           (durable, from workers) parked in the broker until a
                                        verdict (or cancellation)
    TerminalOutput     → none           (durable, from workers) a turn's terminal event,
                                        forwarded to its ``reply_to`` from here alone
    WorkerAlive        → none           a worker's heartbeat and busy flag

Besides these, every actor answers :class:`~corral.bus.InspectRequest` with an
:class:`~corral.bus.InspectReply`; a body outside :data:`Inbound` is rejected (dead-lettered)
and a caller gets ``protocol_error``; a handler that raises answers ``handler_error`` and its
durable message is nacked.
"""

from __future__ import annotations

from ...harnesses.protocol import (
    HARNESS_ACTOR,
    Approval,
    ElicitationParked,
    Interrupt,
    PolicyVerdict,
    TerminalOutput,
    ToolResult,
    TurnStart,
    WorkerAlive,
)

__all__ = ["HARNESS_ACTOR", "Inbound"]

#: Everything the harness actor handles.
Inbound = (
    TurnStart
    | ToolResult
    | PolicyVerdict
    | Interrupt
    | Approval
    | ElicitationParked
    | TerminalOutput
    | WorkerAlive
)
