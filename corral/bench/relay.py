"""``corral bench relay``: scripted workers → the whole host → the server's end of the tunnel.

A real host (``corral up`` in a temporary state dir: broker, dispatch, harness, journal,
gateway, with their default settings) serves one runner whose server is this process:
:class:`~corral.bench._tunnel_peer.TunnelPeer` accepts the gateway's tunnel, binds sessions
and posts messages as the server does (PROTOCOL_FACTS.md §v.1, §ii.7), and timestamps every
delta when its ``response.body`` frame arrives. No HTTP API server is needed: the host has
``[server] enabled = false`` and its runner is given to the gateway alone
(``[[actors.gateway.options.runners]]``) — a top-level ``[[runners]]`` would also hand the
server's URL to dispatch, which would then fetch agent specs and history from it — so
dispatch runs every session with ``default_spec``, a scripted agent.

Three hosts, so that no workload leaves work behind for the next: one session (cold first
deltas, then its flood, then memory), N sessions (their floods), latency (with the tap).

* **deltas/s** with 1 and with N concurrent sessions: each session's first turn (one delta)
  spawns its worker; its second floods; the rate is every flooded delta over the time from
  the first one's arrival to the last one's. Every session's deltas are checked complete and
  in order (one turn id, rising ``sequence_number``).
* **cold first delta**: from handing a brand-new session's first message to the socket to its
  first delta's arrival — spawning the worker included; sessions one after another.
* **added latency** of paced deltas (a turn streaming K deltas D ms apart), p50/p99, for N
  concurrent sessions and then for one. The latency is a delta's send by its worker to its
  arrival here. The worker's send time never crosses the tunnel (the wire format stays the
  server's), so it comes by a side channel: in the latency host, dispatch publishes session
  events to a second subscriber, ``bench-tap``, a bus peer in this process, and each
  :class:`~corral.actors.gateway.messages.SessionEvent` it gets carries ``origin_at`` (the worker's
  envelope time); the tap's copy and the tunnel's copy of a delta are matched on (turn id, sequence
  number). Both clocks are this machine's ``time.time()``. The tap costs dispatch one more durable
  send per batch, after the gateway's, so the pacing is chosen to leave dispatch idle between
  deltas; at N sessions some deltas may still wait behind a tap send.
* **memory** of the host's processes plus one session's worker (as the runner it replaces
  was measured: runner plus one harness), idle (after the session's first turn) and right
  after its flood, summed from ``/proc/PID/smaps_rollup``: RSS, and PSS, which does not
  count shared pages once per process.

Baseline, same run: raw trio-websocket frames/s from a client process to a server here
(:func:`~corral.bench._tunnel_peer.raw_frames_per_s`), one delta per frame, the receiver only
counting — the ceiling of the transport alone.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import sys
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from .._jsonlines import JsonObject
from ..actors._control import request
from ..actors.gateway.messages import Inbound, events_of
from ..bus import open_peer
from ..instance import Instance
from . import _omnigent_relay
from ._common import Document, figure, percentile, running_host
from ._progress import step
from ._tunnel_peer import (
    PeerError,
    TunnelPeer,
    delta_key,
    lone_errors,
    raw_frames_per_s,
)

RUNNER_ID = "bench-relay"
AGENT_ID = "bench-relay-agent"
TAP = "bench-tap"
#: Every session's first turn: one delta (spawns the worker; the cold figure times it).
WARM_TURN: list[JsonObject] = [{"text": "hi"}]
WARM_DELTAS = 1
Turns = list[list[JsonObject]]


@dataclass(frozen=True)
class Sizes:
    """The workloads of one run."""

    baseline_frames: int
    one_session_deltas: int
    sessions: int
    deltas_per_session: int
    cold_sessions: int
    #: Paced turns: deltas per session and their spacing, N sessions at once...
    paced_deltas: int
    paced_delay_ms: int
    #: ...then one session alone.
    single_paced_deltas: int
    single_paced_delay_ms: int

    @classmethod
    def full(cls) -> Sizes:
        # The 50 sessions' floods carry 100,000 deltas in all, as the one session's does: with
        # 600 a session (30,000, under a second) the rate measured mostly the ramp while the
        # 50 messages are posted one after another, not the host's sustained throughput.
        return cls(
            baseline_frames=100_000,
            one_session_deltas=100_000,
            sessions=50,
            deltas_per_session=2_000,
            cold_sessions=10,
            paced_deltas=40,
            paced_delay_ms=100,
            single_paced_deltas=300,
            single_paced_delay_ms=10,
        )

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            baseline_frames=20_000,
            one_session_deltas=20_000,
            sessions=20,
            deltas_per_session=500,
            cold_sessions=3,
            paced_deltas=20,
            paced_delay_ms=100,
            single_paced_deltas=100,
            single_paced_delay_ms=10,
        )


# --- the host ----------------------------------------------------------------------------------


def _toml(value: Any) -> str:
    """A TOML inline value (strings, ints, lists and tables are all the script needs)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value)


