"""Runner → server events survive the server's death (issue #15, item 3), and a message POST
the control plane dropped is posted again, once (item 2).

A real ``corral up`` with its embedded control plane and the real ``corral send``. The worst
moment for the events is a control plane that stopped reading its tunnel: the gateway's frames
are taken by the kernel (a write returns) but never reach the process, and ``kill -9`` then
throws them away with the socket. The plane is stopped with SIGSTOP for exactly that window,
the gateway is seen to write the turn's events into it, and the plane is killed. What the
client must see afterwards is the whole-system invariant: every event the runner published
reaches it once and in order, the turn has exactly one terminal edge, nothing hangs.

The last part sets turns up while the server is unavailable: dispatch with a fake omnigent
server whose GETs of the session drop their connection, as a restarting plane does.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from corral.actors.gateway import StreamBuffer
from corral.cli._client import ControlPlane, TurnFollower, run_turn
from tests.conftest import FAST_LIVENESS, HostProcess, wait_until
from tests.fake_server import FakeOmnigentServer, Fault
from tests.integration._gateway import fake_gateway, scripted_yaml
from tests.integration.test_dispatch import _dhost
from tests.integration.test_e2e import AGENTS as E2E_AGENTS
from tests.integration.test_e2e import SLOW_FIRST as FIRST
from tests.integration.test_e2e import SLOW_SECOND as SECOND

APPROVED = "approved-and-done"

AGENTS = {
    # test_e2e's: ~60 deltas over ~4 s with a tool call between.
    "slow.yaml": E2E_AGENTS["slow.yaml"],
    # Streams, then asks for an approval: the request is the event a client must not miss.
    "asks.yaml": f"""
        name: asks
        executor:
          harness: scripted
          script:
            turns:
              - - {{text: "{FIRST}", chunk: 1, delay_ms: 40}}
                - elicit:
                    message: "May I finish?"
                    requestedSchema:
                      type: object
                      properties:
                        ok: {{type: boolean}}
                - {{text: "{APPROVED}", on_decline: "declined"}}
        """,
}


def _config(agents_dir: Path) -> str:
    return (
        FAST_LIVENESS
        # The random-moments test kills the plane six times; on a fast VM its six turns take
        # under 10 s, and the default intensity (5 in 10 s) then stopped the host.
        + "[supervisor]\nintensity = 20\n"
        + "[actors.gateway.options]\nbackoff_base_s = 0.05\nbackoff_cap_s = 0.2\n"
        + f"[server]\nagents_dirs = [{json.dumps(str(agents_dir))}]\n"
    )


@pytest.fixture
def plane_host(tmp_path: Path, host_factory: Callable[..., HostProcess]) -> HostProcess:
    agents = tmp_path / "agents"
    agents.mkdir()
    for name, text in AGENTS.items():
        (agents / name).write_text(textwrap.dedent(text))
    host = host_factory(_config(agents)).start()
    wait_until(lambda: (_plane(host) or {}).get("state") == "running", 30, "the control plane")
    wait_until(
        lambda: any(t["state"] == "connected" for t in host.status()["tunnels"]),
        30,
        "the runner's tunnel",
    )
    return host


def _plane(host: HostProcess) -> dict[str, Any] | None:
    return host.status()["server"]


def _gateway(host: HostProcess) -> dict[str, Any]:
    return host.ask("inspect", actor="gateway")["state"]


def _unsent(state: dict[str, Any]) -> int:
    # Events not yet written on a stream (before item 3 every written event left the
    # buffer, so pending_events said the same).
    return int(state.get("unsent_events", state["pending_events"]))


def _send(host: HostProcess, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "corral", "send", *args, "--json", "--timeout", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "CORRAL_STATE_DIR": str(host.state_dir)},
    )


def _finish(send: subprocess.Popen[str]) -> tuple[int, dict[str, Any], str]:
    try:
        out, err = send.communicate(timeout=120)
    finally:
        if send.poll() is None:
            send.kill()
            send.wait(10)
    try:
        result = json.loads(out)
    except ValueError:
        raise AssertionError(f"send printed no JSON (exit {send.returncode}): {err}") from None
    return send.returncode, result, err


def _last_event_id(host: HostProcess, url: str, agent: str) -> int:
    try:
        auth = host.client_headers()
        sessions = httpx.get(f"{url}/v1/sessions", headers=auth, timeout=5).json()["data"]
    except httpx.HTTPError:
        return 0
    return max((s["last_event_id"] for s in sessions if s["agent"] == agent), default=0)


def _check_once_in_order(events: list[dict[str, Any]], end: str = "idle") -> None:
    """Stream ids unique and contiguous, one running and one terminal edge (``end``)."""
    ids = [e["event_id"] for e in events]
    assert ids == list(range(ids[0], ids[0] + len(ids))), ids
    edges = [e["status"] for e in events if e["type"] == "session.status"]
    assert edges == ["running", end], edges


def _stop_plane_while_the_gateway_writes(host: HostProcess, url: str, agent: str) -> int:
    """Let the turn stream a little, SIGSTOP the plane, wait until the gateway has written
    more of the turn into the stopped plane's socket, then ``kill -9`` it. Returns its pid."""
    pid = _plane(host)["pid"]  # type: ignore[index]
    wait_until(lambda: _last_event_id(host, url, agent) >= 6, 30, "the turn to stream")
    os.kill(pid, signal.SIGSTOP)
    try:
        written = _gateway(host)["buffer"]["events"]
        # The gateway takes more events and writes every one of them to the tunnel: the
        # kernel takes them, the stopped plane never reads them.
        wait_until(
            lambda: (s := _gateway(host))["buffer"]["events"] >= written + 6 and _unsent(s) == 0,
            30,
            "the gateway to write events into the stopped plane's socket",
        )
    finally:
        os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):  # reaped already
            os.kill(pid, signal.SIGCONT)
    return pid


