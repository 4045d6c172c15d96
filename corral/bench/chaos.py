"""``corral bench chaos``: N sessions x M turns while a killer hurts the host, then the checks.

Each session runs its turns one after another through the control plane's client API, as a
user would: post a message, follow the session's stream, accept every approval (each turn
parks two: the policy's ask for its shell call and the script's own elicitation), wait for
the turn's end, post the next. Meanwhile a killer, every ``interval`` seconds (1-2 s by
default, drawn from ``seed``), picks a kind of process and ``kill -9`` s one of its live pids
— an actor, a harness worker, the control plane, a zygote when the actors and workers are
forked from them (``zygote``, the default) — or, in the ``tunnel`` mode, cuts every
connection of the tunnel's proxy (:mod:`corral.bench._chaos_host`). ``kind`` narrows the
killer to one kind: the targeted modes (``dispatch``, ``gateway``) at short turns reproduce
what random kills hit only now and then.

After the last turn the host is left to settle and the invariants are checked
(:mod:`corral.bench._chaos_check`): every turn exactly one terminal edge, every delta of
every completed turn exactly once and in order, no turn (and no tool call) run twice, no
elicitation left parked (in the host, or pending at the control plane), no orphan process
(none the host does not account for while it runs, none left once it has stopped). The
figures are a :class:`ChaosFigures`; :attr:`ChaosFigures.ok` is whether every invariant held.
The driver reports failures, it never retries them away.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import json
import os
import random
import signal
import sys
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec
import trio

from ._chaos_check import Tally, check_session
from ._chaos_client import Event, PlaneClient, PlaneGone, SessionLog
from ._chaos_host import (
    AGENT,
    CONTROL_PLANE,
    NOTHING,
    TUNNEL,
    WORKER,
    ZYGOTE,
    ChaosHost,
    chaos_host,
    processes_under,
    script,
)
from ._common import Document, figure, percentile
from ._progress import step

Mode = Literal["kill", "tunnel"]
#: What ``kind = "any"`` kills in the kill mode: every process kind of a host (the broker
#: lives in the host process itself, whose death is the host's restart, not chaos).
ACTORS = ("dispatch", "gateway", "harness", "journal", "policy", "tools")


class ChaosOptions(msgspec.Struct, frozen=True, kw_only=True):
    """One chaos run's workload."""

    sessions: int = 10
    turns: int = 10
    mode: Mode = "kill"
    #: ``any``, an actor's name, ``worker`` or ``control-plane`` (kill mode); ``tunnel``;
    #: ``none``: nothing is killed (the control run of the same workload).
    kind: str = "any"
    seed: int = 0
    #: Seconds between two kills, drawn uniformly from this range.
    interval: tuple[float, float] = (1.0, 2.0)
    #: Tokens streamed before the tool call and again after the approval, and their pace.
    deltas: int = 6
    delay_ms: int = 40
    #: A turn that has not ended after this long counts as hung (its session stops there).
    turn_timeout_s: float = 120.0
    #: The host forks its actors and the harness actor its workers from a zygote each, as by
    #: default (``kind = "any"`` then kills the zygotes too); False: every process is exec'd.
    zygote: bool = True

    def kinds(self) -> list[str]:
        if self.mode == "tunnel":
            return [TUNNEL]
        if self.kind == "any":
            return [*ACTORS, WORKER, CONTROL_PLANE, *([ZYGOTE] if self.zygote else [])]
        return [] if self.kind == NOTHING else [self.kind]