def host_config(server_url: str, turns: Turns, *, tap: bool = False, extra: str = "") -> str:
    """``corral.toml`` of a benchmark host: one runner for ``server_url``, a scripted agent;
    ``extra`` is appended (more tables)."""
    subscribers = ["gateway", TAP] if tap else ["gateway"]
    return (
        "[server]\nenabled = false\n\n"
        f"[actors.dispatch.options]\nsubscribers = {_toml(subscribers)}\n\n"
        "[actors.dispatch.options.default_spec.executor]\n"
        'harness = "scripted"\n'
        f"script = {_toml({'turns': turns})}\n\n"
        "[[actors.gateway.options.runners]]\n"
        f"server = {_toml(server_url)}\nid = {_toml(RUNNER_ID)}\n{extra}"
    )


@dataclass
class Relay:
    """A benchmark host and the server's end of its runner's tunnel."""

    peer: TunnelPeer
    inst: Instance
    #: With the tap: each delta's worker send time by (turn id, sequence number), filled as
    #: dispatch's copies arrive.
    origins: dict[tuple[str, int], float]


@asynccontextmanager
async def relay_host(turns: Turns, *, tap: bool = False, extra: str = "") -> AsyncIterator[Relay]:
    """A tunnel peer, a host whose runner is connected to it, and (with ``tap``) the tap;
    ``extra`` is more of the host's config (see :func:`host_config`)."""
    peer = TunnelPeer(RUNNER_ID)
    with lone_errors():
        async with trio.open_nursery() as nursery:
            await peer.start(nursery)
            host = running_host(host_config(peer.url, turns, tap=tap, extra=extra))
            inst: Instance = await trio.to_thread.run_sync(host.__enter__)
            try:
                relay = Relay(peer, inst, {})
                if tap:
                    # Connected before any session exists: dispatch's durable sends to the
                    # tap must find a peer the broker knows.
                    async with open_peer(TAP, inst.bus_endpoint, accepts=Inbound) as bus_peer:
                        nursery.start_soon(_tap, bus_peer, relay.origins)
                        await peer.wait_connected()
                        yield relay
                else:
                    await peer.wait_connected()
                    yield relay
            finally:
                # The host first, so that its gateway closes the tunnel itself (1000).
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(host.__exit__, None, None, None)
                nursery.cancel_scope.cancel()


async def _tap(bus_peer: Any, origins: dict[tuple[str, int], float]) -> None:
    """Keep each delta's worker send time (``origin_at``) from dispatch's event copies."""
    async for incoming in bus_peer.inbox:
        bus_peer.ack(incoming)
        for event in events_of(incoming.msg):
            key = delta_key(event.event)
            if key is not None and event.origin_at:
                origins[key] = event.origin_at


# --- sessions and turns ------------------------------------------------------------------------


