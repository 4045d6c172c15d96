"""``corral bench turn``: scripted workers → dispatch → a stand-in for the gateway.

A real host runs dispatch, harness and journal; this process is the gateway (it receives the
session events, in ``SessionEvents`` batches, and acks each batch at once) and sends the
messages that start turns. Figures: deltas/s with 1 and with 100 concurrent sessions; added
latency (a delta's send by its worker to its arrival here, through broker → dispatch →
broker) p50/p99, and the part of it dispatch adds. Baselines, same run: the bus's raw stream
throughput between two peers through the same broker, and the latency of messages paced like
the deltas over that same one-broker path.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Mapping
from typing import Any

import msgspec
import trio

from .._jsonlines import JsonObject
from ..actors.gateway.messages import Inbound as GatewayInbound
from ..actors.gateway.messages import events_of
from ..bus import open_peer
from ..config import LivenessSettings
from ..instance import Instance
from ..routes import HttpRequest
from ._common import (
    Document,
    figure,
    host_pid,
    percentile,
    quiet,
    raw_paced_latency,
    raw_stream_rate,
    running_host,
)
from ._messages import Count
from ._progress import step

LIVENESS = LivenessSettings(interval_s=0.5, liveness=4)
CONFIG = """
[liveness]
interval_s = 0.5
liveness = 4

# No embedded control plane: sessions must run default_spec, which a server would not know.
[server]
enabled = false

[actors.dispatch.options]
subscribers = ["bench-gw"]

[actors.journal.options]
fsync = "interval"
"""


class _Kind(msgspec.Struct):
    """The two fields of an event this stand-in looks at (decoding the rest would cost more
    CPU than dispatch spends on the event, on a machine dispatch shares)."""

    type: Any = None
    status: Any = None


_decode_kind = msgspec.json.Decoder(_Kind).decode


def _config(deltas: int) -> str:
    """No server: every session runs the default spec: a flood of ``deltas`` deltas, then a
    paced turn of 500 deltas 2 ms apart."""
    return CONFIG + (
        "[actors.dispatch.options.default_spec.executor]\n"
        'harness = "scripted"\n'
        f'script = {{turns = [[{{text = "x", repeat = {deltas}}}], '
        '[{text = "y", repeat = 500, delay_ms = 2}]]}\n'
    )


def _spec(n: int) -> JsonObject:
    return {
        "executor": {"harness": "scripted", "script": {"turns": [[{"text": "x", "repeat": n}]]}}
    }


async def _turns(peer: Any, ids: list[str], *, init: bool) -> tuple[float, list[float]]:
    """Start one turn per session; return deltas/s over all and per-delta latencies."""
    sessions = len(ids)
    for sid in ids if init else ():
        await peer.call(
            "dispatch",
            HttpRequest(
                request_id=sid,
                method="POST",
                path="/v1/sessions",
                body=json.dumps({"session_id": sid}).encode(),
            ),
            durable=True,
            timeout=60,
        )
    done = 0
    got = 0
    latencies: list[float] = []
    first = last = 0.0

    async def start(sid: str) -> None:
        body = {"type": "message", "role": "user", "content": "go"}
        await peer.call(
            "dispatch",
            HttpRequest(
                request_id=uuid.uuid4().hex,
                method="POST",
                path=f"/v1/sessions/{sid}/events",
                body=json.dumps(body).encode(),
            ),
            durable=True,
            timeout=120,
        )

    async with trio.open_nursery() as nursery:
        for sid in ids:
            nursery.start_soon(start, sid)
        with trio.fail_after(300):
            while done < sessions:
                incoming = await peer.inbox.receive()
                peer.ack(incoming)
                now = time.time()
                for msg in events_of(incoming.msg):
                    event = _decode_kind(msg.event)
                    if event.type == "response.output_text.delta":
                        if got == 0:
                            first = time.perf_counter()
                        got += 1
                        last = time.perf_counter()
                        if msg.origin_at:
                            latencies.append(now - msg.origin_at)
                    elif event.type == "session.status" and event.status in ("idle", "failed"):
                        done += 1
    return (got - 1) / max(last - first, 1e-9), sorted(latencies)


async def _phase(inst: Instance, sessions: int) -> tuple[float, list[float]]:
    """Turn 1 of each session floods (throughput); turn 2 is paced (latency at light load,
    so it starts once the host has digested the flood)."""
    ids = [uuid.uuid4().hex for _ in range(sessions)]
    async with open_peer(
        "bench-gw", inst.bus_endpoint, liveness=LIVENESS, accepts=GatewayInbound
    ) as peer:
        rate, _ = await _turns(peer, ids, init=True)
        await quiet(host_pid(inst))
        _, latencies = await _turns(peer, ids, init=False)
    return rate, latencies


async def _raw_phase(endpoint: str, n: int) -> tuple[float, list[float]]:
    """The bus alone, same host: stream throughput, and the latency of messages paced like
    the paced turn's deltas (what a delta would take without dispatch in its path)."""
    async with open_peer("bench-rx", endpoint, liveness=LIVENESS, accepts=Count) as peer:
        rate = await raw_stream_rate(endpoint, peer, n)
        return rate, await raw_paced_latency(endpoint, peer, 500, 2.0)


def run(params: Mapping[str, object]) -> Document:
    """Run the turn benchmark and return the result document of docs/contract.md."""
    quick = bool(params.get("quick"))
    one = 20_000 if quick else 100_000
    many_sessions = 20 if quick else 100
    per = 500 if quick else 1_000
    with running_host(_config(one)) as inst:
        with step(f"one session's turn of {one:,} deltas"):
            rate1, lat1 = trio.run(_phase, inst, 1)
        with step(f"baseline: {one:,} raw bus messages"):
            raw, raw_lat = trio.run(_raw_phase, inst.bus_endpoint, one)
    with running_host(_config(per)) as inst, step(f"{many_sessions} sessions' turns at once"):
        rate_many, lat_many = trio.run(_phase, inst, many_sessions)
    ms = 1000
    return {
        "benchmark": "turn",
        "baseline": {
            "name": "bus stream peer->broker->peer (batched)",
            "value": round(raw, 1),
            "unit": "msgs/s",
        },
        "results": [
            figure("deltas/s, 1 session", rate1, "msgs/s", raw),
            figure(f"deltas/s, {many_sessions} sessions", rate_many, "msgs/s", raw),
            figure(
                "paced delta latency worker->consumer p50, 1 session",
                percentile(lat1, 0.5) * ms,
                "ms",
            ),
            figure(
                "paced delta latency worker->consumer p99, 1 session",
                percentile(lat1, 0.99) * ms,
                "ms",
            ),
            figure(
                "raw bus latency peer->broker->peer p50 (paced alike)",
                percentile(raw_lat, 0.5) * ms,
                "ms",
            ),
            figure(
                "latency added by dispatch p50, 1 session",
                (percentile(lat1, 0.5) - percentile(raw_lat, 0.5)) * ms,
                "ms",
            ),
            figure(
                f"paced delta latency p50, {many_sessions} sessions",
                percentile(lat_many, 0.5) * ms,
                "ms",
            ),
            figure(
                f"paced delta latency p99, {many_sessions} sessions",
                percentile(lat_many, 0.99) * ms,
                "ms",
            ),
        ],
        "params": {
            "deltas_one_session": one,
            "sessions": many_sessions,
            "deltas_per_session": per,
            "python": sys.version.split()[0],
        },
    }


if __name__ == "__main__":
    print(json.dumps(run({"quick": "--quick" in sys.argv})))