@pytest.mark.chaos
def test_events_the_gateway_wrote_to_a_killed_control_plane_reach_the_client(
    plane_host: HostProcess,
) -> None:
    host = plane_host
    url = _plane(host)["url"]  # type: ignore[index]
    send = _send(host, "--agent", "slow", "go")
    killed = _stop_plane_while_the_gateway_writes(host, url, "slow")
    code, result, err = _finish(send)
    assert code == 0, err
    assert result["status"] == "idle"
    assert result["text"] == FIRST + SECOND, "deltas lost or repeated"
    _check_once_in_order(result["events"])
    deltas = [e for e in result["events"] if e["type"] == "response.output_text.delta"]
    assert len(deltas) == len(FIRST + SECOND)
    plane = _plane(host)
    assert plane is not None and plane["pid"] != killed and plane["restarts"] >= 1


@pytest.mark.chaos
def test_an_approval_request_written_to_a_killed_control_plane_is_answered(
    plane_host: HostProcess,
) -> None:
    # The hang: the runner journaled the elicitation request, the client's stream
    # ended one event before it, and the turn sat parked until --timeout.
    host = plane_host
    url = _plane(host)["url"]  # type: ignore[index]
    send = _send(host, "--agent", "asks", "--approve", "go")
    pid = _plane(host)["pid"]  # type: ignore[index]
    wait_until(lambda: _last_event_id(host, url, "asks") >= 6, 30, "the turn to stream")
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_until(
            lambda: host.ask("elicitations")["elicitations"], 30, "the runner to park the approval"
        )
        wait_until(
            lambda: _unsent(_gateway(host)) == 0,
            30,
            "the gateway to write the request into the stopped plane's socket",
        )
    finally:
        os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):  # reaped already
            os.kill(pid, signal.SIGCONT)
    code, result, err = _finish(send)
    assert code == 0, err
    assert (result["status"], result["text"]) == ("idle", FIRST + APPROVED)
    _check_once_in_order(result["events"])
    types = [e["type"] for e in result["events"]]
    assert types.count("response.elicitation_request") == 1


# --- the message POST (item 2) --------------------------------------------------------------


