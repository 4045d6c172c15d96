"""The protocol version this server speaks, and the plane's timings and limits."""

from __future__ import annotations

import msgspec

#: The protocol version this server speaks, as ``/api/version`` and ``session_init`` say it
#: (the omnigent release the protocol was traced against, PROTOCOL_0_19.md).
SERVER_VERSION = "0.19.1"


class PlaneOptions(msgspec.Struct, frozen=True, kw_only=True):
    """Timings and limits that are not user settings (tests shorten them)."""

    #: App-level ping to the runner; a tunnel silent for ``ping_timeout_s`` is closed (4003).
    ping_interval_s: float = 30.0
    ping_timeout_s: float = 90.0
    #: Time a new tunnel has to send ``hello``.
    hello_timeout_s: float = 30.0
    #: A client stream sends ``: keepalive`` after this much silence.
    keepalive_s: float = 15.0
    #: A runner stream silent this long is dead (its heartbeats come every 15 s).
    stream_dead_s: float = 45.0
    #: Answer time of tunnelled requests (init, events, delete).
    request_timeout_s: float = 60.0
    #: Answer time of a tool run through ``/mcp/execute``.
    tool_timeout_s: float = 600.0
    #: How long a client's message or verdict waits for the runner's answer before the
    #: request returns ``queued: true`` (the forward stays in the outbox either way).
    deliver_wait_s: float = 15.0
    #: How long ``/mcp`` waits for a runner tunnel to run an approved tool.
    runner_wait_s: float = 30.0
    #: Delivery attempts of one forward that the runner answers with a 5xx.
    max_delivery_attempts: int = 5
    retry_base_s: float = 0.5
    retry_cap_s: float = 10.0
    #: Largest body the runner's own calls may carry (tool outputs can be large).
    runner_max_body_bytes: int = 32 * 1024 * 1024
    #: Time in-flight requests get to finish on shutdown.
    graceful_timeout_s: float = 3.0
