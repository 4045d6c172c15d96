"""``corral bench scale``: how one host's cost grows with the sessions it knows (issue #20).

One real host (``corral up``, default settings but a short idle reap) serves one runner whose
server is this process, as in ``corral bench relay``: a
:class:`~corral.bench._tunnel_peer.TunnelPeer` binds sessions through the gateway's tunnel
and keeps each one's ``GET .../stream`` open, as the server does for every bound session
(PROTOCOL_0_19.md §K.2), and the relay's tap gives each delta's worker send time. The host
grows in steps (10, 100, 1,000 known sessions; ``--quick``: 3, 10, 30). At each step:

* the new sessions are bound and each runs one turn (one delta), a batch at a time; then
  every worker is reaped (``idle_timeout_s``) and the host settles: **idle**, the host's
  whole process tree is measured (PSS and RSS from ``/proc/PID/smaps_rollup``, and per known
  session), with its processes and every actor's trio tasks and open files (``inspect``);
* up to 100 of them (``--quick``: 5) become **active**: a turn of one delta wakes their
  workers, then at once a paced turn streams K deltas D ms apart in each: the aggregate
  deltas/s (every paced delta over first to last arrival), the p50/p99 latency of a delta
  from its worker's send to its arrival here, and the CPU the host's tree used meanwhile (in
  cores: a 2-core machine is saturated near 2); the tree is measured again right after, its
  workers still alive.

What an idle session should cost is its durable state and a few dict entries, no task, no
channel, no process; what the server's open stream costs (one gateway task each) shows in the
gateway's count. Baseline, same run: the first step; each figure's ratio is to the same
figure there, so the ratios read as "times what it cost with 10 sessions".
"""

from __future__ import annotations

import itertools
import json
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import trio

from .._jsonlines import JsonObject
from ..actors._control import request
from ..instance import Instance
from ._common import Document, Figure, figure, host_pid, percentile, quiet
from ._progress import step
from ._tunnel_peer import PeerError
from .memory import cpu_s, memory_mb, process_tree
from .relay import WARM_DELTAS, WARM_TURN, Relay, bind_all, relay_host, run_turn

#: One turn's deltas by session: (arrival, turn id, sequence number) each, as
#: :func:`~corral.bench.relay.run_turn` returns them.
TurnDeltas = dict[str, list[tuple[float, str, int]]]


@dataclass(frozen=True)
class Sizes:
    """The workloads of one run."""

    #: Known sessions at each step.
    steps: tuple[int, ...]
    #: At most this many sessions of a step stream at once (``--sessions``).
    active: int
    #: Each active session's paced turn: deltas and their spacing.
    paced_deltas: int
    paced_delay_ms: int
    #: The harness actor's idle reap: longer than all active sessions' wakes take together,
    #: so that no woken worker is reaped before its paced turn.
    reap_s: float
    #: New sessions bound and given their first turn at once.
    batch: int

    @classmethod
    def full(cls) -> Sizes:
        return cls(
            steps=(10, 100, 1000),
            active=100,
            paced_deltas=50,
            paced_delay_ms=100,
            reap_s=45,
            batch=50,
        )

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            steps=(3, 10, 30),
            active=5,
            paced_deltas=20,
            paced_delay_ms=50,
            reap_s=4,
            batch=10,
        )

    def turns(self) -> list[list[JsonObject]]:
        """The scripted agent's turns: a session's first, then per step a wake and a paced
        turn (the script cycles, so it holds every turn a session can run)."""
        paced = [{"text": "y", "repeat": self.paced_deltas, "delay_ms": self.paced_delay_ms}]
        return [WARM_TURN, *[t for _ in self.steps for t in (WARM_TURN, paced)]]


@dataclass
class HostState:
    """What the host holds at one moment."""

    pss_mb: float
    rss_mb: float
    processes: int
    live_workers: int
    #: Per actor: its process's trio tasks and open files.
    tasks: dict[str, int] = field(default_factory=dict)
    open_files: dict[str, int] = field(default_factory=dict)
    #: Per actor: its process's PSS in MB (where a known session's memory goes).
    pss_mb_of: dict[str, float] = field(default_factory=dict)
    #: Per actor, what its snapshot counts per session: dispatch's sessions, the gateway's
    #: open streams, the harness actor's workers.
    held: dict[str, int] = field(default_factory=dict)


@dataclass
class Step:
    """One step's measurements."""

    known: int
    active: int
    idle: HostState
    busy: HostState
    #: Paced deltas/s, every active session together.
    rate: float
    #: The host tree's CPU while the paced turns ran, in cores (CPU-s per second).
    cores: float
    #: Paced delta latencies, seconds, sorted.
    latencies: list[float]


