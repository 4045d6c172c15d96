"""The gateway's settings: ``[actors.gateway.options]`` as one frozen Struct."""

from __future__ import annotations

import msgspec

from ..._exceptions import ConfigError
from ...config import Positive, PositiveInt, RunnerSettings


class GatewayOptions(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """``[actors.gateway.options]`` (the top-level ``[[runners]]`` are appended to ``runners``)."""

    runners: list[RunnerSettings] = []
    #: The actor that owns ``/v1/sessions`` routes.
    dispatch: str = "dispatch"
    dispatch_timeout_s: Positive = 60.0
    #: The actor that owns a session's resources (terminals).
    tools: str = "tools"
    #: Deadline of ``POST .../mcp/execute``, which lasts as long as the tool runs.
    tool_timeout_s: Positive = 900.0
    #: A session stream sends ``session.heartbeat`` after this much silence.
    heartbeat_s: Positive = 15.0
    backoff_base_s: Positive = 0.5
    backoff_cap_s: Positive = 10.0
    #: After a server recycle (close 1001/1012, HTTP 502): reconnect after U(min, max) seconds.
    recycle_min_s: Positive = 0.5
    recycle_max_s: Positive = 3.0
    connect_timeout_s: Positive = 10.0
    #: WebSocket-level pings to the server; no pong within the timeout drops the tunnel.
    ping_interval_s: Positive = 30.0
    ping_timeout_s: Positive = 90.0
    #: Incoming frames larger than this (in characters) are refused.
    max_frame_bytes: PositiveInt = 100 * 1024 * 1024
    #: Coalescing: at most this many events / bytes in one ``response.body`` of a stream.
    sse_batch_events: PositiveInt = 64
    sse_batch_bytes: PositiveInt = 256 * 1024
    #: Unconfirmed events kept per session: a full session with an open stream waits for it
    #: (flow control, :meth:`OpenStreams.room`); past it the oldest are dropped (and logged).
    max_buffered_events: PositiveInt = 100_000
    #: On a stream opened with ``Last-Event-ID``, this many events the server's process read
    #: stay in the buffer until a cursor confirms them: it may die before storing them.
    replay_window_events: PositiveInt = 1024
    #: The buffer file is compacted once it is this large and mostly delivered.
    compact_bytes: PositiveInt = 16 * 1024 * 1024
    #: Frames queued for one tunnel's writer before request tasks wait.
    send_queue: PositiveInt = 256
    #: Harness names announced in ``hello`` (default: every registered harness); either way
    #: only those this host can run (:func:`corral.harnesses.availability`).
    harnesses: list[str] | None = None

    def __post_init__(self) -> None:
        # Checked as the options decode, so that ``corral up`` refuses them before anything
        # starts (the host decodes every built-in actor's options), not the gateway crash-looping.
        # A ConfigError passes through msgspec as it is, key and all.
        if self.recycle_min_s > self.recycle_max_s:
            raise ConfigError(
                "invalid gateway options: recycle_min_s is above recycle_max_s",
                key="actors.gateway.options.recycle_min_s",
            )
        if self.max_buffered_events <= self.replay_window_events:
            # A stream keeps that many read events for its server's cursor: a bound at or
            # below it would be full for good, and flow control would wait on it forever.
            raise ConfigError(
                "invalid gateway options: max_buffered_events must be above replay_window_events",
                key="actors.gateway.options.max_buffered_events",
            )
