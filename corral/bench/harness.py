"""``corral bench harness``: harness workers against the bus, measured in one run.

A real host (``corral up`` in a temporary state dir) runs the harness actor; this process
stands in for dispatch. Figures: cold spawn to first delta (a new session each time); a
worker killed with SIGKILL to its replacement's first delta; idle worker RSS; deltas/s from
one scripted worker to its consumer — against the bus's raw stream throughput between two
peers through the same broker (the baseline).
"""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import trio

from .._jsonlines import JsonObject
from ..actors._control import request
from ..bus import open_peer
from ..config import LivenessSettings
from ..harnesses.protocol import (
    HARNESS_ACTOR,
    AnyOutput,
    Output,
    OutputTextDelta,
    PolicyEvaluationRequested,
    PolicyVerdict,
    TurnStart,
    is_terminal,
)
from ..instance import Instance
from ._common import Document, figure, percentile, raw_stream_rate, running_host
from ._progress import step

LIVENESS = LivenessSettings(interval_s=0.5, liveness=4)


def _spec(*steps: JsonObject) -> JsonObject:
    return {
        "name": "bench",
        "executor": {"harness": "scripted", "script": {"turns": [list(steps)]}},
    }


def _message(text: str) -> JsonObject:
    return {
        "type": "message",
        "role": "user",
        "model": "bench",
        "content": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
        ],
    }


async def _start_turn(peer: Any, session_id: str, spec: JsonObject) -> str:
    """Ask the harness actor for a turn, as dispatch would; returns the turn id."""
    turn_id = uuid.uuid4().hex
    message = TurnStart(
        session_id=session_id,
        turn_id=turn_id,
        spec=spec,
        message=_message("go"),
        reply_to=peer.name,
    )
    await peer.cast(HARNESS_ACTOR, message, durable=True, session_id=session_id)
    return turn_id


async def first_delta(
    peer: Any, session_id: str, spec: JsonObject, *, limit_s: float = 30.0
) -> float:
    """A turn's start → its first text delta (s), standing in for dispatch: each policy
    evaluation the turn asks for is allowed."""
    t0 = time.perf_counter()
    turn_id = await _start_turn(peer, session_id, spec)
    first: float | None = None
    with trio.fail_after(limit_s):
        async for incoming in peer.inbox:
            peer.ack(incoming)
            msg = incoming.msg
            if not isinstance(msg, Output) or msg.turn_id != turn_id:
                continue
            if isinstance(msg, PolicyEvaluationRequested):
                verdict = PolicyVerdict(
                    session_id=session_id,
                    evaluation_id=msg.evaluation_id,
                    action="POLICY_ACTION_ALLOW",
                )
                await peer.call(HARNESS_ACTOR, verdict, timeout=10)
            elif first is None and isinstance(msg, OutputTextDelta):
                first = time.perf_counter() - t0
            if is_terminal(msg):
                if first is None:
                    raise RuntimeError(f"the turn streamed no text: {msg}")
                return first
    raise RuntimeError("the inbox closed before the turn ended")


async def _delta_rate(peer: Any, session_id: str, n: int) -> float:
    turn_id = await _start_turn(peer, session_id, _spec({"text": "x", "repeat": n}))
    got = 0
    t0 = 0.0
    with trio.fail_after(120):
        async for incoming in peer.inbox:
            peer.ack(incoming)
            msg = incoming.msg
            if not isinstance(msg, Output) or msg.turn_id != turn_id:
                continue
            if isinstance(msg, OutputTextDelta):
                if got == 0:
                    t0 = time.perf_counter()
                got += 1
            if is_terminal(msg):
                break
    return (got - 1) / (time.perf_counter() - t0)


def _workers(inst: Instance) -> list[JsonObject]:
    return request(inst.control_path, "inspect", actor="harness")["state"]["workers"]


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def _measure(inst: Instance, quick: bool) -> Document:
    n_cold = 5 if quick else 15
    n_deltas = 20_000 if quick else 100_000
    endpoint = inst.bus_endpoint
    async with open_peer("bench-rx", endpoint, liveness=LIVENESS, accepts=AnyOutput) as peer:
        spec = _spec({"text": "first"})
        cold = sorted([await first_delta(peer, f"cold-{i}", spec) for i in range(n_cold)])
        await trio.sleep(0.5)
        pids = {w["session_id"]: w["pid"] for w in await trio.to_thread.run_sync(_workers, inst)}
        rss = sorted(_rss_mb(pid) for pid in pids.values())
        replaced = []
        for i in range(n_cold):
            os.kill(pids[f"cold-{i}"], signal.SIGKILL)
            replaced.append(await first_delta(peer, f"cold-{i}", spec))
        replaced.sort()
        rate = await _delta_rate(peer, "rate", n_deltas)
        raw = await raw_stream_rate(endpoint, peer, n_deltas)
    return {
        "benchmark": "harness",
        "baseline": {
            "name": "bus stream peer->broker->peer (batched)",
            "value": round(raw, 1),
            "unit": "msgs/s",
        },
        "results": [
            figure("cold spawn to first delta p50", percentile(cold, 0.5) * 1000, "ms"),
            figure("cold spawn to first delta p99", percentile(cold, 0.99) * 1000, "ms"),
            figure(
                "kill -9 to replacement's first delta p50", percentile(replaced, 0.5) * 1000, "ms"
            ),
            figure(
                "kill -9 to replacement's first delta p99", percentile(replaced, 0.99) * 1000, "ms"
            ),
            figure("idle worker RSS (median)", percentile(rss, 0.5), "MB"),
            figure("deltas/s, one scripted worker", rate, "msgs/s", raw),
        ],
        "params": {"cold_spawns": n_cold, "deltas": n_deltas, "python": sys.version.split()[0]},
    }


def run(params: Mapping[str, object]) -> Document:
    """Run the harness benchmark and return the result document of docs/contract.md; with
    a ``kind``, the CLI harness kind's (:mod:`corral.bench.cli_harness`)."""
    if params.get("kind"):
        from . import cli_harness

        return cli_harness.run(str(params["kind"]), bool(params.get("quick")))
    config = "[liveness]\ninterval_s = 0.5\nliveness = 4\n"
    with running_host(config) as inst, step("worker spawns and turns"):
        return trio.run(_measure, inst, bool(params.get("quick")))


if __name__ == "__main__":
    import json

    print(json.dumps(run({"quick": "--quick" in sys.argv})))