class ChaosFigures(msgspec.Struct, frozen=True, kw_only=True):
    """What a chaos run measured; ``ok`` when every invariant held."""

    mode: str
    kind: str
    seed: int
    zygote: bool
    sessions: int
    turns_per_session: int
    #: Messages posted (each one a turn to end exactly once).
    turns: int
    #: Messages the runner never took (``session.delivery_failed``): no turn ran for them.
    refused: int
    completed: int
    failed: int
    #: Turns that ended with exactly one terminal edge, of those that should have run.
    terminal_once_pct: float
    no_terminal: int
    duplicate_terminals: int
    #: Deltas of completed turns that never arrived.
    lost: int
    #: Items and ends of completed turns that never arrived (message, tool output, completed).
    events_lost: int
    #: Deltas that arrived more than once (any turn).
    duplicated: int
    misordered: int
    #: Turns started more than once for one message.
    run_twice: int
    #: Shell calls whose effect (a line in ran.txt) happened more than once.
    tool_runs_twice: int
    #: Turns whose harness ran another turn's script (a forgotten history).
    history_lost: int
    #: Completed turns whose accepted approval a crash cancelled (the script's decline text).
    approvals_cancelled: int
    #: Elicitations still parked in the host, or pending at the control plane, at the end.
    parked_left: int
    #: Processes the host did not account for while running, or left after it stopped.
    orphans: int
    #: Stream ids the control plane sent twice or out of order.
    repeated_stream_ids: int
    #: Turns that did not end within ``turn_timeout_s`` (their session stopped there).
    hung: int
    kills: dict[str, int]
    #: From a kill to the next event of each turn in flight at that moment.
    #: None when no kill landed while a turn was in flight.
    kill_to_next_event_p50_ms: float | None
    kill_to_next_event_p99_ms: float | None
    #: The same, per kind of process killed: ``{kind: {"n", "p50_ms", "p99_ms"}}``.
    kill_to_next_event_by_kind: dict[str, dict[str, float | None]]
    #: The baseline: the same measure from moments drawn at random over the kills' span
    #: (the run's, with no kills; seeded), where nothing was just killed. What a kill adds
    #: is the difference; under the storm's load a turn waits for the cores between its
    #: events too.
    any_moment_to_next_event_p50_ms: float | None
    any_moment_to_next_event_p99_ms: float | None
    #: What the tail is made of: the longest waits between two events of a turn in flight,
    #: each with the events around it and the kills during it (:func:`_longest_waits`).
    longest_waits: list[dict[str, Any]]
    failures_by_code: dict[str, int]
    #: Stream reopenings (the driver's stream dropped: the control plane died, say).
    stream_reopened: int
    #: POSTs of a message sent again because the first got no answer (never stored twice).
    message_reposts: int
    elapsed_s: float
    problems: list[str]
    ok: bool


@dataclass
class Kill:
    at: float
    kind: str
    pid: int


@dataclass
class SessionRun:
    """One session's driver state."""

    log: SessionLog
    #: (posted at, ended at or None) of each turn, ``time.perf_counter()``.
    turns: list[tuple[float, float | None]] = field(default_factory=list)
    refused: int = 0
    reposts: int = 0
    hung: int = 0
    #: Segments closed so far (``running`` … terminal), and delivery failures.
    ended: int = 0
    in_turn: bool = False
    changed: trio.Event = field(default_factory=trio.Event)
    error: str | None = None

    def bump(self) -> None:
        self.changed.set()
        self.changed = trio.Event()