def host_state(inst: Instance) -> HostState:
    """The host's process tree, its memory, and every actor's own counts."""
    tree = process_tree(host_pid(inst))
    pss, rss = memory_mb(tree)
    status = request(inst.control_path, "status")
    state = HostState(pss, rss, len(tree), 0)
    for actor in status["actors"]:
        name = actor["name"]
        snapshot = request(inst.control_path, "inspect", actor=name)["state"]
        state.tasks[name] = snapshot["tasks"]
        state.open_files[name] = snapshot["open_files"]
        state.pss_mb_of[name] = round(memory_mb([actor["pid"]])[0], 2)
        if name == "dispatch":
            state.held["dispatch sessions"] = snapshot["sessions"]
        elif name == "gateway":
            state.held["gateway streams"] = snapshot["streams"]
        elif name == "journal":
            # Both bounded (``max_open_runs``, ``max_tracked_runs``), not per known session.
            state.held["journal open runs"] = snapshot["open_runs"]
            state.held["journal tracked runs"] = snapshot["tracked_runs"]
        elif name == "harness":
            state.live_workers = sum(1 for w in snapshot["workers"] if w.get("pid"))
            state.held["harness workers"] = len(snapshot["workers"])
    return state


def _tree_cpu_s(inst: Instance) -> float:
    return cpu_s(process_tree(host_pid(inst)))


def _live_workers(inst: Instance) -> int:
    """The harness actor's workers with a process (a lighter ask than :func:`host_state`)."""
    workers = request(inst.control_path, "inspect", actor="harness")["state"]["workers"]
    return sum(1 for w in workers if w.get("pid"))


async def _until_reaped(inst: Instance, timeout: float) -> None:
    """Until the harness actor has no live worker (its idle reap took them all)."""
    with trio.move_on_after(timeout):
        while await trio.to_thread.run_sync(_live_workers, inst):
            await trio.sleep(0.2)
        return
    raise PeerError(f"idle workers still alive {timeout:g}s after their turns")


def latencies(relay: Relay, turns: TurnDeltas) -> list[float]:
    """Each delta's worker send (the tap's ``origin_at``) to its arrival here, sorted."""
    offset = time.time() - time.perf_counter()
    out = []
    for deltas in turns.values():
        for arrival, turn, seq in deltas:
            origin = relay.origins.get((turn, seq))
            if origin is None:
                raise PeerError(f"the tap never saw delta {seq} of turn {turn}")
            out.append(arrival + offset - origin)
    return sorted(out)


async def _tapped(relay: Relay, turns: TurnDeltas, timeout: float = 30) -> None:
    """Until the tap has every delta's copy (they travel behind the gateway's)."""
    keys = [(turn, seq) for deltas in turns.values() for _, turn, seq in deltas]
    with trio.move_on_after(timeout):
        while not all(key in relay.origins for key in keys):
            await trio.sleep(0.05)


def _rate(turns: TurnDeltas) -> float:
    arrivals = [arrival for deltas in turns.values() for arrival, _, _ in deltas]
    return (len(arrivals) - 1) / max(max(arrivals) - min(arrivals), 1e-9)


async def grow(relay: Relay, known: list[str], target: int, sizes: Sizes) -> None:
    """Bind new sessions up to ``target``, each running its first turn, a batch at a time."""
    new = [uuid.uuid4().hex for _ in range(target - len(known))]
    with step(f"{target} known sessions: the new ones' first turns", total=len(new)) as bar:
        for first in range(0, len(new), sizes.batch):
            batch = new[first : first + sizes.batch]
            await bind_all(relay.peer, batch)
            await run_turn(relay.peer, batch, WARM_DELTAS, 120 + 2 * len(batch))
            bar.advance(len(batch))
    known += new


async def measure_step(relay: Relay, known: list[str], target: int, sizes: Sizes) -> Step:
    """Grow to ``target`` known sessions, measure the host idle, then with sessions active."""
    inst, peer = relay.inst, relay.peer
    await grow(relay, known, target, sizes)
    with step(f"{target} known sessions: workers reaped"):
        await _until_reaped(inst, sizes.reap_s + 120)
        await quiet(host_pid(inst))
        idle = await trio.to_thread.run_sync(host_state, inst)
    active = known[: min(sizes.active, target)]
    with step(f"{target} known sessions: {len(active)} active"):
        await run_turn(peer, active, WARM_DELTAS, 120 + 2 * len(active))
        pace = sizes.paced_deltas * sizes.paced_delay_ms / 1000
        cpu, start = await trio.to_thread.run_sync(_tree_cpu_s, inst), time.monotonic()
        paced = await run_turn(peer, active, sizes.paced_deltas, 120 + pace)
        cores = (await trio.to_thread.run_sync(_tree_cpu_s, inst) - cpu) / (
            time.monotonic() - start
        )
        busy = await trio.to_thread.run_sync(host_state, inst)
        await _tapped(relay, paced)
    return Step(target, len(active), idle, busy, _rate(paced), cores, latencies(relay, paced))


