"""The dispatch actor's options (``[actors.dispatch.options]`` in corral.toml)."""

from __future__ import annotations

from typing import Literal

import msgspec

from ..._jsonlines import JsonObject
from ...config import NonNegative, RunnerSettings
from ...server_wait import SERVER_WAIT_S
from ..policy.messages import POLICY_ACTOR


class DispatchOptions(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """``[actors.dispatch.options]``."""

    #: A server for sessions of any runner (tests; hosts pass ``runners`` instead).
    server_url: str | None = None
    token: str | None = None
    #: The host's runners (ids resolved): a session talks to the server of its runner.
    runners: list[RunnerSettings] = []
    default_harness: str = "scripted"
    #: False when this host runs no harness actor: the events route answers 501 (D-03).
    #: The host sets it from its plan.
    harness_actor: bool = True
    #: The agent spec of sessions when no server is configured (the "null server client").
    default_spec: JsonObject = {}
    subscribers: list[str] = msgspec.field(default_factory=lambda: ["gateway"])
    #: The actor that gates tool calls (None: tool calls answer "not available").
    policy: str | None = POLICY_ACTOR
    #: Deadline of ``POST .../mcp/execute`` through policy and tools.
    tool_timeout_s: float = 900.0
    #: The actor owning sessions' terminals, asked to close them when a session is deleted
    #: (None: nothing to close).
    tools: str | None = "tools"
    journal: str | None = "journal"
    #: The shortest time between two rounds of session events to the subscribers: what is
    #: published meanwhile goes in the next. Many sessions at a model's pace otherwise cost
    #: a durable round (a commit, an fsync, a gateway write and its ack) per delta; 5 ms cut
    #: the tree's CPU by 15-20 % at 100 sessions x 10 deltas/s, for 1-2 ms of added latency
    #: (docs/benchmarks.md). 0: a round as soon as the last one is accepted.
    publish_gap_ms: NonNegative = 5.0
    turn_timeout_s: float = 3600.0
    #: How long a turn's setup keeps asking an unavailable server (its agent spec, the
    #: session's history), from the first failure, before the turn fails: the control
    #: plane's restart window, as the policy actor's option of the same name.
    server_wait_s: float = SERVER_WAIT_S
    #: A session with no turn, nothing buffered and nothing queued, unused this long, leaves
    #: memory (its record stays in ``sessions.log`` and is read back on its next use; its
    #: spec and history are fetched again, as after a restart, D-23). 0: never.
    session_idle_s: float = 1800.0
    turn_idle_timeout_s: float = 900.0
    #: Crash tests only: exit at once at this point of a turn, once per data directory —
    #: after a turn's record is saved (``turn_saved``), after its start is with the broker
    #: (``turn_sent``), after its end is saved (``end_saved``), after every receiver has its
    #: end (``edge_delivered``), mid-stream: after taking its worker's event number
    #: ``_stream.CRASH_K`` and before sending it (``streaming``), after a sub-agent's result
    #: is recorded and before it is pushed to its parent's inbox (``subagent_recorded``),
    #: after the push and before the parent is woken (``subagent_pushed``). Empty: never.
    crash_at: Literal[
        "",
        "turn_saved",
        "turn_sent",
        "end_saved",
        "edge_delivered",
        "streaming",
        "subagent_recorded",
        "subagent_pushed",
    ] = ""