async def bind_all(peer: TunnelPeer, ids: list[str]) -> None:
    """Bind new sessions, all at once (their streams are ``peer.streams[id]``)."""
    async with trio.open_nursery() as nursery:
        for sid in ids:
            nursery.start_soon(peer.bind, sid, AGENT_ID)


def check_turn(
    deltas: list[tuple[float, str, int]], expected: int, session_id: str = "?"
) -> list[tuple[float, str, int]]:
    """One turn's deltas, if complete (``expected`` of them) and in order; else PeerError."""
    if len(deltas) != expected:
        raise PeerError(f"session {session_id}: {len(deltas)} of {expected} deltas arrived")
    if len({turn for _, turn, _ in deltas}) > 1:
        raise PeerError(f"session {session_id}: deltas of several turns in one turn")
    for (_, _, a), (_, _, b) in itertools.pairwise(deltas):
        if b <= a:
            raise PeerError(f"session {session_id}: sequence number {b} arrived after {a}")
    return deltas


async def run_turn(
    peer: TunnelPeer, ids: list[str], expected: int, timeout: float
) -> dict[str, list[tuple[float, str, int]]]:
    """Post one message to each session at once; return each turn's checked deltas."""
    streams = [peer.streams[sid] for sid in ids]
    starts = [(len(s.deltas), len(s.ends) + 1) for s in streams]
    replies = [await peer.send_message(sid, AGENT_ID, "go") for sid in ids]
    for reply in replies:
        await reply.wait(timeout)
        if reply.status != 202:
            raise PeerError(f"POST .../events: {reply.status} {reply.body[:200]}")
    for stream, (_, ends) in zip(streams, starts, strict=True):
        await stream.wait_ends(ends, timeout)
    return {
        s.session_id: check_turn(s.deltas[first:], expected, s.session_id)
        for s, (first, _) in zip(streams, starts, strict=True)
    }


def _rate(turns: dict[str, list[tuple[float, str, int]]]) -> float:
    total = sum(len(d) for d in turns.values())
    first = min(d[0][0] for d in turns.values())
    last = max(d[-1][0] for d in turns.values())
    return (total - 1) / max(last - first, 1e-9)


async def cold_first_delta(peer: TunnelPeer, session_id: str, timeout: float = 60) -> float:
    """Bind a new session, post its first message; seconds from the post to its first delta."""
    stream = await peer.bind(session_id, AGENT_ID)
    reply = await peer.send_message(session_id, AGENT_ID, "hello")
    await stream.wait_ends(1, timeout)
    first = check_turn(stream.deltas, WARM_DELTAS, session_id)[0][0]
    return first - reply.sent_at


# --- the measurements --------------------------------------------------------------------------


@dataclass
class Throughput:
    """What a throughput host measured."""

    #: Flooded deltas/s, all sessions together.
    rate: float
    deltas: int
    #: ``response.body`` frames the flood came in (below ``deltas``: the gateway coalesced).
    frames: int
    #: Cold sessions' message → first delta, seconds, sorted.
    cold: list[float]
    #: (RSS, PSS) in MB of the host's processes and one worker, before and after the flood.
    idle_mb: tuple[float, float] | None
    flooded_mb: tuple[float, float] | None


async def measure_throughput(
    sessions: int, deltas: int, *, cold: int = 0, memory: bool = False
) -> Throughput:
    """``cold`` new sessions one by one, then every session's flood of ``deltas`` at once.

    The first ``sessions`` of the (``max(sessions, cold)``) sessions flood; the ones not
    timed cold are warmed first, so that no flood waits for a spawn.
    """
    turns: Turns = [WARM_TURN, [{"text": "x", "repeat": deltas}]]
    timeout = 60 + sessions * deltas / 1000
    async with relay_host(turns) as relay:
        peer = relay.peer
        ids = [uuid.uuid4().hex for _ in range(max(sessions, cold))]
        cold_s = sorted([await cold_first_delta(peer, sid) for sid in ids[:cold]])
        warm = ids[cold:]
        await bind_all(peer, warm)
        if warm:
            await run_turn(peer, warm, WARM_DELTAS, 60 + len(warm))
        idle_mb = flooded_mb = None
        if memory:
            idle_mb = await trio.to_thread.run_sync(host_memory_mb, relay.inst, ids[0])
        frames_before = sum(peer.streams[sid].frames for sid in ids[:sessions])
        flooded = await run_turn(peer, ids[:sessions], deltas, timeout)
        frames = sum(peer.streams[sid].frames for sid in ids[:sessions]) - frames_before
        if memory:
            flooded_mb = await trio.to_thread.run_sync(host_memory_mb, relay.inst, ids[0])
    return Throughput(
        rate=_rate(flooded),
        deltas=sum(len(d) for d in flooded.values()),
        frames=frames,
        cold=cold_s,
        idle_mb=idle_mb,
        flooded_mb=flooded_mb,
    )


