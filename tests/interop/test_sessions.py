"""Session lifecycle and the tunnel's 0.19 handshake, through the real server (#13)."""

from __future__ import annotations

import httpx

from corral.harnesses import HARNESSES

from ._stack import Client


async def test_deleting_a_session_is_answered_and_forgotten(client: Client, stack) -> None:
    """§I.1: the server tunnels ``DELETE /v1/sessions/{id}``; corral answered 404 and kept
    the session and its stream."""
    session = await client.session("plain")
    stream = await client.open_stream(session)
    await client.turn(stream, "before the delete")
    stream.close()  # the server ends this viewer's stream with the session
    r = await client.http.delete(f"/v1/sessions/{session}")
    assert r.status_code == 200, r.text
    assert r.json()["deleted"] is True
    r = await client.http.get(f"/v1/sessions/{session}")
    assert r.status_code == 404
    assert "no route DELETE" not in stack.host.log()


def test_the_runner_advertises_only_harnesses_it_can_run(stack) -> None:
    """§L: omnigent's runner advertises a fixed list; corral names what this host runs, so
    the server routes no session here that would fail."""
    r = httpx.get(f"{stack.server.url}/v1/runners", timeout=10)
    runner = next(x for x in r.json()["data"] if x["runner_id"] == stack.runner_id)
    assert runner["online"] is True
    assert "openai-agents" in runner["harnesses"]
    assert set(runner["harnesses"]) <= set(HARNESSES)


def test_the_hello_asks_for_event_ready(stack) -> None:
    """§A.2/A.3: with ``session-event-ingest-v1`` in its hello's capabilities, the server
    answers ``event.ready``; the gateway's tunnel status shows it."""
    tunnels = [t for t in stack.host.status()["tunnels"] if t["runner_id"] == stack.runner_id]
    assert tunnels and tunnels[0]["state"] == "connected"
    assert tunnels[0]["event_ready"] is True
    assert len(tunnels[0]["connection_id"]) == 32
