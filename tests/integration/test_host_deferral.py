"""The ack discipline in a real host: real `corral up`, actor processes, broker and CLI."""

from __future__ import annotations

import json
from collections.abc import Callable

import trio

from corral.bus import Dedup, open_peer
from corral.config import LivenessSettings
from tests._defer import DeferFailOnce, DeferHold
from tests.conftest import FAST_LIVENESS, HostProcess, corral

FAST = LivenessSettings(interval_s=0.2, liveness=3)

#: The test actor alone (tests/_defer.py): none of the built-ins.
HOST_ACTORS: frozenset[str] = frozenset()

DEFER_HOST = (
    FAST_LIVENESS
    + """
[bus]
stuck_after_s = 0.5

[actors.defer]
target = "tests._defer:DeferActor"
"""
)


def _row(host: HostProcess) -> dict:
    return host.ask("mailboxes", actor="defer", peek=5)["mailboxes"][0]


async def test_a_failing_in_order_job_is_nacked_and_redelivered_and_a_hang_shows_stuck(
    host_factory: Callable[..., HostProcess],
) -> None:
    host = host_factory(DEFER_HOST).start()
    records = host.instance.actor_dir("defer") / "records.log"
    async with open_peer("test-client", host.endpoint, liveness=FAST) as peer:
        await peer.cast("defer", DeferFailOnce(key="k"), durable=True)
        await peer.cast("defer", DeferHold(), durable=True)
        with trio.fail_after(20):
            while Dedup(records).notes() != ["k"]:
                await trio.sleep(0.05)
            # The failed job's message came again and was acked; the held one stays.
            while (row := _row(host))["in_flight"] != 1 or row["stuck"] != 1:
                await trio.sleep(0.05)
    assert row["redelivered"] == 1
    assert [p["type"] for p in row["peek"]] == ["defer.hold"]
    assert [p["state"] for p in row["peek"]] == ["stuck"]
    state = str(host.state_dir)
    listing = corral("mailboxes", "--state-dir", state, "--json")
    assert listing.returncode == 0, listing.stderr
    (defer,) = [m for m in json.loads(listing.stdout)["mailboxes"] if m["actor"] == "defer"]
    assert defer["stuck"] == 1
    table = corral("mailboxes", "--state-dir", state)
    assert "stuck" in table.stdout
    assert host.actor("defer")["restarts"] == 0
    assert host.stop() == 0
    assert "stopping with 1 deferred messages unresolved" in host.log()
