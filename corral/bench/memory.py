"""``corral bench memory``: what a host's process tree holds in memory, and what a session adds.

A real host (``corral up``, no server) runs with idle workers never reaped; this process
stands in for dispatch and gives sessions one scripted turn each, after which each session's
worker stays alive, idle. The host's whole process tree (the host, its actors, the workers)
is measured at baseline and after +1, +10 and +100 sessions (+1 and +10 with ``--quick``):
PSS, summed from ``/proc/PID/smaps_rollup``, which splits each shared page among the
processes that map it (so figures add up, where RSS counts a page once per process), and
RSS beside it. The figure a host's capacity follows is the PSS each added session costs.
Two hosts are measured, one after the other: one whose workers are forked from the harness
actor's zygote (the default, :mod:`corral._zygote`), one whose workers are exec'd (``zygote
= false``), each figure named with its mode (``[zygote]``, ``[exec]``). Then another host
of each mode, which reaps idle workers after a few seconds, runs a few sessions three times:
a cold turn (a new session, its worker spawned), at once a warm one (its worker idle), and
once every worker was reaped a resumed one (its worker spawned again: what the idle reap
costs a session): start to first delta, and the CPU time the host's tree spent per turn.

Baseline, same run: the interpreter floor, a bare ``python -c "import trio, zmq, msgspec"``
left running and measured alone (PSS, with RSS as a figure): what any process of a
trio/zmq/msgspec runtime pays before it does anything.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import trio

from ..actors._control import request
from ..bus import open_peer
from ..harnesses.protocol import AnyOutput
from ..instance import Instance
from ._common import (
    Document,
    Figure,
    figure,
    host_pid,
    percentile,
    quiet,
    running_host,
)
from ._progress import step
from .harness import LIVENESS, first_delta

#: The interpreter floor: the runtime's imports, nothing else, held until stdin closes.
FLOOR = "import sys, trio, zmq, msgspec; print('ready', flush=True); sys.stdin.read()"

#: The host: no embedded server (a runner's tree is measured); idle workers are kept (0),
#: or reaped after a few seconds for the resumed turns.
CONFIG = """\
[server]
enabled = false

[liveness]
interval_s = 0.5
liveness = 4

[actors.harness.options]
idle_timeout_s = {idle_timeout_s}
"""
#: The turns measured, and what each is.
TURN_KINDS = {
    "cold": "a new session, its worker spawned",
    "warm": "its worker idle",
    "resumed": "its idle worker reaped, spawned again",
}
#: The turns host's idle reap: longer than a turn takes to follow the one before it.
TURNS_IDLE_S = 3

#: The spawns compared: workers forked from the zygote (the default), and exec'd.
MODES = {"zygote": "zygote = true\n", "exec": "zygote = false\n"}


def process_tree(root: int) -> list[int]:
    """``root`` and every process below it."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    tree, frontier = [root], {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier}
        tree += sorted(frontier)
    return tree