async def run_chaos(options: ChaosOptions) -> ChaosFigures:
    """Run one chaos workload on a fresh host and check it."""
    rng = random.Random(options.seed)
    turns = script(options.turns, options.deltas, options.delay_ms)
    started = time.perf_counter()
    runs: list[SessionRun] = []
    kills: list[Kill] = []
    tally = Tally()
    async with chaos_host(turns, tunnel=options.mode == "tunnel", zygote=options.zygote) as host:
        client = PlaneClient(host.locate, token=host.client_token())
        try:
            async with trio.open_nursery() as streams:
                ids = []
                for _ in range(options.sessions):
                    ids.append(await client.create_session(AGENT))
                for sid in ids:
                    run = SessionRun(SessionLog(sid))
                    runs.append(run)
                    streams.start_soon(client.follow, run.log, _on_event(client, run, streams))
                async with trio.open_nursery() as work:
                    done = trio.Event()
                    work.start_soon(_killer, host, options, rng, kills, done)
                    total = len(runs)
                    with step("sessions through their turns", total=total) as progress:

                        async def drive(run: SessionRun) -> None:
                            await _drive(client, run, options)
                            progress.advance()

                        async with trio.open_nursery() as drivers:
                            for run in runs:
                                drivers.start_soon(drive, run)
                    done.set()
                with step("settling and checking"):
                    await _settle(host, runs)
                streams.cancel_scope.cancel()
            parked = await trio.to_thread.run_sync(host.parked)
            pending = 0
            for run in runs:
                status, body = await client.call("GET", f"/v1/sessions/{run.log.session_id}")
                if status == 200:
                    pending += int(body.get("pending_elicitation_count") or 0)
            for e in parked:
                tally.problem(f"parked left: {e.get('elicitation_id')} of {e.get('session_id')}")
            live_orphans = await trio.to_thread.run_sync(_unaccounted, host)
            for run in runs:
                sid = run.log.session_id
                ran = host.root / "envs" / sid / "workspace" / "ran.txt"
                check_session(tally, run.log, len(run.turns), run.refused, options.deltas, ran)
                if run.error:
                    tally.problem(f"{sid}: driver stopped: {run.error}")
        finally:
            await client.aclose()
    after_stop = await trio.to_thread.run_sync(_leftovers, host)
    orphans = set(live_orphans) | set(after_stop)
    if orphans:
        tally.problem(f"orphan processes: {sorted(orphans)}")
    return _figures(options, tally, runs, kills, len(parked) + pending, len(orphans), started)


def _on_event(client: PlaneClient, run: SessionRun, nursery: trio.Nursery) -> Any:
    answered: set[str] = set()

    def on_event(event: Event) -> None:
        status = event.data.get("status") if event.type == "session.status" else None
        if status == "running" and not run.in_turn:
            run.in_turn = True
        elif status in ("idle", "failed") and run.in_turn:
            run.in_turn = False
            run.ended += 1
        elif event.type == "session.delivery_failed":
            run.refused += 1
            run.ended += 1
        elif event.type == "response.elicitation_request":
            eid = str(event.data.get("elicitation_id") or "")
            if eid and eid not in answered:
                answered.add(eid)
                nursery.start_soon(_accept, client, run, eid)
        run.bump()

    return on_event


async def _accept(client: PlaneClient, run: SessionRun, eid: str) -> None:
    try:
        await client.accept(run.log.session_id, eid)
    except PlaneGone as exc:
        run.error = f"verdict for {eid}: {exc}"


async def _drive(client: PlaneClient, run: SessionRun, options: ChaosOptions) -> None:
    sid = run.log.session_id
    for k in range(options.turns):
        posted = time.perf_counter()
        run.turns.append((posted, None))
        try:
            posts = await client.post_message(sid, f"turn {k}", stored_before=k)
        except PlaneGone as exc:
            run.error = f"turn {k}: {exc}"
            run.turns[-1] = (posted, time.perf_counter())
            return
        run.reposts += posts - 1
        with trio.move_on_after(options.turn_timeout_s):
            while run.ended < k + 1:
                await run.changed.wait()
        if run.ended < k + 1:
            run.hung += 1
            run.error = f"turn {k} did not end within {options.turn_timeout_s:g}s"
            return
        run.turns[-1] = (posted, time.perf_counter())


async def _killer(
    host: ChaosHost, options: ChaosOptions, rng: random.Random, kills: list[Kill], done: trio.Event
) -> None:
    kinds = options.kinds()
    low, high = options.interval
    while kinds and not done.is_set():
        with trio.move_on_after(rng.uniform(low, high)):
            await done.wait()
        if done.is_set():
            return
        kind = rng.choice(kinds)
        if kind == TUNNEL:
            assert host.proxy is not None
            host.proxy.drop()
            kills.append(Kill(time.perf_counter(), kind, 0))
            continue
        try:
            pids = await trio.to_thread.run_sync(host.targets, kind)
        except (OSError, RuntimeError, ValueError):
            continue  # the host is busy restarting something: the next round will do
        if not pids:
            continue
        pid = rng.choice(sorted(pids))
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        kills.append(Kill(time.perf_counter(), kind, pid))


