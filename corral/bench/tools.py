"""``corral bench tools``: a tool call's round trip through the bus against a direct call.

A real host runs the policy and tools actors; this process stands in for dispatch. It sends a
turn's tool call (``sys_os_read`` of a small file) as a durable ``ToolCall`` to policy and
waits for the durable ``ToolOutcome``: dispatch → policy → tools → policy → dispatch, with
every hop durable (six broker commits). No server is configured, so policy allows without a
network round trip: the figure is what the bus and the actors add.

Baseline, same run: the same tool function called directly in this process. Target: the bus
adds ≤ 2 ms at p50.
"""

from __future__ import annotations

import json
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

import trio

from ..actors.dispatch.messages import PublishEvents
from ..actors.policy.messages import POLICY_ACTOR, ToolCall, ToolOutcome
from ..bus import open_peer
from ..config import LivenessSettings
from ..tools import registry
from ..tools._api import ToolContext
from ._common import Document, figure, percentile, running_host

LIVENESS = LivenessSettings(interval_s=0.5, liveness=4)
NAME = "bench-dispatch"


def _config(workspace: Path) -> str:
    return f"""
[liveness]
interval_s = 0.5
liveness = 4

[server]
enabled = false

[actors.tools.options]
workspace = "{workspace}"
"""


async def _direct(workspace: Path, n: int) -> list[float]:
    """Latencies of calling ``sys_os_read`` in this process."""

    async def publish(event: Mapping[str, object]) -> None:
        return None

    ctx = ToolContext(
        session_id="bench",
        call_id="bench",
        spec={},
        workspace=workspace,
        os_env_root=workspace,
        timeout_s=30,
        publish=publish,
        data_dir=workspace,
    )
    tool = registry.tool_table({})["sys_os_read"]
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        result = await tool.run(ctx, {"path": "note.txt"})
        out.append(time.perf_counter() - t0)
    assert "hello" in result
    return sorted(out)


async def _through_bus(endpoint: str, n: int) -> list[float]:
    """Latencies of the same call as a turn's tool call through policy and tools."""
    out = []
    async with open_peer(
        NAME, endpoint, liveness=LIVENESS, accepts=ToolOutcome | PublishEvents
    ) as peer:
        for i in range(n):
            call = ToolCall(
                session_id="bench-session",
                turn_id="bench-turn",
                call_id=f"call_{uuid.uuid4().hex[:12]}_{i}",
                name="sys_os_read",
                arguments=json.dumps({"path": "note.txt"}),
                reply_to=NAME,
            )
            t0 = time.perf_counter()
            await peer.cast(POLICY_ACTOR, call, durable=True)
            while True:
                incoming = await peer.inbox.receive()
                peer.ack(incoming)
                if isinstance(incoming.msg, ToolOutcome) and incoming.msg.call_id == call.call_id:
                    break
            out.append(time.perf_counter() - t0)
            assert '"hello' in incoming.msg.output, incoming.msg.output
    return sorted(out)


def run(params: Mapping[str, object]) -> Document:
    """Measure and return the result document of docs/contract.md."""
    n = 200 if params.get("quick") else 1000
    with tempfile.TemporaryDirectory(prefix="corral-bench-tools-") as tmp:
        workspace = Path(tmp)
        (workspace / "note.txt").write_text("hello\n")
        direct = trio.run(_direct, workspace, n)
        with running_host(_config(workspace)) as inst:
            trio.run(_through_bus, inst.bus_endpoint, 20)  # warm up: spawn, caches
            bus = trio.run(_through_bus, inst.bus_endpoint, n)
    base = percentile(direct, 0.5) * 1000
    p50, p99 = percentile(bus, 0.5) * 1000, percentile(bus, 0.99) * 1000
    return {
        "benchmark": "tools",
        "baseline": {"name": "direct call p50", "value": round(base, 4), "unit": "ms"},
        "results": [
            figure("bus round trip p50", p50, "ms", base),
            figure("bus round trip p99", p99, "ms", base),
            figure("direct call p99", percentile(direct, 0.99) * 1000, "ms", base),
            figure("added by the bus p50", p50 - base, "ms"),
        ],
        "params": {"calls": n, "tool": "sys_os_read", "hops": "dispatch→policy→tools→dispatch"},
    }