@dataclass
class Latency:
    """Paced delta latencies (seconds, sorted), N sessions at once and one alone."""

    many: list[float]
    single: list[float]


async def measure_latency(sizes: Sizes) -> Latency:
    """Paced turns of ``sizes.sessions`` sessions at once, then of one session alone."""
    turns = [
        WARM_TURN,
        [{"text": "y", "repeat": sizes.paced_deltas, "delay_ms": sizes.paced_delay_ms}],
        [
            {
                "text": "z",
                "repeat": sizes.single_paced_deltas,
                "delay_ms": sizes.single_paced_delay_ms,
            }
        ],
    ]
    async with relay_host(turns, tap=True) as relay:
        peer, origins = relay.peer, relay.origins
        ids = [uuid.uuid4().hex for _ in range(sizes.sessions)]
        await bind_all(peer, ids)
        await run_turn(peer, ids, WARM_DELTAS, 60 + len(ids))
        pace = sizes.paced_deltas * sizes.paced_delay_ms / 1000
        many = await run_turn(peer, ids, sizes.paced_deltas, 60 + pace)
        pace = sizes.single_paced_deltas * sizes.single_paced_delay_ms / 1000
        single = await run_turn(peer, ids[:1], sizes.single_paced_deltas, 60 + pace)
        arrived = [d for turns_ in (many, single) for ds in turns_.values() for d in ds]
        # The tap's copies travel behind the gateway's (a second durable send).
        with trio.move_on_after(30):
            while not all((turn, seq) in origins for _, turn, seq in arrived):
                await trio.sleep(0.05)
        offset = time.time() - time.perf_counter()

        def latencies(turns_: dict[str, list[tuple[float, str, int]]]) -> list[float]:
            out = []
            for ds in turns_.values():
                for arrival, turn, seq in ds:
                    origin = origins.get((turn, seq))
                    if origin is None:
                        raise PeerError(f"the tap never saw delta {seq} of turn {turn}")
                    out.append(arrival + offset - origin)
            return sorted(out)

        return Latency(many=latencies(many), single=latencies(single))


def _memory_mb(pid: int) -> tuple[float, float]:
    """(RSS, PSS) of a process in MB: PSS splits shared pages (the interpreter, libraries)
    among the processes that map them, so PSS figures add up where RSS ones overcount."""
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("Rss", "Pss"):
            fields[key] = int(rest.split()[0]) / 1024
    return fields.get("Rss", 0.0), fields.get("Pss", 0.0)


def host_memory_mb(inst: Instance, session_id: str) -> tuple[float, float]:
    """Summed (RSS, PSS) in MB of the host process, its actors and one session's worker."""
    status = request(inst.control_path, "status")
    pids = [status["host"]["pid"], *(a["pid"] for a in status["actors"] if a.get("pid"))]
    workers = [w["pid"] for w in status["workers"] if w["session_id"] == session_id]
    if len(workers) != 1 or not workers[0]:
        raise PeerError(f"no single live worker for session {session_id}: {workers}")
    sizes = [_memory_mb(pid) for pid in [*pids, workers[0]]]
    return sum(rss for rss, _ in sizes), sum(pss for _, pss in sizes)


