"""How long ``corral send``/``chat``'s client waits for a control plane it cannot reach.

The wait for a restarting plane counts from the first failure of a call, not from the call's
start: a request that hung until its read timeout on a plane the host then killed has not used
up the wait for the plane started in its place. Against an httpx mock transport, on trio's
real clock (the waits are fractions of a second).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest
import trio

from corral.cli._client import ControlPlane, NoControlPlane


def _state(tmp_path: Path) -> Path:
    """A state dir whose ``server.json`` names a live process (this one)."""
    state = tmp_path / "state"
    (state / "server").mkdir(parents=True)
    (state / "server" / "server.json").write_text(
        json.dumps({"url": "http://plane.test", "pid": os.getpid()})
    )
    (state / "server" / "client_token").write_text("t\n")
    return state


async def test_a_request_that_hung_past_the_wait_is_sent_again_to_the_restarted_plane(
    tmp_path: Path,
) -> None:
    calls: list[float] = []

    async def plane(request: httpx.Request) -> httpx.Response:
        calls.append(trio.current_time())
        if len(calls) == 1:
            # A stopped plane: the request waits out its read timeout, longer than the wait.
            await trio.sleep(0.6)
            raise httpx.ReadTimeout("timed out", request=request)
        return httpx.Response(202, json={"queued": True, "item_id": "i1"})

    async with ControlPlane(
        _state(tmp_path), connect_wait_s=0.5, transport=httpx.MockTransport(plane)
    ) as api:
        with trio.fail_after(10):
            answer = await api.post_message("s1", "hi")
    assert answer == {"queued": True, "item_id": "i1"}
    assert len(calls) == 2


async def test_a_plane_that_never_comes_back_ends_the_call_after_the_wait(
    tmp_path: Path,
) -> None:
    calls = 0

    async def gone(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        raise httpx.ConnectError("connection refused", request=request)

    async with ControlPlane(
        _state(tmp_path), connect_wait_s=0.5, transport=httpx.MockTransport(gone)
    ) as api:
        started = trio.current_time()
        with trio.fail_after(10), pytest.raises(NoControlPlane, match=r"for 0\.5s"):
            await api.session("s1")
    # It stops once its next retry would fall past the wait (each waits at most 1 s).
    assert 0.2 <= trio.current_time() - started < 2.0
    assert calls > 1, "retried within the wait"
