"""The real omnigent server dies with corral's frames in its socket (issue #15, item 3).

The worst moment for the runner → server stream: the server has stopped reading its tunnel,
the gateway's writes still return (the kernel takes the frames), and then ``kill -9`` throws
the frames away with the socket. The server is stopped with SIGSTOP for that window, the
gateway is seen to write the turn's deltas into it, and the server is killed and started
again. omnigent 0.19.1 has no acknowledgement for stream events and its relay reads no event
id (it appends a replayed delta to its text a second time), so corral may send again only
what the server's process never read: what no WebSocket ping after it proved read.

It kills the server, so it has a stack of its own.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until

from ._stack import is_status, open_client, runner_online
from .conftest import Stack, running_stack

WORDS = [f"s{i}" for i in range(40)]


@pytest.fixture(scope="module")
def stack(omnigent_venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(omnigent_venv, tmp_path_factory.mktemp("outage")) as s:
        yield s


def _gateway(stack: Stack) -> dict[str, Any]:
    return stack.host.ask("inspect", actor="gateway")["state"]


@pytest.mark.chaos
async def test_deltas_a_killed_server_never_read_are_sent_to_its_next_process(
    stack: Stack,
) -> None:
    server = stack.server
    async with open_client(server.url, stack.runner_id) as client:
        session = await client.session("slow")
        stream = await client.open_stream(session)
        start = len(stream.events)
        await client.say(session, "count")
        await stream.wait(lambda e: e.get("delta") == "s5 ", after=start)
        # The server answers the gateway's pings: what it read is confirmed as it goes.
        wait_until(
            lambda: _gateway(stack)["buffer"]["confirmed_by_ping"] >= 5, 10, "pings answered"
        )
        assert server.proc is not None
        os.killpg(server.proc.pid, signal.SIGSTOP)
        seen = stream.text(start).split()
        try:
            written = _gateway(stack)["buffer"]["events"]
            wait_until(
                lambda: (
                    (s := _gateway(stack))["buffer"]["events"] >= written + 6
                    and s.get("unsent_events", s["pending_events"]) == 0
                ),
                30,
                "the gateway to write deltas into the stopped server's socket",
            )
            # Written, and never read: no ping came back.
            assert _gateway(stack)["pending_events"] >= 6
        finally:
            server.stop(signal.SIGKILL)
    server.start()
    # Listen before the runner is back: the new process relays what it is sent from then on.
    if runner_online(server.url, stack.runner_id):
        pytest.skip("the runner reconnected before the client could listen")
    async with open_client(server.url, stack.runner_id) as client:
        after = await client.open_stream(session)
        end, _ = await after.wait(is_status("idle", "failed"), timeout=90)
        relayed = after.text(0, end).split()
    # The new process gets the turn from the first delta its predecessor never read: none
    # of the deltas written into the stopped server is missing, none comes twice.
    assert relayed and relayed[-1] == WORDS[-1], relayed
    first = WORDS.index(relayed[0])
    assert relayed == WORDS[first:], relayed
    assert first <= len(seen) + 1, f"deltas lost in the killed server's socket: {relayed[:3]}"
    assert _gateway(stack)["buffer"]["resent"] >= 6