# --- the run -----------------------------------------------------------------------------------


async def measure(sizes: Sizes) -> Document:
    """Every figure of the benchmark, as the result document of docs/contract.md."""
    raw = await raw_frames_per_s(sizes.baseline_frames)
    one = await measure_throughput(
        1, sizes.one_session_deltas, cold=sizes.cold_sessions, memory=True
    )
    many = await measure_throughput(sizes.sessions, sizes.deltas_per_session)
    lat = await measure_latency(sizes)
    n = sizes.sessions
    ms = 1000
    assert one.idle_mb is not None and one.flooded_mb is not None  # memory=True
    idle_rss, idle_pss = one.idle_mb
    rss, pss = one.flooded_mb
    return {
        "benchmark": "relay",
        "baseline": {
            "name": "raw trio-websocket frames, client process -> server (one delta per frame)",
            "value": round(raw, 1),
            "unit": "frames/s",
        },
        "results": [
            figure("deltas/s worker->host->server, 1 session", one.rate, "msgs/s", raw),
            figure(f"deltas/s worker->host->server, {n} sessions", many.rate, "msgs/s", raw),
            figure(
                "cold session: message to first delta p50", percentile(one.cold, 0.5) * ms, "ms"
            ),
            figure(
                "cold session: message to first delta p99", percentile(one.cold, 0.99) * ms, "ms"
            ),
            figure(
                "paced delta latency worker->server p50, 1 session",
                percentile(lat.single, 0.5) * ms,
                "ms",
            ),
            figure(
                "paced delta latency worker->server p99, 1 session",
                percentile(lat.single, 0.99) * ms,
                "ms",
            ),
            figure(
                f"paced delta latency worker->server p50, {n} sessions",
                percentile(lat.many, 0.5) * ms,
                "ms",
            ),
            figure(
                f"paced delta latency worker->server p99, {n} sessions",
                percentile(lat.many, 0.99) * ms,
                "ms",
            ),
            figure("RSS host processes + one worker, idle", idle_rss, "MB"),
            figure("PSS host processes + one worker, idle", idle_pss, "MB"),
            figure("RSS host processes + one worker, after the 1-session flood", rss, "MB"),
            figure("PSS host processes + one worker, after the 1-session flood", pss, "MB"),
        ],
        "params": {
            "baseline_frames": sizes.baseline_frames,
            "deltas_one_session": sizes.one_session_deltas,
            "sessions": n,
            "deltas_per_session": sizes.deltas_per_session,
            "cold_sessions": sizes.cold_sessions,
            # How much the gateway coalesced: deltas per response.body frame in each flood.
            "deltas_per_frame_1_session": round(one.deltas / max(one.frames, 1), 2),
            f"deltas_per_frame_{n}_sessions": round(many.deltas / max(many.frames, 1), 2),
            "paced": f"{n} sessions x {sizes.paced_deltas} deltas {sizes.paced_delay_ms} ms apart",
            "paced_single": (
                f"1 session x {sizes.single_paced_deltas} deltas "
                f"{sizes.single_paced_delay_ms} ms apart"
            ),
            "python": sys.version.split()[0],
        },
    }


def run(params: Mapping[str, object]) -> Document:
    """Run the relay benchmark and return the result document of docs/contract.md; with
    ``against``, corral beside that runner on the real omnigent server
    (:mod:`._omnigent_relay`)."""
    if params.get("against") is not None:
        return _omnigent_relay.run(str(params["against"]), quick=bool(params.get("quick")))
    sizes = Sizes.quick() if params.get("quick") else Sizes.full()
    deltas = params.get("deltas")
    if isinstance(deltas, int):
        sizes = dataclasses.replace(sizes, one_session_deltas=deltas)
    with step("relaying turns through a tunnel"):
        return trio.run(measure, sizes)


if __name__ == "__main__":
    print(json.dumps(run({"quick": "--quick" in sys.argv})))
