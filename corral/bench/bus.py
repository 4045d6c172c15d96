"""``corral bench bus``: the bus against raw pyzmq, measured in one run.

Baseline: raw blocking pyzmq PUSH→PULL between two processes (frames of the size of one
encoded bus message). Results, each through a broker in its own process with the peers in
others: stream messages actor → broker → actor on the batched path; durable messages with
group commit (sender waits for durability, many tasks in flight, receiver acks); and the
request/reply round trip p50/p99 (one request at a time), each against its own baseline of
the same run: raw blocking pyzmq round trips over the same hops (a DEALER, a ROUTER process
that forwards, a DEALER echo process).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import trio
import zmq

from ..bus import encode_body, encode_envelope, open_peer
from ..bus._messages import Envelope
from ._common import Document, figure, percentile, start_role
from ._messages import Count, Ping

ROLES = "corral.bench._bus_roles"


def _ready(proc: Any) -> None:
    line = proc.stdout.readline()
    if line.strip() != "ready":
        raise RuntimeError(f"benchmark role failed to start: {line!r}")


def _go(proc: Any) -> None:
    proc.stdin.write("go\n")
    proc.stdin.flush()


def _finish(*procs: Any) -> None:
    for proc in procs:
        if proc.stdin and not proc.stdin.closed:
            proc.stdin.close()
    for proc in procs:
        try:
            proc.wait(30)
        except Exception:
            proc.kill()


def _message_size() -> int:
    env = Envelope(
        id="1234-abcdef-1a2b",
        sender="bench-tx",
        recipient="bench-rx",
        type="bench.count",
        body=encode_body(Count(n=12345)),
        created_at=time.time(),
    )
    return len(encode_envelope(env))


def baseline(endpoint: str, n: int, size: int) -> float:
    """Raw blocking PUSH→PULL between two processes, in messages per second."""
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.RCVHWM, 20_000)
    pull.bind(endpoint)
    proc = start_role(ROLES, "push", endpoint, str(n), str(size))
    _ready(proc)
    _go(proc)
    pull.recv()
    t0 = time.perf_counter()
    for _ in range(n - 1):
        pull.recv()
    elapsed = time.perf_counter() - t0
    _finish(proc)
    pull.close()
    ctx.term()
    return (n - 1) / elapsed


def raw_round_trips(endpoint: str, n: int, start: Callable[..., Any]) -> list[float]:
    """Raw blocking pyzmq round trips, sorted: a DEALER here → a ROUTER process → a DEALER
    echo process and back — the hops of a bus call, without the bus."""
    router = start("raw-router", endpoint)
    echo = start("raw-echo", endpoint)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, b"raw-client")
    sock.setsockopt(zmq.RCVTIMEO, 1000)
    sock.connect(endpoint)
    payload = b"x" * _message_size()
    try:
        # The router drops what it cannot route yet: ask until the echo has connected.
        deadline = time.monotonic() + 30
        while True:
            sock.send_multipart([b"raw-echo", payload])
            try:
                sock.recv_multipart()
                break
            except zmq.Again:
                if time.monotonic() > deadline:
                    raise RuntimeError("the raw echo never answered") from None
        for _ in range(200):
            sock.send_multipart([b"raw-echo", payload])
            sock.recv_multipart()
        times = []
        for _ in range(n):
            t = time.perf_counter()
            sock.send_multipart([b"raw-echo", payload])
            sock.recv_multipart()
            times.append(time.perf_counter() - t)
    finally:
        sock.close(0)
        ctx.term()
        _finish(echo, router)
    return sorted(times)


async def _receive(endpoint: str, sender: Any, n: int, *, ack: bool) -> float:
    async with open_peer("bench-rx", endpoint, accepts=Count) as peer:
        await trio.sleep(0.2)
        _go(sender)
        got = 0
        first = await peer.inbox.receive()
        if ack:
            peer.ack(first)
        t0 = time.perf_counter()
        with trio.fail_after(120):
            while got < n - 1:
                incoming = await peer.inbox.receive()
                batch = [incoming]
                # Drain what is already there without a checkpoint per message, as a
                # batching consumer would.
                while True:
                    try:
                        batch.append(peer.inbox.receive_nowait())
                    except trio.WouldBlock:
                        break
                if ack:
                    for item in batch:
                        peer.ack(item)
                got += len(batch)
        return got / (time.perf_counter() - t0)


async def _round_trips(endpoint: str, n: int) -> list[float]:
    async with open_peer("bench-client", endpoint) as peer:
        with trio.fail_after(60):
            while True:
                try:
                    await peer.call("bench-echo", Ping(text="warm"), timeout=1)
                    break
                except Exception:
                    await trio.sleep(0.05)
        for _ in range(200):
            await peer.call("bench-echo", Ping(text="warm"))
        times = []
        msg = Ping(text="x")
        for _ in range(n):
            t = time.perf_counter()
            await peer.call("bench-echo", msg)
            times.append(time.perf_counter() - t)
        return sorted(times)


def run(params: Mapping[str, object]) -> Document:
    """Run the bus benchmark and return the result document of docs/contract.md."""
    quick = bool(params.get("quick"))
    n_stream = 50_000 if quick else 300_000
    n_durable = 10_000 if quick else 60_000
    n_rtt = 1_000 if quick else 5_000
    tasks = 16
    durable_batch = 64
    size = _message_size()
    tmp = Path(tempfile.mkdtemp(prefix="corral-bench-"))
    started: list[Any] = []

    def role(*args: str) -> Any:
        proc = start_role(ROLES, *args)
        started.append(proc)
        _ready(proc)
        return proc

    try:
        base = baseline(f"ipc://{tmp}/raw.sock", n_stream, size)
        raw_rtts = raw_round_trips(f"ipc://{tmp}/raw-rtt.sock", n_rtt, role)
        endpoint = f"ipc://{tmp}/bus.sock"
        brk = role("broker", endpoint, str(tmp))
        tx = role("stream", endpoint, str(n_stream), "256")
        stream_rate = trio.run(partial(_receive, endpoint, tx, n_stream, ack=False))
        _finish(tx)
        tx = role("durable", endpoint, str(n_durable), str(tasks), str(durable_batch))
        durable_rate = trio.run(partial(_receive, endpoint, tx, n_durable, ack=True))
        _finish(tx)
        tx = role("durable", endpoint, str(n_durable // 2), "512", "1")
        durable_single = trio.run(partial(_receive, endpoint, tx, n_durable // 2, ack=True))
        _finish(tx)
        responder = role("echo", endpoint)
        rtts = trio.run(_round_trips, endpoint, n_rtt)
        _finish(responder, brk)
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "benchmark": "bus",
        "baseline": {
            "name": "raw pyzmq PUSH->PULL, 2 processes",
            "value": round(base, 1),
            "unit": "msgs/s",
        },
        "results": [
            figure("stream actor->broker->actor (batched)", stream_rate, "msgs/s", base),
            figure("durable with group commit (batched sends)", durable_rate, "msgs/s", base),
            figure(
                "durable with group commit (one per call, 512 tasks)",
                durable_single,
                "msgs/s",
                base,
            ),
            figure(
                "raw pyzmq round trip through a ROUTER process p50",
                percentile(raw_rtts, 0.5) * 1000,
                "ms",
            ),
            # Against the raw round trip of the same run, not the throughput baseline.
            figure(
                "request/reply round trip p50",
                percentile(rtts, 0.5) * 1000,
                "ms",
                percentile(raw_rtts, 0.5) * 1000,
            ),
            figure(
                "request/reply round trip p99",
                percentile(rtts, 0.99) * 1000,
                "ms",
                percentile(raw_rtts, 0.99) * 1000,
            ),
        ],
        "params": {
            "stream_messages": n_stream,
            "durable_messages": n_durable,
            "durable_sender_tasks": tasks,
            "durable_batch_per_task": durable_batch,
            "round_trips": n_rtt,
            "message_bytes": size,
            "transport": "ipc",
            "python": sys.version.split()[0],
            "zmq": zmq.zmq_version(),
        },
    }


if __name__ == "__main__":
    import json

    print(json.dumps(run({"quick": "--quick" in sys.argv})))