async def _settle(host: ChaosHost, runs: list[SessionRun], quiet_s: float = 2.0) -> None:
    """Let the host come back and late events (a duplicated edge) arrive: until every actor
    runs and no stream has had an event for ``quiet_s``, at most 60 s."""
    with trio.move_on_after(60):
        while not await trio.to_thread.run_sync(host.settled):
            await trio.sleep(0.2)
        while True:
            last = max((r.log.events[-1].at for r in runs if r.log.events), default=0.0)
            wait = last + quiet_s - time.perf_counter()
            if wait <= 0:
                return
            await trio.sleep(wait)


def _unaccounted(host: ChaosHost, timeout: float = 15.0) -> list[int]:
    """Processes of the host's root that its status does not list, once that has settled
    (a killed actor's children get a moment to follow it)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            stray = sorted(set(host.processes()) - host.known_pids())
        except (OSError, RuntimeError, ValueError):
            stray = []
        stray = [pid for pid in stray if not _is_tool_child(pid)]
        if not stray or time.monotonic() > deadline:
            return stray
        time.sleep(0.2)


def _is_tool_child(pid: int) -> bool:
    """A shell the tools actor is running right now (a turn's ``echo``), not an orphan: a
    child of an actor that is no corral process itself (a worker is one, and counts)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            own = f.read()
        if b"corral." in own or own.startswith(b"corral: "):
            return False
        with open(f"/proc/{ppid}/cmdline", "rb") as f:
            parent = f.read()
        # An actor shows its title (corral/_proctitle.py) once set, its command line before.
        if parent.startswith((b"corral: host ", b"corral: server ", b"corral: worker ")):
            return False
        return parent.startswith(b"corral: ") or b"corral.actors._entry" in parent
    except (OSError, ValueError, IndexError):
        return False


def _leftovers(host: ChaosHost, timeout: float = 10.0) -> list[int]:
    """Processes of the host's root still alive after it stopped; killed here once counted."""
    deadline = time.monotonic() + timeout
    while (left := processes_under(host.root)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return left


def _next_event_latencies(runs: list[SessionRun], moments: list[float]) -> list[float]:
    """Seconds from each moment to the next event of every turn in flight at it."""
    out = []
    for run in runs:
        times = [e.at for e in run.log.events]
        for at in moments:
            if not any(a <= at and (b is None or b > at) for a, b in run.turns):
                continue
            i = bisect.bisect_right(times, at)
            if i < len(times):
                out.append(times[i] - at)
    return sorted(out)


def _by_kind(runs: list[SessionRun], kills: list[Kill]) -> dict[str, dict[str, float | None]]:
    out: dict[str, dict[str, float | None]] = {}
    for kind in sorted({k.kind for k in kills}):
        latencies = _next_event_latencies(runs, [k.at for k in kills if k.kind == kind])
        out[kind] = {
            "n": len(latencies),
            "p50_ms": _ms(latencies, 0.5),
            "p99_ms": _ms(latencies, 0.99),
        }
    return out


def _brief(event: Event) -> str:
    status = event.data.get("status")
    return f"{event.type} {status}" if isinstance(status, str) else event.type


def _longest_waits(runs: list[SessionRun], kills: list[Kill], n: int = 10) -> list[dict[str, Any]]:
    """The ``n`` longest waits between consecutive events of a turn in flight, longest
    first: seconds, the event before and after, and the kills, by kind, while it lasted."""
    waits: list[tuple[float, str, Event, Event]] = []
    for run in runs:
        events = run.log.events
        for before, after in itertools.pairwise(events):
            gap = after.at - before.at
            if waits and len(waits) >= n and gap <= waits[-1][0]:
                continue
            if any(a <= before.at and (b is None or b >= after.at) for a, b in run.turns):
                waits.append((gap, run.log.session_id, before, after))
                waits.sort(key=lambda w: -w[0])
                del waits[n:]
    kill_times = [k.at for k in kills]
    out = []
    for gap, session_id, before, after in waits:
        lo = bisect.bisect_right(kill_times, before.at)
        hi = bisect.bisect_left(kill_times, after.at)
        out.append(
            {
                "seconds": round(gap, 2),
                "session_id": session_id,
                "from": _brief(before),
                "to": _brief(after),
                "kills": dict(sorted(Counter(k.kind for k in kills[lo:hi]).items())),
            }
        )
    return out


def _any_moments(kills: list[Kill], seed: int, span: tuple[float, float]) -> list[float]:
    """Four times as many moments as kills, uniform over the kills' span; with fewer than
    two kills, 400 over ``span`` (the run's)."""
    rng = random.Random(f"any-moment-{seed}")
    if len(kills) >= 2:
        first, last, n = kills[0].at, kills[-1].at, 4 * len(kills)
    else:
        (first, last), n = span, 400
    return sorted(rng.uniform(first, last) for _ in range(n))


def _figures(
    options: ChaosOptions,
    tally: Tally,
    runs: list[SessionRun],
    kills: list[Kill],
    parked_left: int,
    orphans: int,
    started: float,
) -> ChaosFigures:
    hung = sum(r.hung for r in runs)
    latencies = _next_event_latencies(runs, [k.at for k in kills])
    span = (started, time.perf_counter())
    anytime = _next_event_latencies(runs, _any_moments(kills, options.seed, span))
    # A refused message ran no turn: it is not a turn that ended once.
    once_pct = 100.0 * tally.terminal_once / tally.messages if tally.messages else 100.0
    driver_errors = sum(1 for r in runs if r.error)
    ok = (
        tally.terminal_once == tally.messages
        and not tally.duplicate_terminals
        and not tally.no_terminal
        and not tally.lost
        and not tally.events_lost
        and not tally.duplicated
        and not tally.misordered
        and not tally.run_twice
        and not tally.tool_runs_twice
        and not tally.history_lost
        and not tally.repeated_stream_ids
        and not parked_left
        and not orphans
        and not hung
        and not driver_errors
    )
    return ChaosFigures(
        mode=options.mode,
        kind=options.kind,
        seed=options.seed,
        zygote=options.zygote,
        sessions=options.sessions,
        turns_per_session=options.turns,
        turns=tally.messages,
        refused=tally.refused,
        completed=tally.completed,
        failed=tally.failed,
        terminal_once_pct=round(once_pct, 3),
        no_terminal=tally.no_terminal,
        duplicate_terminals=tally.duplicate_terminals,
        lost=tally.lost,
        events_lost=tally.events_lost,
        duplicated=tally.duplicated,
        misordered=tally.misordered,
        run_twice=tally.run_twice,
        tool_runs_twice=tally.tool_runs_twice,
        history_lost=tally.history_lost,
        approvals_cancelled=tally.approvals_cancelled,
        parked_left=parked_left,
        orphans=orphans,
        repeated_stream_ids=tally.repeated_stream_ids,
        hung=hung,
        kills=dict(sorted(Counter(k.kind for k in kills).items())),
        kill_to_next_event_p50_ms=_ms(latencies, 0.5),
        kill_to_next_event_p99_ms=_ms(latencies, 0.99),
        kill_to_next_event_by_kind=_by_kind(runs, kills),
        any_moment_to_next_event_p50_ms=_ms(anytime, 0.5),
        any_moment_to_next_event_p99_ms=_ms(anytime, 0.99),
        longest_waits=_longest_waits(runs, kills),
        failures_by_code=dict(sorted(tally.failures.items())),
        stream_reopened=sum(r.log.reopened for r in runs),
        message_reposts=sum(r.reposts for r in runs),
        elapsed_s=round(time.perf_counter() - started, 1),
        problems=tally.problems,
        ok=ok,
    )


def _ms(latencies: list[float], q: float) -> float | None:
    return round(percentile(latencies, q) * 1000, 1) if latencies else None


# --- the benchmark -----------------------------------------------------------------------------


def options_of(params: Mapping[str, object]) -> ChaosOptions:
    """The run's options from the CLI's parameters (``--quick``: 4 sessions x 3 turns)."""
    base = ChaosOptions(sessions=4, turns=3) if params.get("quick") else ChaosOptions()
    given = {
        key: params[key]
        for key in ("sessions", "turns", "mode", "kind", "seed", "turn_timeout_s", "zygote")
        if params.get(key) is not None
    }
    if given.get("kind") == TUNNEL:
        given["mode"] = "tunnel"
    if given.get("kind") == ZYGOTE:
        given["zygote"] = True
    return msgspec.convert({**msgspec.to_builtins(base), **given}, ChaosOptions)


def result_document(figures: ChaosFigures) -> Document:
    """The result document of docs/contract.md, every figure also under ``figures``."""
    ms = "ms"
    results = [
        figure("turns", figures.turns, "turns"),
        figure("turns with exactly one terminal edge", figures.terminal_once_pct, "%"),
        figure("turns completed (idle)", figures.completed, "turns"),
        figure(
            "turns failed (a typed failure: a killed worker's turn, say)", figures.failed, "turns"
        ),
        figure("deltas lost (completed turns)", figures.lost, "deltas"),
        figure("items lost (completed turns)", figures.events_lost, "events"),
        figure("deltas duplicated", figures.duplicated, "deltas"),
        figure("turns run twice", figures.run_twice, "turns"),
        figure("tool calls run twice", figures.tool_runs_twice, "calls"),
        figure("turns without a terminal edge", figures.no_terminal, "turns"),
        figure("duplicated terminal edges", figures.duplicate_terminals, "edges"),
        figure("turns given another turn's history", figures.history_lost, "turns"),
        figure("elicitations left parked", figures.parked_left, "elicitations"),
        figure("orphan processes", figures.orphans, "processes"),
        figure("kills", sum(figures.kills.values()), "kills"),
    ]
    # A kill's figures have the same measure from random moments as their baseline.
    for q, value, base in (
        ("p50", figures.kill_to_next_event_p50_ms, figures.any_moment_to_next_event_p50_ms),
        ("p99", figures.kill_to_next_event_p99_ms, figures.any_moment_to_next_event_p99_ms),
    ):
        if value is not None:
            results.append(figure(f"kill to the turn's next event {q}", value, ms, base))
        if base is not None:
            results.append(figure(f"any moment to the turn's next event {q}", base, ms))
    for kind, by in figures.kill_to_next_event_by_kind.items():
        if by["p99_ms"] is not None:
            results.append(figure(f"kill of {kind} to the turn's next event p99", by["p99_ms"], ms))
    return {
        "benchmark": "chaos",
        "baseline": {
            # The invariants are absolute (100 % one edge, 0 lost, ...): no ratio to a run.
            "name": "messages posted",
            "value": figures.turns,
            "unit": "turns",
        },
        "results": results,
        "params": {
            "sessions": figures.sessions,
            "turns_per_session": figures.turns_per_session,
            "mode": figures.mode,
            "kind": figures.kind,
            "seed": figures.seed,
            "zygote": figures.zygote,
            "python": sys.version.split()[0],
        },
        "figures": msgspec.to_builtins(figures),
        "ok": figures.ok,
    }


def run(params: Mapping[str, object]) -> Document:
    """Run the chaos benchmark and return its result document (``ok`` false: an invariant
    failed, and ``corral bench chaos`` exits 1)."""
    return result_document(trio.run(run_chaos, options_of(params)))


if __name__ == "__main__":
    print(json.dumps(run({"quick": "--quick" in sys.argv})))