def _socket_holds_a_request(pid: int, port: int) -> bool:
    """Whether a TCP connection from process ``pid`` to ``port`` has bytes waiting, unread,
    in the socket of the other end (``/proc/net/tcp``: the server side's ``rx_queue``)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    rows = [line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:]]
    ours = {int(r[1].split(":")[1], 16) for r in rows if r[9] in inodes}
    return any(
        int(r[1].split(":")[1], 16) == port
        and int(r[2].split(":")[1], 16) in ours
        and int(r[4].split(":")[1], 16) > 0
        for r in rows
    )


def _items(host: HostProcess, url: str, session_id: str) -> list[dict[str, Any]]:
    path = f"/v1/sessions/{session_id}/items?order=asc&limit=100"
    page = httpx.get(url + path, headers=host.client_headers(), timeout=5)
    return list(page.json()["data"])


class _KillDuringPost(ControlPlane):
    """A client whose message POST is in the control plane's socket when ``kill -9`` hits:
    the plane is stopped, the POST is sent, the bytes are seen waiting unread on the plane's
    side, and the plane is killed."""

    plane_pid = 0
    port = 0
    killed = False

    async def post_message(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        os.kill(self.plane_pid, signal.SIGSTOP)
        answer: dict[str, Any] = {}

        async def post() -> None:
            answer.update(await super(_KillDuringPost, self).post_message(*args, **kwargs))

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(post)
                await trio.to_thread.run_sync(
                    wait_until,
                    lambda: _socket_holds_a_request(os.getpid(), self.port),
                    20,
                    "the POST to wait in the stopped plane's socket",
                )
                os.kill(self.plane_pid, signal.SIGKILL)
                self.killed = True
        finally:
            with contextlib.suppress(ProcessLookupError):  # reaped already
                os.kill(self.plane_pid, signal.SIGCONT)
        return answer


async def _decline(event: object) -> str:
    return "decline"


async def _slow_turn(api: ControlPlane) -> tuple[dict[str, Any], TurnFollower]:
    """A new session of the slow agent and its first turn ("go"), its approvals declined."""
    session = await api.create_session("slow")
    with trio.fail_after(120):
        turn = await run_turn(
            api,
            session["id"],
            str(session["last_event_id"]),
            "go",
            on_event=lambda e: None,
            decide=_decline,
            follower=TurnFollower(session["id"]),
        )
    return session, turn


@pytest.mark.chaos
async def test_a_message_post_cut_off_by_kill9_is_posted_again_and_runs_once(
    plane_host: HostProcess,
) -> None:
    host = plane_host
    plane = await trio.to_thread.run_sync(_plane, host)
    assert plane is not None
    async with _KillDuringPost(host.state_dir) as api:
        api.plane_pid, api.port = plane["pid"], int(plane["url"].rsplit(":", 1)[1])
        session, turn = await _slow_turn(api)
    assert api.killed
    assert (turn.status, turn.error, turn.text) == ("idle", None, FIRST + SECOND)
    _check_once_in_order(turn.events)
    items = await trio.to_thread.run_sync(_items, host, plane["url"], session["id"])
    users = [i for i in items if i["type"] == "message" and i.get("role") == "user"]
    assistants = [i for i in items if i["type"] == "message" and i.get("role") == "assistant"]
    assert len(users) == 1, "the message is stored once"
    assert turn.item_id == users[0]["id"]
    assert len(assistants) == 2, "one turn: text, tool call, text (no second run)"


class _KillWhenLooking(ControlPlane):
    """A client that ``kill -9``s the control plane at the moment it looks for it to post
    the message: the stream is open, the URL is forgotten, and the plane dies before
    ``server.json`` and ``host.json`` are read."""

    plane_pid = 0
    killed = False
    posting = False

    async def url(self, *, until: float | None = None) -> str:
        if self.posting and not self.killed:
            self._url = None  # look again, as after a failure
            os.kill(self.plane_pid, signal.SIGKILL)
            self.killed = True
        return await super().url(until=until)

    async def post_message(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.posting = True
        return await super().post_message(*args, **kwargs)


@pytest.mark.chaos
async def test_a_send_whose_control_plane_dies_as_it_looks_for_it_waits_for_the_next(
    plane_host: HostProcess,
) -> None:
    host = plane_host
    plane = await trio.to_thread.run_sync(_plane, host)
    assert plane is not None
    async with _KillWhenLooking(host.state_dir) as api:
        api.plane_pid = plane["pid"]
        _, turn = await _slow_turn(api)
    assert api.killed
    assert (turn.status, turn.error, turn.text) == ("idle", None, FIRST + SECOND)
    _check_once_in_order(turn.events)


@pytest.mark.chaos
def test_a_session_and_a_message_posted_again_with_their_keys_after_a_restart_are_stored_once(
    plane_host: HostProcess,
) -> None:
    host = plane_host
    plane = _plane(host)
    assert plane is not None
    url = plane["url"]
    auth = host.client_headers()
    create = {"agent": "slow"}
    session_key = {"idempotency-key": "s-19c2", **auth}
    made = httpx.post(f"{url}/v1/sessions", json=create, headers=session_key, timeout=10)
    sid = made.json()["id"]
    body = {"type": "message", "data": {"content": "go"}}
    key = {"idempotency-key": "k-7f3a", **auth}
    first = httpx.post(f"{url}/v1/sessions/{sid}/events", json=body, headers=key, timeout=10)
    assert first.status_code == 202
    # The answer "was lost": the plane dies, the client posts again with the same key.
    os.kill(plane["pid"], signal.SIGKILL)
    wait_until(
        lambda: (p := _plane(host)) and p["pid"] != plane["pid"] and p["state"] == "running",
        30,
        "the restarted control plane",
    )

    def post_again() -> httpx.Response | None:
        try:
            return httpx.post(f"{url}/v1/sessions/{sid}/events", json=body, headers=key, timeout=10)
        except httpx.TransportError:
            return None

    again = wait_until(post_again, 30, "the restarted plane to answer")
    assert again.status_code == 202
    assert again.json() == first.json(), "the same message"
    remade = httpx.post(f"{url}/v1/sessions", json=create, headers=session_key, timeout=10)
    assert (remade.status_code, remade.json()["id"]) == (201, sid), "the same session"
    listed = httpx.get(f"{url}/v1/sessions", headers=auth, timeout=5).json()["data"]
    assert [s["id"] for s in listed] == [sid]
    users = [i for i in _items(host, url, sid) if i.get("role") == "user"]
    assert [u["id"] for u in users] == [first.json()["item_id"]]
    bad = httpx.post(
        f"{url}/v1/sessions/{sid}/events",
        json=body,
        headers={"idempotency-key": "", **auth},
        timeout=10,
    )
    assert (bad.status_code, bad.json()["error"]) == (400, "invalid_idempotency_key")


# --- the gateway's buffer, alone -------------------------------------------------------------


def test_stream_buffer_sends_again_after_a_cursor_and_what_no_ping_proved_read(
    tmp_path: Path,
) -> None:
    path = tmp_path / "streams.log"
    buf = StreamBuffer(path, max_events=100, compact_bytes=1 << 20)
    buf.load()
    for seq in range(1, 7):
        assert buf.add("s", seq, b'{"type": "x"}')

    def unsent() -> list[int]:
        return [seq for seq, _ in buf.take("s", 100, 1 << 20)]

    # Written on a stream with a cursor: no longer unsent, still pending.
    buf.sent("s", 4)
    assert unsent() == [5, 6] and buf.pending_count() == 6
    # The server comes back with a cursor of 2: 1-2 are confirmed, 3-6 go again.
    buf.rewind("s", 2)
    assert unsent() == [3, 4, 5, 6] and buf.pending_count() == 4
    # A ping proves 3-6 read; the newest 2 stay for the next cursor.
    buf.sent("s", 6)
    buf.received("s", 6, keep=2)
    assert buf.pending_count() == 2 and unsent() == []
    # A stream without a cursor: what no ping proved read goes again on a new stream ...
    buf.rewind("s", None)
    assert unsent() == [5, 6]
    buf.sent("s", 6, mark=True)
    buf.rewind("s", None)
    assert unsent() == [5, 6]
    # ... but after a restart it is not sent again: that server cannot tell a replay.
    buf.sent("s", 6, mark=True)
    buf.close()
    again = StreamBuffer(path, max_events=100, compact_bytes=1 << 20)
    again.load()
    assert again.pending_count() == 0
    assert not again.add("s", 6, b"{}"), "a redelivery is still a duplicate"
    again.close()


@pytest.mark.chaos
def test_control_plane_kill9_at_random_moments_every_turn_ends_once(
    plane_host: HostProcess,
) -> None:
    # The trials: the demo agent (text, a shell call the policy evaluates, an
    # approval, text) with the plane killed at a random point of each turn. Every turn ends
    # idle with one edge the client sees, none waits for --timeout: the send waits for the
    # restarted plane, and a turn whose setup needed the plane while it restarted asks again
    # (it ended failed, "turn setup failed", when dispatch gave up after about 2 s).
    rng = random.Random(15)
    for _ in range(6):
        _kill_during_a_demo_turn(plane_host, rng.randint(1, 14))


def _kill_during_a_demo_turn(host: HostProcess, at: int) -> None:
    """``corral send`` to a new demo session; the plane is killed once the host's sessions
    got ``at`` more events. The turn ends idle, each event once, in order, one edge."""
    plane = _plane(host)
    assert plane is not None
    url, pid = plane["url"], plane["pid"]
    before = _last_event_id_of_all(host, url)
    send = _send(host, "--agent", "demo", "--approve", "go")
    wait_until(lambda: _last_event_id_of_all(host, url) >= before + at, 30, "the turn to stream")
    os.kill(pid, signal.SIGKILL)
    code, result, err = _finish(send)
    # On failure the host's own account too: CI once saw a send give up at once ("no running
    # host found") while the plane restarted, and kept nothing else of it.
    assert (code, result["status"]) == (0, "idle"), (at, result["error"], err, _tail(host))
    _check_once_in_order(result["events"])
    assert result["text"].startswith("Hello from corral!")
    wait_until(
        lambda: (p := _plane(host)) and p["pid"] != pid and p["state"] == "running",
        30,
        "the restarted control plane",
    )


def _tail(host: HostProcess) -> str:
    """The host's exit code and the end of its log, for a failure's message."""
    exited = host.proc.poll() if host.proc is not None else None
    return f"host exit code {exited}; its log ends:\n" + host.log()[-4000:]


def _last_event_id_of_all(host: HostProcess, url: str) -> int:
    try:
        auth = host.client_headers()
        sessions = httpx.get(f"{url}/v1/sessions", headers=auth, timeout=5).json()["data"]
    except httpx.HTTPError:
        return 0
    return sum(s["last_event_id"] for s in sessions)


# --- a turn set up while the server is unavailable (dispatch, a fake server) -----------------


#: The dispatch host's restart window: half the default.
WAIT_S = 5.0


@pytest.fixture
def dispatch_host(
    host_factory: Callable[..., HostProcess], server: FakeOmnigentServer
) -> HostProcess:
    # Long enough for the outage the first test lets end (6 dropped GETs, about 3 s); the
    # second test waits it out in half the default's time.
    return _dhost(host_factory, server, f"server_wait_s = {WAIT_S}\n")


def _unavailable(server: FakeOmnigentServer, sid: str) -> tuple[Fault, str]:
    """Every GET of the session's (its snapshot, agent, items) drops its connection, as a
    control plane being restarted does; the fault and the route's regex."""
    route = rf"/v1/sessions/{sid}(/.*)?"
    return server.fail("GET", route, mode="drop", times=1_000_000), route


