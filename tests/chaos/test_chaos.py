"""Chaos runs of the whole host (issue #15, item 7): turns with tool calls and approvals
while processes are killed, then every invariant checked (corral/bench/chaos.py).

Each mode is one small run: random ``kill -9`` of every process kind (each actor, harness
workers, the zygotes they are forked from, the control plane) every 1-2 s, and again with
every process exec'd; dispatch only (at the default turn, which streams while it dies) and
the gateway only (at short turns); and the tunnel cut under live turns.
A run passes when every turn had exactly one terminal edge, every delta of every completed
turn arrived once and in order, nothing ran twice, no elicitation was left parked and no
process was orphaned; otherwise the assertion lists what broke, with the session and the
turn. ``corral bench chaos`` runs the same driver at scale.
"""

from __future__ import annotations

import json

import pytest

from corral.bench.chaos import ChaosFigures, ChaosOptions, run_chaos
from tests.conftest import corral

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.timeout(240)]

#: Small enough for CI (three sessions of three turns), long enough for ~10 kills a run.
#: A turn that has not ended 20 s after its message (it takes ~2 s) is stuck, not slow.
SMALL = {"sessions": 3, "turns": 3, "turn_timeout_s": 20.0}
#: Short turns (3 + 3 deltas 20 ms apart) for the gateway: a kill lands at a turn's start,
#: its tool call or its end as often as in the middle of its text. Eight of them a session,
#: so the run outlasts a few kills: three a session ended before the killer's first kill
#: (1-2 s) on a fast VM.
SHORT = {"deltas": 3, "delay_ms": 20, "turns": 8}


def verdict(figures: ChaosFigures) -> str:
    lines = [f"{name}: {getattr(figures, name)}" for name in (
        "turns", "terminal_once_pct", "no_terminal", "duplicate_terminals", "lost",
        "events_lost", "duplicated", "misordered", "run_twice", "tool_runs_twice", "history_lost",
        "parked_left", "orphans", "hung", "kills", "failures_by_code",
    )]  # fmt: skip
    return "\n".join([*lines, *figures.problems])


async def run(**options: object) -> ChaosFigures:
    figures = await run_chaos(ChaosOptions(**{**SMALL, **options}))  # type: ignore[arg-type]
    assert sum(figures.kills.values()) > 0, "the killer never killed anything"
    return figures


async def test_random_kills_of_every_process_kind_keep_every_invariant() -> None:
    """The harness workers are forked from a zygote (the default, #20), which is killed too:
    the forked workers number their bus messages apart, and every spawn waits for a zygote
    a bounded time, then execs."""
    figures = await run(kind="any", seed=5)
    assert figures.ok, verdict(figures)
    assert figures.zygote


async def test_random_kills_with_every_process_execd_keep_every_invariant() -> None:
    """The same with every actor and harness worker exec'd (both ``zygote = false``)."""
    figures = await run(kind="any", seed=1, zygote=False)
    assert figures.ok, verdict(figures)
    assert not figures.zygote and "zygote" not in figures.kills


async def test_dispatch_killed_again_and_again_keeps_every_invariant() -> None:
    """What a worker streams while dispatch is down is held by the worker and sent again to
    the next incarnation: nothing lost, nothing twice."""
    figures = await run(kind="dispatch", seed=2, **SHORT)
    assert figures.ok, verdict(figures)


async def test_gateway_killed_again_and_again_keeps_every_invariant() -> None:
    figures = await run(kind="gateway", seed=3, **SHORT)
    assert figures.ok, verdict(figures)


async def test_tunnel_dropped_under_live_turns_keeps_every_invariant() -> None:
    figures = await run(mode="tunnel", seed=4)
    assert figures.ok, verdict(figures)


def test_bench_chaos_json_prints_the_figures_and_exits_1_when_an_invariant_fails() -> None:
    done = corral(
        "bench", "chaos", "--json", "--sessions", "1", "--turns", "2", "--kind", "worker",
        timeout=200,
    )  # fmt: skip
    result = json.loads(done.stdout)
    assert result["benchmark"] == "chaos"
    names = {r["name"] for r in result["results"]}
    assert {"turns", "turns with exactly one terminal edge", "deltas lost (completed turns)",
            "deltas duplicated", "turns run twice", "orphan processes"} <= names  # fmt: skip
    figures = result["figures"]
    assert figures["turns"] == 2 and figures["kind"] == "worker"
    assert set(figures["kills"]) <= {"worker"}
    assert done.returncode == (0 if result["ok"] else 1), done.stderr
