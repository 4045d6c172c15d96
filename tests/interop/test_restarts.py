"""Restarts of the real server and of corral's gateway, mid-session (PROTOCOL_0_19.md §K, #13).

It stops and starts the server, so it has a stack of its own.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import wait_until

from ._stack import LogWatch, is_status, open_client, runner_online
from .conftest import Stack, running_stack


@pytest.fixture(scope="module")
def stack(omnigent_venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(omnigent_venv, tmp_path_factory.mktemp("restarts")) as s:
        yield s


def _restart_server(stack: Stack) -> None:
    """SIGTERM: uvicorn closes every runner tunnel with 1012 on its way down (§K.1)."""
    stack.server.stop(signal.SIGTERM)
    stack.server.start()


async def test_after_a_server_restart_the_runner_is_back_and_serves(stack: Stack) -> None:
    async with open_client(stack.server.url, stack.runner_id) as client:
        session = await client.session("history")
        stream = await client.open_stream(session)
        await client.turn(stream, "before")
        stream.close()
    _restart_server(stack)
    wait_until(lambda: runner_online(stack.server.url, stack.runner_id), 30, "runner back")
    # From here on: the server's own shutdown warnings (deregistering the runner) are its
    # business; what it logs about corral after the restart is not.
    watch = LogWatch(stack.server)
    watch.mark()
    async with open_client(stack.server.url, stack.runner_id) as client:
        stream = await client.open_stream(session)
        start, end = await client.turn(stream, "after")
        assert stream.text(start, end) == "users=2 before | after"
    assert not watch.problems()
    gateway_log = stack.host.log()
    assert "1012" in gateway_log, "the close was a server recycle"


async def test_a_gateway_kill9_mid_turn_loses_no_delta(stack: Stack) -> None:
    """Every delta of a turn reaches the client once, in order, although corral's gateway was
    killed in the middle (its durable stream buffer; the server sees a 1005, §K.4), and the
    saved answer is whole."""
    async with open_client(stack.server.url, stack.runner_id) as client:
        session = await client.session("slow")
        stream = await client.open_stream(session)
        start = len(stream.events)
        await client.say(session, "count")
        await stream.wait(lambda e: e.get("delta") == "s5 ", after=start)
        killed = _gateway_pid(stack)
        os.kill(killed, signal.SIGKILL)
        wait_until(lambda: _gateway_pid(stack) not in (0, killed), 20, "a new gateway")
        end, _ = await stream.wait(is_status("idle", "failed"), after=start, timeout=60)
        assert stream.text(start, end).split() == [f"s{i}" for i in range(40)]
        items = await client.wait_items(session, 2)
        assert "".join(p["text"] for p in items[-1]["content"]).split() == [
            f"s{i}" for i in range(40)
        ]


def _gateway_pid(stack: Stack) -> int:
    actor = stack.host.actor("gateway")
    return actor["pid"] if actor["state"] == "running" else 0