async def measure(sizes: Sizes) -> list[Step]:
    extra = f"\n[actors.harness.options]\nidle_timeout_s = {sizes.reap_s}\n"
    async with relay_host(sizes.turns(), tap=True, extra=extra) as relay:
        known: list[str] = []
        return [await measure_step(relay, known, target, sizes) for target in sizes.steps]


def _figures(steps: list[Step]) -> list[Figure]:
    """Every step's figures, each with its ratio to the same figure at the first step."""
    ms = 1000

    def rows(s: Step) -> list[tuple[str, float, str]]:
        idle, busy = f"{s.known} sessions idle", f"{s.known} sessions, {s.active} active"
        return [
            (f"host tree PSS, {idle}", s.idle.pss_mb, "MB"),
            (f"host tree RSS, {idle}", s.idle.rss_mb, "MB"),
            (f"host tree PSS per known session, {idle}", s.idle.pss_mb / s.known, "MB"),
            (f"host processes, {idle}", s.idle.processes, "processes"),
            (f"host trio tasks, {idle}", sum(s.idle.tasks.values()), "tasks"),
            (f"host open files, {idle}", sum(s.idle.open_files.values()), "files"),
            (f"host tree PSS, {busy}", s.busy.pss_mb, "MB"),
            (f"host tree RSS, {busy}", s.busy.rss_mb, "MB"),
            (f"host processes, {busy}", s.busy.processes, "processes"),
            (f"host trio tasks, {busy}", sum(s.busy.tasks.values()), "tasks"),
            (f"deltas/s, {busy}", s.rate, "msgs/s"),
            (f"host tree CPU during the paced turns, {busy}", s.cores, "cores"),
            (f"paced delta latency p50, {busy}", percentile(s.latencies, 0.5) * ms, "ms"),
            (f"paced delta latency p99, {busy}", percentile(s.latencies, 0.99) * ms, "ms"),
        ]

    first = rows(steps[0])
    out = [
        figure(name, value, unit, base)
        for s in steps
        for (name, value, unit), (_, base, _) in zip(rows(s), first, strict=True)
    ]
    for before, after in itertools.pairwise(steps):
        added = after.known - before.known
        marginal = (after.idle.pss_mb - before.idle.pss_mb) / added
        out.append(
            figure(f"PSS per added idle session, {before.known} -> {after.known}", marginal, "MB")
        )
    return out


def _params(sizes: Sizes, steps: list[Step]) -> JsonObject:
    return {
        "steps": list(sizes.steps),
        "active": sizes.active,
        "paced": (
            f"{sizes.paced_deltas} deltas {sizes.paced_delay_ms} ms apart per active session"
        ),
        "idle_timeout_s": sizes.reap_s,
        # The audit of issue #20: what each actor holds, idle and busy, at each step.
        "by_step": [
            {
                "known": s.known,
                "active": s.active,
                "idle": _state_json(s.idle),
                "busy": _state_json(s.busy),
            }
            for s in steps
        ],
        "python": sys.version.split()[0],
    }


def _state_json(state: HostState) -> dict[str, Any]:
    return {
        "processes": state.processes,
        "live_workers": state.live_workers,
        "tasks": state.tasks,
        "open_files": state.open_files,
        "pss_mb": state.pss_mb_of,
        "held": state.held,
    }


def run(params: Mapping[str, object]) -> Document:
    """Run the scale benchmark and return the result document of docs/contract.md."""
    sizes = Sizes.quick() if params.get("quick") else Sizes.full()
    if params.get("sessions"):
        sizes = replace(sizes, active=int(str(params["sessions"])))
    steps = trio.run(measure, sizes)
    first = steps[0]
    return {
        "benchmark": "scale",
        "baseline": {
            "name": (
                f"paced delta latency p50 at the first step ({first.known} sessions, "
                f"{first.active} active); each figure's ratio is to itself at that step"
            ),
            "value": round(percentile(first.latencies, 0.5) * 1000, 3),
            "unit": "ms",
        },
        "results": _figures(steps),
        "params": _params(sizes, steps),
    }


if __name__ == "__main__":
    print(json.dumps(run({"quick": "--quick" in sys.argv})))