async def test_a_turn_set_up_while_the_server_is_unavailable_runs_once_it_is_back(
    dispatch_host: HostProcess, server: FakeOmnigentServer
) -> None:
    # Before, the setup gave up after one call's 4 attempts (about 2 s) and the turn ended
    # failed, spec_resolver_failed: a restart of the control plane takes 2 to 4 s.
    agent_id = server.add_agent(scripted_yaml("outage", '{text: "back again"}'))
    sid = server.add_session(agent_id)["id"]
    async with fake_gateway(dispatch_host.endpoint) as gw:
        await gw.init(sid, agent_id)
        fault, route = _unavailable(server, sid)
        async with trio.open_nursery() as nursery:
            # The message's answer waits for the turn's setup: posted beside the outage.
            nursery.start_soon(gw.message, sid, "go")
            # Down for more than one call's retries (4 attempts), then back.
            await trio.to_thread.run_sync(
                wait_until, lambda: len(server.received("GET", route)) >= 6, 30, "6 failed GETs"
            )
            fault.times = 0
        assert await gw.until_status(sid, timeout=30) == ["running", "idle"]
    assert gw.texts(sid) == "back again"
    assert "the server is unavailable" in dispatch_host.log()


async def test_a_turn_whose_server_never_comes_back_ends_with_one_failed_edge(
    dispatch_host: HostProcess, server: FakeOmnigentServer
) -> None:
    agent_id = server.add_agent(scripted_yaml("outage", '{text: "never"}'))
    sid = server.add_session(agent_id)["id"]
    async with fake_gateway(dispatch_host.endpoint) as gw:
        await gw.init(sid, agent_id)
        _, route = _unavailable(server, sid)
        started = trio.current_time()
        await gw.message(sid, "go")
        assert await gw.until_status(sid, timeout=60) == ["running", "failed"]
        waited = trio.current_time() - started
        edges = [e for e in gw.events[sid] if e["type"] == "session.status"]
    assert edges[-1]["error"]["code"] == "spec_resolver_failed"
    assert len(edges) == 2, edges
    # Asked again over the server's restart window (it stops short of a retry past it),
    # where it used to give up after one call's 4 attempts, in about 2 s.
    assert waited > WAIT_S / 2, waited
    assert len(server.received("GET", route)) > 4
