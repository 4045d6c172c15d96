"""``corral bench subagents``: the cost of orchestration — a fan-out against plain turns.

A real host with its embedded control plane serves scripted agents. For each fan-out size N,
one parent session's turn calls ``sys_session_send`` N times (children ``c0``..``c<N-1>`` of
a scripted sub-agent that answers at once); the clock runs from the POST of the parent's
message to the last child's result in the parent's inbox — the parent's stream tells it
(``session.child_session.updated``, done, which dispatch publishes once the result is in the
inbox). Baseline, same run: the same N children's work as N independent top-level sessions of
the same scripted agent, their messages posted at once, timed from the posts to the last
turn's end. The ratio is what the orchestration costs (the parent's turn, the sends, the
registry, the inbox pushes, the wakes).

Each size runs ``rounds`` times on the same sessions (a named child is continued, S-03): the
first round spawns the workers and is reported on its own (``cold``); the others give the
p50/p99. Between rounds the parent is let settle (every result's wake posted, the parent
idle), so that the next round starts alone.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import trio

from ..actors._control import request
from ..instance import Instance
from ._chaos_client import Event, PlaneClient, SessionLog
from ._common import Document, Figure, figure, percentile, running_host
from ._progress import step

CHILD = {
    "name": "echo",
    "executor": {"harness": "scripted", "script": {"turns": [[{"text": "done"}]]}},
}


@dataclass(frozen=True, slots=True)
class SubagentOptions:
    """What one run measures."""

    sizes: tuple[int, ...] = (1, 10, 50)
    #: Rounds per size; the first is the cold one.
    rounds: int = 4


def options_of(params: Mapping[str, object]) -> SubagentOptions:
    """The run's options from the CLI's parameters (``--quick``: smaller)."""
    return SubagentOptions(sizes=(1, 5), rounds=3) if params.get("quick") else SubagentOptions()


def parent_spec(n: int) -> dict[str, object]:
    """A parent that hands work to ``n`` children, then does nothing on its wakes.

    Turn *i* runs ``turns[i % len(turns)]``, *i* counting the user messages: each round is
    the user's message and ``n`` wakes (however they are batched), so with ``n + 1`` turns the
    next round's message is turn 0 again, and a wake never sends.
    """
    sends = [
        {"tool": "sys_session_send", "arguments": {"agent": "echo", "title": f"c{i}", "args": "go"}}
        for i in range(n)
    ]
    return {
        "name": f"fan{n}",
        "executor": {"harness": "scripted", "script": {"turns": [sends] + [[]] * n}},
        "tools": {"agents": ["echo"]},
    }


def _agents(root: Path, sizes: tuple[int, ...]) -> None:
    """The agents: ``fan<N>`` with its sub-agent ``echo``, and ``echo`` on its own."""
    for n in sizes:
        agent = root / f"fan{n}"
        (agent / "agents" / "echo").mkdir(parents=True)
        (agent / "config.yaml").write_text(json.dumps(parent_spec(n)))
        (agent / "agents" / "echo" / "config.yaml").write_text(json.dumps(CHILD))
    (root / "echo.yaml").write_text(json.dumps(CHILD))


def _config(agents: Path) -> str:
    return (
        "[liveness]\ninterval_s = 0.5\nliveness = 4\n"
        f"[server]\nagents_dirs = [{json.dumps(str(agents))}]\n"
        "[actors.gateway.options]\nbackoff_base_s = 0.05\nbackoff_cap_s = 0.5\n"
        # 50 workers spawned at once on a loaded machine: their first turn may take a while.
        "[actors.harness.options]\nstart_timeout_s = 120.0\n"
        '[actors.journal.options]\nfsync = "interval"\n'
    )


def _done(event: Event) -> str | None:
    """The child whose result is in the parent's inbox, if ``event`` says so."""
    if event.type != "session.child_session.updated":
        return None
    child = event.data.get("child")
    if not isinstance(child, dict) or child.get("busy"):
        return None
    return None if child.get("current_task_status") == "launching" else str(child.get("id"))


def _ended(event: Event) -> bool:
    return event.type == "session.status" and event.data.get("status") in ("idle", "failed")


