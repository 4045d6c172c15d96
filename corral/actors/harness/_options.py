"""The harness actor's options (``[actors.harness.options]`` in corral.toml)."""

from __future__ import annotations

from typing import Annotated

import msgspec


class HarnessOptions(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """``[actors.harness.options]``."""

    #: A worker with no turn for this long is stopped (0: never). Five minutes: a forked
    #: worker's restart costs a turn tens of milliseconds, its idleness ~7 MB per session
    #: (docs/supervision.md, "How long an idle worker lives").
    idle_timeout_s: float = 300.0
    #: Fork workers from a zygote, a process that has imported the worker runtime
    #: (:mod:`corral._zygote`); False: exec each. Without a zygote (not started yet, dead,
    #: given up on) a worker is exec'd anyway. A forked worker adds ~7 MB PSS and answers its
    #: first turn in ~35 ms, an exec'd one ~18 MB and ~250 ms (docs/benchmarks.md, memory).
    zygote: bool = True
    #: How long a new worker gets to answer its first turn.
    start_timeout_s: float = 15.0
    #: A worker silent this long is dead (default: the bus's liveness window).
    worker_liveness_s: float | None = None
    #: The first pause before a crash-looping harness is spawned again (it doubles, to 10 s).
    crash_backoff_s: Annotated[float, msgspec.Meta(ge=0)] = 0.5
    #: A session's worker restarted (after a crash) more than this many times within
    #: ``worker_period_s`` is given up on: the session's turns fail ``harness_unavailable``
    #: until the oldest of those restarts is ``worker_period_s`` old.
    worker_intensity: Annotated[int, msgspec.Meta(ge=0)] = 10
    worker_period_s: Annotated[float, msgspec.Meta(gt=0)] = 60.0
    #: More harness kinds: name → ``module:Class`` (H-05).
    harnesses: dict[str, str] = {}
    #: The runner workspace, as the tools actor has it (``corral up --workspace``): a
    #: session's tool working directory, where a coding-agent CLI runs too.
    workspace: str | None = None
    #: Root of per-session fallback working directories (else the tools actor's default).
    os_env_root: str | None = None