def cpu_s(pids: list[int]) -> float:
    """CPU seconds used by ``pids`` and by their children they have reaped: what a tree
    spent, continuous while its processes come and go (a reaped worker's time moves to its
    parent's ``cutime``/``cstime``)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # After the command name: utime, stime, cutime, cstime are fields 14..17 of stat(5).
        total += sum(int(f) for f in fields[11:15])
    return total / tick


def role_of(title: str, *, root: bool) -> str:
    """What a process of a measured tree does, from its title: a corral process's title
    without what names one of its kind (``corral: worker <session>`` and ``corral: host
    <state dir>`` are ``corral: worker`` and ``corral: host``); another runner's process is
    ``runner`` (the tree's root) or ``runner's children``."""
    if title.startswith("corral: "):
        return " ".join(title.split()[:2])
    return "runner" if root else "runner's children"


def _titled(pids: list[int]) -> Iterator[tuple[int, str]]:
    """Each of ``pids`` still running with its title (the command line's first word: a
    corral process sets it, ``corral: dispatch``)."""
    for pid in pids:
        try:
            yield pid, Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        except OSError:
            continue


def cpu_s_by_role(pids: list[int]) -> dict[str, float]:
    """:func:`cpu_s` of a tree (``pids[0]`` its root) by :func:`role_of`, the processes of one
    role summed: where a tree's CPU goes. A child reaped meanwhile counts with its parent."""
    by_role: dict[str, float] = {}
    for pid, title in _titled(pids):
        role = role_of(title, root=pid == pids[0])
        by_role[role] = by_role.get(role, 0.0) + cpu_s([pid])
    return by_role


def memory_mb(pids: list[int]) -> tuple[float, float]:
    """The summed (PSS, RSS) of ``pids`` in MB (a process gone meanwhile counts 0)."""
    pss_kb = rss_kb = 0
    for pid in pids:
        try:
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        for line in rollup.splitlines():
            key, _, rest = line.partition(":")
            if key == "Pss":
                pss_kb += int(rest.split()[0])
            elif key == "Rss":
                rss_kb += int(rest.split()[0])
    return pss_kb / 1024, rss_kb / 1024


def pss_by_title(pids: list[int]) -> dict[str, float]:
    """The PSS of ``pids`` in MB by process title (``corral: dispatch``; the command line
    of a process that sets none), processes of one title summed: where a tree's memory is."""
    by_title: dict[str, float] = {}
    for pid, title in _titled(pids):
        pss, _ = memory_mb([pid])
        by_title[title] = round(by_title.get(title, 0.0) + pss, 1)
    return by_title


def floor_mb() -> tuple[float, float]:
    """(PSS, RSS) in MB of a bare interpreter that imported trio, zmq and msgspec."""
    proc = subprocess.Popen(
        [sys.executable, "-c", FLOOR], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        return memory_mb([proc.pid])
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(10)


def _live_workers(inst: Instance) -> int:
    workers = request(inst.control_path, "inspect", actor="harness")["state"]["workers"]
    return sum(1 for w in workers if w.get("pid"))


async def _settled_tree(inst: Instance, sessions: int) -> tuple[float, float, int]:
    """(PSS, RSS, processes) of the host's tree once ``sessions`` workers live and the tree
    is quiet (a worker's start, the journal's writes, done)."""
    live = await trio.to_thread.run_sync(_live_workers, inst)
    if live != sessions:
        raise RuntimeError(f"{live} live workers, expected {sessions}")
    root = host_pid(inst)
    await quiet(root)
    tree = process_tree(root)
    pss, rss = memory_mb(tree)
    return pss, rss, len(tree)


#: A scripted session's turn: one short text.
SPEC = {
    "name": "bench",
    "executor": {"harness": "scripted", "script": {"turns": [[{"text": "hi"}]]}},
}


async def _sessions(inst: Instance, counts: tuple[int, ...]) -> list[tuple[int, float, float, int]]:
    """(sessions, PSS, RSS, processes) of the tree at baseline and at each count of sessions
    (one turn each, their workers left idle)."""
    async with open_peer(
        "bench-rx", inst.bus_endpoint, liveness=LIVENESS, accepts=AnyOutput
    ) as peer:
        tree = [(0, *await _settled_tree(inst, 0))]
        sessions: list[str] = []
        with step("sessions, one turn each", total=counts[-1]) as progress:
            for count in counts:
                while len(sessions) < count:
                    sessions.append(f"mem-{uuid.uuid4().hex[:12]}")
                    await first_delta(peer, sessions[-1], SPEC, limit_s=60)
                    progress.advance()
                tree.append((count, *await _settled_tree(inst, count)))
    return tree


async def _turns(inst: Instance, turns: int) -> dict[str, Any]:
    """Turns on a host of their own, whose idle workers are reaped after
    :data:`TURNS_IDLE_S`: ``turns`` new sessions each get a cold turn (its worker spawned)
    and at once a warm one (its worker idle); once every worker is reaped, each gets a
    resumed turn (a worker spawned again). Per kind: the starts to first delta (sorted), and
    the CPU time the host's tree spent per turn."""
    root = host_pid(inst)
    sessions = [f"turns-{uuid.uuid4().hex[:12]}" for _ in range(turns)]
    firsts: dict[str, list[float]] = {"cold": [], "warm": [], "resumed": []}
    spent = dict.fromkeys(firsts, 0.0)
    async with open_peer(
        "bench-rx", inst.bus_endpoint, liveness=LIVENESS, accepts=AnyOutput
    ) as peer:

        async def turn(kind: str, session_id: str) -> None:
            before = cpu_s(process_tree(root))
            firsts[kind].append(await first_delta(peer, session_id, SPEC, limit_s=60))
            spent[kind] += cpu_s(process_tree(root)) - before

        await quiet(root)
        with step("cold and warm turns", total=turns) as progress:
            for session_id in sessions:
                await turn("cold", session_id)
                await turn("warm", session_id)
                progress.advance()
        with step("idle workers reaped"), trio.fail_after(30 + TURNS_IDLE_S):
            while await trio.to_thread.run_sync(_live_workers, inst):
                await trio.sleep(0.1)
        await quiet(root)
        with step("resumed turns", total=turns) as progress:
            for session_id in sessions:
                await turn("resumed", session_id)
                progress.advance()
    rows: dict[str, Any] = {kind: sorted(values) for kind, values in firsts.items()}
    rows |= {f"{kind}_cpu_ms": spent[kind] / turns * 1000 for kind in firsts}
    return rows


def _figures(rows: dict[str, Any], floor: float, mode: str) -> list[Figure]:
    """The figures of one host, each named with its ``mode`` (``[zygote]``, ``[exec]``)."""
    return [{**f, "name": f"{f['name']} [{mode}]"} for f in _host_figures(rows, floor)]


def _host_figures(rows: dict[str, Any], floor: float) -> list[Figure]:
    tree = rows["tree"]
    _, base_pss, base_rss, base_procs = tree[0]
    out = [
        figure("host tree PSS, no session", base_pss, "MB", floor),
        figure("host tree RSS, no session", base_rss, "MB", floor),
        figure("host tree processes, no session", base_procs, "processes"),
    ]
    for count, pss, rss, _procs in tree[1:]:
        out += [
            figure(f"host tree PSS, +{count} sessions", pss, "MB", floor),
            figure(f"host tree RSS, +{count} sessions", rss, "MB", floor),
            figure(f"PSS per added session, +{count}", (pss - base_pss) / count, "MB", floor),
            figure(f"RSS per added session, +{count}", (rss - base_rss) / count, "MB", floor),
        ]
    ms = 1000
    for kind, what in TURN_KINDS.items():
        p50 = percentile(rows[kind], 0.5) * ms
        out += [
            figure(f"{kind} turn ({what}) to first delta p50", p50, "ms"),
            figure(f"host tree CPU per {kind} turn", rows[f"{kind}_cpu_ms"], "ms"),
        ]
    return out


def run(params: Mapping[str, object]) -> Document:
    """Measure and return the result document of docs/contract.md."""
    quick = bool(params.get("quick"))
    counts = (1, 10) if quick else (1, 10, 100)
    turns = 5 if quick else 20
    with step("baseline: a bare interpreter"):
        floor_pss, floor_rss = floor_mb()
    results = [figure("interpreter floor RSS", floor_rss, "MB", floor_pss)]
    for mode, option in MODES.items():
        with step(f"a host, workers by {mode}"):
            with running_host(CONFIG.format(idle_timeout_s=0) + option) as inst:
                rows: dict[str, Any] = {"tree": trio.run(_sessions, inst, counts)}
            with running_host(CONFIG.format(idle_timeout_s=TURNS_IDLE_S) + option) as inst:
                rows |= trio.run(_turns, inst, turns)
        results += _figures(rows, floor_pss, mode)
    return {
        "benchmark": "memory",
        "baseline": {
            "name": "interpreter floor PSS (python -c 'import trio, zmq, msgspec')",
            "value": round(floor_pss, 2),
            "unit": "MB",
        },
        "results": results,
        "params": {
            "sessions": list(counts),
            "turns": turns,
            "modes": list(MODES),
            "python": sys.version.split()[0],
        },
    }


if __name__ == "__main__":
    import json

    print(json.dumps(run({"quick": "--quick" in sys.argv})))