class _Run:
    """One host's control plane and control socket, as the driver uses them."""

    def __init__(self, inst: Instance) -> None:
        self.inst = inst
        token = (inst.state_dir / "server" / "client_token").read_text().strip()
        self.client = PlaneClient(self._locate, token=token)

    def _locate(self) -> str | None:
        try:
            info = json.loads((self.inst.state_dir / "server" / "server.json").read_text())
        except (OSError, ValueError):
            return None
        return str(info["url"]).rstrip("/")

    async def settled(self, parent: str) -> None:
        """Every result of ``parent``'s children woke it, and its turns are over."""
        with trio.fail_after(120):
            while True:
                state = await trio.to_thread.run_sync(
                    lambda: request(self.inst.control_path, "inspect", actor="dispatch")["state"]
                )
                woken = all(e["woken"] for e in state["subagents"] if e["parent_id"] == parent)
                _, snapshot = await self.client.call("GET", f"/v1/sessions/{parent}")
                if woken and snapshot.get("status") == "idle":
                    return
                await trio.sleep(0.05)

    async def fan_out(self, parent: str, n: int) -> float:
        """Post the parent's message; seconds to the last of ``n`` results in its inbox."""
        log_ = SessionLog(parent)
        _, snapshot = await self.client.call("GET", f"/v1/sessions/{parent}")
        cursor = int(snapshot.get("last_event_id") or 0)
        log_.events.append(Event(0.0, cursor, "cursor", {}))
        results: set[str] = set()
        done = trio.Event()

        def on_event(event: Event) -> None:
            child = _done(event)
            if child is not None:
                results.add(child)
                if len(results) >= n:
                    done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.client.follow, log_, on_event)
            stored = await self.client.user_messages(parent)
            t0 = time.perf_counter()
            await self.client.post_message(parent, "go", stored)
            with trio.fail_after(300):
                await done.wait()
            elapsed = time.perf_counter() - t0
            nursery.cancel_scope.cancel()
        await self.settled(parent)
        return elapsed

    async def independent(self, sessions: list[str]) -> float:
        """Post one message to each session at once; seconds to the last turn's end."""
        logs = [SessionLog(s) for s in sessions]
        stored: dict[str, int] = {}
        for log_ in logs:
            _, snapshot = await self.client.call("GET", f"/v1/sessions/{log_.session_id}")
            log_.events.append(Event(0.0, int(snapshot.get("last_event_id") or 0), "cursor", {}))
            stored[log_.session_id] = await self.client.user_messages(log_.session_id)
        pending = set(sessions)
        done = trio.Event()

        def watcher(sid: str) -> Callable[[Event], None]:
            def on_event(event: Event) -> None:
                if _ended(event) and sid in pending:
                    pending.discard(sid)
                    if not pending:
                        done.set()

            return on_event

        async with trio.open_nursery() as nursery:
            for log_ in logs:
                nursery.start_soon(self.client.follow, log_, watcher(log_.session_id))
            t0 = time.perf_counter()
            async with trio.open_nursery() as posts:
                for sid in sessions:
                    posts.start_soon(self.client.post_message, sid, "go", stored[sid])
            with trio.fail_after(300):
                await done.wait()
            elapsed = time.perf_counter() - t0
            nursery.cancel_scope.cancel()
        return elapsed


async def _measure(inst: Instance, options: SubagentOptions) -> dict[int, tuple[list[float], ...]]:
    """Per size: the fan-out's and the independent turns' seconds, round by round."""
    await trio.to_thread.run_sync(_tunnel_connected, inst)
    run = _Run(inst)
    out: dict[int, tuple[list[float], ...]] = {}
    try:
        for n in options.sizes:
            parent = await run.client.create_session(f"fan{n}")
            sessions = [await run.client.create_session("echo") for _ in range(n)]
            fan, plain = [], []
            with step(f"fan-out to {n} children, rounds", total=options.rounds) as progress:
                for _ in range(options.rounds):
                    fan.append(await run.fan_out(parent, n))
                    plain.append(await run.independent(sessions))
                    progress.advance()
            out[n] = (fan, plain)
    finally:
        await run.client.aclose()
    return out


def _tunnel_connected(inst: Instance) -> None:
    deadline = time.monotonic() + 60
    while True:
        status = request(inst.control_path, "status")
        if status["server"] and any(t["state"] == "connected" for t in status["tunnels"]):
            return
        if time.monotonic() > deadline:
            raise RuntimeError("the benchmark host's runner never connected to its plane")
        time.sleep(0.05)


def figures(measured: dict[int, tuple[list[float], ...]]) -> tuple[float, list[Figure]]:
    """The baseline (one independent turn, warm, p50 in ms) and the result rows."""
    ms = 1000.0

    def warm(values: list[float]) -> list[float]:
        return sorted(values[1:] or values)

    first = min(measured)
    base = percentile(warm(measured[first][1]), 0.5) * ms
    rows: list[Figure] = []
    for n, (fan, plain) in sorted(measured.items()):
        fan_warm, plain_warm = warm(fan), warm(plain)
        fan50, plain50 = percentile(fan_warm, 0.5) * ms, percentile(plain_warm, 0.5) * ms
        rows += [
            figure(f"fan-out {n}: send -> last result in inbox p50", fan50, "ms", base),
            figure(
                f"fan-out {n}: send -> last result in inbox p99",
                percentile(fan_warm, 0.99) * ms,
                "ms",
                base,
            ),
            figure(f"fan-out {n}: cold (first round, workers spawned)", fan[0] * ms, "ms", base),
            figure(f"{n} independent turns: post -> last end p50", plain50, "ms", base),
            figure(
                f"{n} independent turns: post -> last end p99",
                percentile(plain_warm, 0.99) * ms,
                "ms",
                base,
            ),
            figure(
                f"cost of orchestration, {n} children (fan-out p50 / independent p50)",
                fan50 / plain50 if plain50 else 0.0,
                "x",
            ),
        ]
    return base, rows


def run(params: Mapping[str, object]) -> Document:
    """Run the sub-agent benchmark and return the result document of docs/contract.md."""
    options = options_of(params)
    agents = Path(tempfile.mkdtemp(prefix="corral-bench-agents-"))
    try:
        _agents(agents, options.sizes)
        with running_host(_config(agents)) as inst:
            measured = trio.run(_measure, inst, options)
    finally:
        shutil.rmtree(agents, ignore_errors=True)
    base, rows = figures(measured)
    return {
        "benchmark": "subagents",
        "baseline": {
            "name": f"{min(options.sizes)} independent top-level turn, post -> end p50",
            "value": round(base, 3),
            "unit": "ms",
        },
        "results": rows,
        "params": {
            "sizes": list(options.sizes),
            "rounds": options.rounds,
            "python": sys.version.split()[0],
        },
    }


if __name__ == "__main__":
    print(json.dumps(run({"quick": "--quick" in sys.argv})))
