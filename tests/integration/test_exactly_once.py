"""A session event accepted once is a turn once, and a turn's end reaches the server once,
whatever moment dispatch dies at (issue #15, items 1 and 2).

A real host (gateway, dispatch, harness, policy, tools) behind the fake tunnel server, whose
``events`` are what the server's relay received. Dispatch is stopped dead (``os._exit``, as
``kill -9`` would) at a named point of a turn by its ``crash_at`` option, once; the
supervisor restarts it. Then, for the whole system: the turn's tool ran once (the script's
shell step appends a line to a file), the server saw exactly ``running`` and one terminal
edge per message, and the next turn is given the history with the first turn in it once.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Any, cast

import pytest
import trio
import trio.testing

from corral.actors.dispatch._fanout import Fanout
from corral.actors.dispatch._session import SessionRecord
from corral.config import BusSettings
from corral.journal import RunJournal
from tests.conftest import FAST_LIVENESS, HostProcess, wait_until
from tests.fake_server import FakeOmnigentServer, assistant_message, user_message
from tests.fake_tunnel_server import FakeTunnelServer, Tunnel
from tests.integration._gateway import fake_gateway, scripted_yaml
from tests.integration.test_gateway import FAST_BACKOFF, bind, message, running

RUNNER = "exactly-once"


def _config(tunnels: FakeTunnelServer, server: FakeOmnigentServer, crash_at: str) -> str:
    url = json.dumps(server.base_url)
    crash = f"crash_at = {json.dumps(crash_at)}\n" if crash_at else ""
    return (
        FAST_LIVENESS
        + f"[actors.dispatch.options]\nserver_url = {url}\n{crash}"
        + f"[actors.policy.options]\nserver_url = {url}\n"
        + "[actors.gateway.options]\n"
        + FAST_BACKOFF
        + f"[[runners]]\nserver = {json.dumps(tunnels.url)}\nid = {json.dumps(RUNNER)}\n"
    )


def _agent(server: FakeOmnigentServer, cwd: Path, pause_ms: int = 0) -> tuple[str, str]:
    """Turn 1 runs a shell step that leaves a line in ``runs.txt`` (a run of the turn), waits
    ``pause_ms``, then answers; turn 2 says what history it was given."""
    shell = {"tool": "sys_os_shell", "arguments": {"command": "echo ran >> runs.txt"}}
    text = "\n".join(
        [
            "name: once",
            "executor:",
            "  harness: scripted",
            "  model: scripted-model",
            "  script:",
            "    turns:",
            f"      - - {json.dumps(shell)}",
            f"        - {{sleep_ms: {pause_ms}}}",
            '        - {text: "done."}',
            "      - - {echo_history: true}",
            f"os_env: {{type: caller_process, cwd: {json.dumps(str(cwd))}}}",
        ]
    )
    agent_id = server.add_agent(text + "\n")
    return agent_id, server.add_session(agent_id)["id"]


def _runs(cwd: Path) -> int:
    path = cwd / "runs.txt"
    return len(path.read_text().splitlines()) if path.exists() else 0


async def _post(t: Tunnel, sid: str, body: dict[str, Any]) -> int | None:
    answer = await t.request("POST", f"/v1/sessions/{sid}/events", body, timeout=60)
    return answer.status


async def _dispatch_restarts(host: HostProcess, count: int) -> None:
    def restarted() -> bool:
        row = host.actor("dispatch")
        return row["restarts"] >= count and row["state"] == "running"

    await trio.to_thread.run_sync(lambda: wait_until(restarted, 30, "dispatch restarted"))


async def _second_turn(
    server: FakeOmnigentServer, tunnels: FakeTunnelServer, t: Tunnel, sid: str, agent_id: str
) -> str:
    """Run the session's next turn (it echoes its history as ``[role, text]`` pairs); what
    it streamed.

    The fake server does not save what its relay streams; a dispatch with a cold cache reads
    the history from it, so it is given turn 1's messages as the real server saves them."""
    server.add_item(sid, user_message("first"))
    server.add_item(sid, assistant_message("done."))
    before = len(tunnels.deltas(sid))
    assert await _post(t, sid, message("second", agent_id, "once")) == 202
    await tunnels.until_status(sid, count=2, timeout=60)
    return tunnels.deltas(sid)[before:]


def _check_once(tunnels: FakeTunnelServer, sid: str, cwd: Path, streamed: str) -> None:
    """The whole system's invariant after two messages: one run of turn 1, one edge each,
    and a history holding turn 1 once."""
    assert _runs(cwd) == 1, "turn 1 ran once"
    assert tunnels.statuses(sid) == ["running", "idle", "running", "idle"]
    history = json.loads(streamed)
    users = [text for role, text in history if role == "user"]
    assert users == ["first", "second"], history
    assert [text for role, text in history if role == "assistant"] == ["done."], history
    edges = [e for e in tunnels.events[sid] if e.get("type") == "response.completed"]
    assert len(edges) == 2, "one response.completed per turn"


@pytest.mark.chaos
@pytest.mark.parametrize("crash_at", ["turn_saved", "turn_sent", "end_saved", "edge_delivered"])
async def test_d08_kill9_of_dispatch_at_any_point_of_a_turn_runs_it_once_and_ends_it_once(
    host_factory, tunnels, server, tmp_path: Path, crash_at: str
) -> None:
    """Dispatch dies once at ``crash_at``:

    * ``turn_saved`` (the turn's record is saved; its start never reached the harness): the
      new incarnation starts it (it used to have no worker, 900 s, and the message it got
      again was buffered behind it and run later);
    * ``turn_sent`` (the start is with the harness; the message not yet answered): the
      broker's redelivery of the message is the turn it already is (it used to run again);
    * ``end_saved`` (the end is saved, its edge not sent): the edge is sent from the record
      (it used to be lost: the redelivered terminal found no active turn);
    * ``edge_delivered`` (every receiver has the end, the record still lists it): sent again
      with its seq, dropped by the gateway — one ``idle``, not two.

    The journal's run of the turn holds what the server got, each event once and in order
    (an edge or event sent again used to be journaled twice, and what waited in the
    journal's window when dispatch died at ``end_saved`` was lost to it).

    Afterwards the server re-POSTs the message (as after a tunnel reconnect): it is the turn
    it already is, answered 202, run no more.
    """
    agent_id, sid = _agent(server, tmp_path)
    host = host_factory(_config(tunnels, server, crash_at))
    async with running(host):
        t = await tunnels.wait_tunnel(RUNNER)
        await bind(t, sid, agent_id)
        first = message("first", agent_id, "once")
        # Answered by the incarnation the broker redelivers it to when the first one died
        # before answering: 202, never a 500.
        assert await _post(t, sid, first) == 202
        await tunnels.until_status(sid, timeout=60)
        await _journal_is_the_servers(host, tunnels, sid)
        await _dispatch_restarts(host, 1)
        assert await _post(t, sid, first) == 202, "a re-POST is the turn it already is"
        history = await _second_turn(server, tunnels, t, sid, agent_id)
        _check_once(tunnels, sid, tmp_path, history)
        assert host.log().count(f"crash_at {crash_at}: exiting now") == 1


@pytest.mark.chaos
async def test_d31_kill9_of_dispatch_between_a_turns_end_and_its_continuation_runs_the_buffer(
    host_factory, tunnels, server, tmp_path: Path
) -> None:
    """A message buffered behind a turn stays in the record until the next turn's start takes
    it: dispatch dies right after saving the first turn's end (``end_saved``, on the way
    into the continuation), and the new incarnation runs the buffered message as that turn —
    ``running`` twice, one ``idle``, turn 1 run once and in its history."""
    agent_id, sid = _agent(server, tmp_path, pause_ms=1500)
    host = host_factory(_config(tunnels, server, "end_saved"))
    async with running(host):
        t = await tunnels.wait_tunnel(RUNNER)
        await bind(t, sid, agent_id)
        assert await _post(t, sid, message("first", agent_id, "once")) == 202
        await trio.to_thread.run_sync(lambda: wait_until(lambda: _runs(tmp_path), 30, "turn 1"))
        # What the server has saved of turn 1 once it ends: the restarted dispatch reads it.
        server.add_item(sid, user_message("first"))
        server.add_item(sid, assistant_message("done."))
        answer = await t.request(
            "POST", f"/v1/sessions/{sid}/events", message("second", agent_id, "once")
        )
        assert (answer.status, answer.json["status"]) == (202, "buffered")
        await tunnels.until_status(sid, timeout=60)
        assert host.log().count("crash_at end_saved: exiting now") == 1
        assert _runs(tmp_path) == 1
        assert tunnels.statuses(sid) == ["running", "running", "idle"]
        history = json.loads(tunnels.deltas(sid).removeprefix("done."))
        assert [text for role, text in history if role == "user"] == ["first", "second"]
        assert [text for role, text in history if role == "assistant"] == ["done."]


@pytest.mark.chaos
async def test_d08_a_turn_run_by_its_again_start_ends_harness_restarted_when_harness_and_worker_die(
    host_factory, tunnels, server, tmp_path: Path
) -> None:
    """Dispatch dies after saving the turn and before its start leaves (``turn_saved``), so
    the turn runs under the next incarnation's ``again`` start alone; the harness actor is
    then killed mid-turn, and its worker with it (a worker alone outlives its harness actor
    and is adopted). The broker redelivers that start to the new harness actor, which ends
    the turn ``failed`` (``harness_restarted``) — it used to drop the start as "started
    before" (a previous incarnation had recorded it), leaving the turn with no worker and
    no end for good (the chaos run's hung turns, issue #15)."""
    agent_id, sid = _agent(server, tmp_path, pause_ms=60_000)
    host = host_factory(_config(tunnels, server, "turn_saved"))
    async with running(host):
        t = await tunnels.wait_tunnel(RUNNER)
        await bind(t, sid, agent_id)
        assert await _post(t, sid, message("first", agent_id, "once")) == 202
        await _dispatch_restarts(host, 1)
        # The turn's shell step ran: its worker has the again start and sleeps in the turn.
        await trio.to_thread.run_sync(lambda: wait_until(lambda: _runs(tmp_path), 30, "turn 1"))
        assert "again after a restart" in host.log()
        before = host.actor("harness")
        (worker,) = host.ask("inspect", actor="harness")["state"]["workers"]
        os.kill(before["pid"], signal.SIGKILL)
        os.kill(worker["pid"], signal.SIGKILL)
        await trio.to_thread.run_sync(lambda: host.restarted("harness", before))
        await tunnels.until_status(sid, "failed", timeout=30)
        assert tunnels.statuses(sid) == ["running", "failed"]
        edge = next(e for e in tunnels.events[sid] if e.get("status") == "failed")
        assert edge["error"]["code"] == "harness_restarted", edge
        assert _runs(tmp_path) == 1, "run once, never again"


async def test_d08_a_message_posted_twice_is_one_turn(
    host_factory, tunnels, server, tmp_path: Path
) -> None:
    """The server re-POSTs a message (same ``persisted_item_id``) while its turn runs and
    after it ended: 202 each time, and the turn runs once (it used to be buffered and run
    again as the next turn)."""
    agent_id, sid = _agent(server, tmp_path)
    host = host_factory(_config(tunnels, server, ""))
    async with running(host):
        t = await tunnels.wait_tunnel(RUNNER)
        await bind(t, sid, agent_id)
        first = message("first", agent_id, "once")
        assert await _post(t, sid, first) == 202
        assert await _post(t, sid, first) == 202
        await tunnels.until_status(sid, timeout=60)
        assert await _post(t, sid, first) == 202
        history = await _second_turn(server, tunnels, t, sid, agent_id)
        _check_once(tunnels, sid, tmp_path, history)


class _Subscriber:
    """Stands in for the peer under the fan-out: what reached the broker, as (session, seq)."""

    bus = BusSettings()

    def __init__(self) -> None:
        self.sent: list[tuple[str, int]] = []

    async def cast_many(self, to: str, msgs: list[Any], **_: Any) -> list[str]:
        self.sent += [(e.session_id, e.seq) for m in msgs for e in m.events]
        return []


async def test_d08_a_held_sessions_events_leave_only_when_the_hold_ends() -> None:
    """What is saved before it is sent never leaves before the save: while a session is held
    (around the save that ends a turn) its events wait, in order, and other sessions' go on;
    a tracked one is reported delivered once the broker has it. Without the hold, the edge
    could reach the gateway before the end was saved, and a crash between the two ended the
    turn a second time (a second ``idle``)."""
    peer = _Subscriber()
    fanout = Fanout(cast(Any, peer), subscribers=["gateway"], journal=None)
    delivered: list[tuple[str, int]] = []
    fanout.on_delivered = lambda sid, seq: delivered.append((sid, seq))
    held, other = SessionRecord(id="held", turn_id="t"), SessionRecord(id="other")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(fanout.run_events)
        with fanout.held("held"):
            fanout.publish(held, {"type": "session.status", "status": "idle"}, track=True)
            fanout.publish(held, {"type": "session.heartbeat"})
            fanout.publish(other, {"type": "session.status", "status": "running"})
            await trio.testing.wait_all_tasks_blocked()
            assert peer.sent == [("other", 1)]
            assert delivered == []
        await trio.testing.wait_all_tasks_blocked()
        assert peer.sent == [("other", 1), ("held", 1), ("held", 2)]
        assert delivered == [("held", 1)]
        nursery.cancel_scope.cancel()


async def test_d04_a_stream_true_message_posted_again_gets_the_rest_of_its_turn(
    host_factory, server
) -> None:
    """A ``?stream=true`` message POSTed again while its turn runs (its first caller gone with
    a tunnel) is not a second turn: the new caller gets the rest of the turn's frames and
    the end of its response; the first caller gets no more."""
    agent_id = server.add_agent(scripted_yaml("s", '{text: "x", repeat: 100, delay_ms: 20}'))
    sid = server.add_session(agent_id)["id"]
    url = json.dumps(server.base_url)
    host = host_factory(
        FAST_LIVENESS
        + f'[actors.dispatch.options]\nserver_url = {url}\nsubscribers = ["test-gateway"]\n'
        + f"[actors.policy.options]\nserver_url = {url}\n"
    ).start()
    body = {"type": "message", "content": "hi", "agent_id": agent_id, "persisted_item_id": "i1"}
    path = f"/v1/sessions/{sid}/events"
    async with fake_gateway(host.endpoint) as gw:
        await gw.init(sid, agent_id)
        first = await gw.request("POST", path, body, query="stream=true", request_id="first")
        assert (first.status, first.streaming) == (200, True)
        await gw.wait(lambda: b"output_text.delta" in b"".join(gw.chunks.get("first", [])))
        again = await gw.request("POST", path, body, query="stream=true", request_id="again")
        assert (again.status, again.streaming) == (200, True)
        await gw.wait(lambda: "again" in gw.ended, timeout=30)
        frames = b"".join(gw.chunks["again"]).decode()
        assert frames.rstrip().split("\n\n")[-1].startswith("event: response.completed")
        assert "first" not in gw.ended
        assert await gw.until_status(sid, timeout=30) == ["running", "idle"]
        assert gw.texts(sid) == "x" * 100, "one turn"
    host.stop()


def _tokens(start: int, count: int) -> str:
    return "".join(f"{i:04d}|" for i in range(start, start + count))


#: The tail of a turn streamed through a dispatch crash: 120 more distinct tokens.
STREAMED_TAIL = {"text": _tokens(120, 120), "chunk": 5, "delay_ms": 5}


def _streaming_agent(
    server: FakeOmnigentServer, cwd: Path, tail: dict[str, Any]
) -> tuple[str, str]:
    """A turn of distinct tokens (each its own delta, so a lost, doubled or swapped one shows),
    a shell call, then ``tail``; the next turn answers ``done.``."""
    shell = {"tool": "sys_os_shell", "arguments": {"command": "echo ran >> runs.txt"}}
    first = {"text": _tokens(0, 120), "chunk": 5, "delay_ms": 5}
    text = "\n".join(
        [
            "name: streams",
            "executor:",
            "  harness: scripted",
            "  model: scripted-model",
            "  script:",
            "    turns:",
            f"      - - {json.dumps(first)}",
            f"        - {json.dumps(shell)}",
            f"        - {json.dumps(tail)}",
            '      - - {text: "done."}',
            f"os_env: {{type: caller_process, cwd: {json.dumps(str(cwd))}}}",
        ]
    )
    agent_id = server.add_agent(text + "\n")
    return agent_id, server.add_session(agent_id)["id"]


async def _kill9_dispatch_and_worker(host: HostProcess, sid: str) -> None:
    """``kill -9`` dispatch and the session's worker together, then wait for dispatch to be
    back (the harness actor ends the worker's turn without it)."""
    harness = await trio.to_thread.run_sync(lambda: host.ask("inspect", actor="harness"))
    pid = next(w["pid"] for w in harness["state"]["workers"] if w["session_id"] == sid)
    before = host.actor("dispatch")
    os.kill(before["pid"], signal.SIGKILL)
    os.kill(pid, signal.SIGKILL)
    await trio.to_thread.run_sync(lambda: host.restarted("dispatch", before))


def _items(tunnels: FakeTunnelServer, sid: str, kind: str) -> list[dict[str, Any]]:
    return [
        e["item"]
        for e in tunnels.events[sid]
        if e.get("type") == "response.output_item.done" and e["item"].get("type") == kind
    ]


@pytest.mark.chaos
async def test_d08_kill9_of_dispatch_mid_stream_loses_no_delta_and_doubles_none(
    host_factory, tunnels, server, tmp_path: Path
) -> None:
    """Dispatch dies (``crash_at = "streaming"``) right after taking its worker's 31st event
    of the turn, before publishing it; events it had taken and not sent, and those the broker
    was routing to it, die with it. The worker holds what dispatch has not confirmed and the
    next incarnation asks for it again: every delta reaches the server once and in order,
    with the turn's message items and its tool output once each (it used to lose about one
    batch per kill: deltas, a message item, a ``function_call_output``)."""
    agent_id, sid = _streaming_agent(server, tmp_path, STREAMED_TAIL)
    host = host_factory(_config(tunnels, server, "streaming"))
    async with running(host):
        t = await tunnels.wait_tunnel(RUNNER)
        await bind(t, sid, agent_id)
        assert await _post(t, sid, message("first", agent_id, "streams")) == 202
        await tunnels.until_status(sid, timeout=60)
        assert host.log().count("crash_at streaming: exiting now") == 1
        assert tunnels.deltas(sid) == _tokens(0, 240)
        assert tunnels.statuses(sid) == ["running", "idle"]
        messages = [i["content"][0]["text"] for i in _items(tunnels, sid, "message")]
        assert messages == [_tokens(0, 120), _tokens(120, 120)]
        assert len(_items(tunnels, sid, "function_call_output")) == 1
        completed = [e for e in tunnels.events[sid] if e.get("type") == "response.completed"]
        assert len(completed) == 1
        assert _runs(tmp_path) == 1
        # The session goes on (a cold cache reads turn 1 from the server, which the fake
        # server does not save by itself): its next turn streams once too.
        server.add_item(sid, user_message("first"))
        server.add_item(sid, assistant_message(_tokens(0, 240)))
        assert await _post(t, sid, message("second", agent_id, "streams")) == 202
        await tunnels.until_status(sid, count=2, timeout=60)
        assert tunnels.deltas(sid) == _tokens(0, 240) + "done."


def _sse(body: bytes) -> list[tuple[str, dict[str, Any]]]:
    """The ``(event, data)`` of each frame of a ``?stream=true`` answer, in order."""
    frames = []
    for frame in body.decode().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in frame.splitlines() if ": " in line)
        if "event" in fields:
            frames.append((fields["event"], json.loads(fields["data"])))
    return frames


async def _journal_run(host: HostProcess, sid: str) -> list[dict[str, Any]]:
    """The records of the session's one run (its turn), once the journal holds its end."""
    journal = RunJournal(host.instance.journal_dir)

    def ended() -> str | None:
        runs = journal.listing(sid)["runs"]
        return runs[0]["run_id"] if len(runs) == 1 and runs[0]["terminal"] else None

    run_id = await trio.to_thread.run_sync(lambda: wait_until(ended, 30, "the run's end"))
    return cast(list[dict[str, Any]], journal.read(sid, run_id, strict=True)["events"])


async def _journal_is_the_servers(host: HostProcess, tunnels: FakeTunnelServer, sid: str) -> None:
    """The journal's run of the session's one turn holds what the server got, each once and
    in the same order."""
    journaled = [p for _, p in _journaled(await _journal_run(host, sid))]
    got = [e for e in tunnels.events[sid] if e.get("type") != "session.heartbeat"]

    def brief(events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return [(e.get("type"), e.get("sequence_number"), e.get("status")) for e in events]

    assert journaled == got, (brief(journaled), brief(got))


_TERMINALS = ("response.completed", "response.failed", "response.cancelled", "response.incomplete")


def _once_in_order(events: list[tuple[str, dict[str, Any]]], end: str) -> None:
    """The ``response.*`` events of one turn: each worker event once and in its worker's
    order (each carries its ``sequence_number``), and one terminal, ``end``, last."""
    events = [(kind, data) for kind, data in events if kind.startswith("response.")]
    numbers = [data["sequence_number"] for kind, data in events if kind not in _TERMINALS]
    assert numbers == sorted(set(numbers)), f"doubled or misordered: {numbers}"
    assert [kind for kind, _ in events if kind in _TERMINALS] == [end] == [events[-1][0]]


def _journaled(records: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(r["event"], r["payload"]) for r in records]


@pytest.mark.chaos
async def test_d08_kill9_of_dispatch_mid_stream_journals_and_streams_every_event_once(
    host_factory, tunnels, server, tmp_path: Path
) -> None:
    """A ``?stream=true`` turn with dispatch killed after taking its worker's 31st event
    (``crash_at = "streaming"``): the events its worker sends again keep their seq, and
    besides the server's relay, the journal's run and the caller's SSE body hold each
    event once, in order (both used to get the replayed ones twice: the journal had no seq
    to drop them by, and the fan-out to the caller no memory of what it had sent)."""
    agent_id, sid = _streaming_agent(server, tmp_path, STREAMED_TAIL)
    host = host_factory(_config(tunnels, server, "streaming"))
    async with running(host):
        t = await tunnels.wait_tunnel(RUNNER)
        await bind(t, sid, agent_id)
        path = f"/v1/sessions/{sid}/events"
        body = message("first", agent_id, "streams")
        answer = await t.request("POST", path, body, query="stream=true", timeout=60)
        assert answer.status == 200
        await tunnels.until_status(sid, timeout=60)
        assert host.log().count("crash_at streaming: exiting now") == 1
        assert tunnels.deltas(sid) == _tokens(0, 240)
        frames = _sse(answer.body)
        streamed = "".join(d["delta"] for k, d in frames if k == "response.output_text.delta")
        assert streamed == _tokens(0, 240), "the caller's SSE body, each delta once"
        _once_in_order(frames, "response.completed")
        journaled = _journaled(await _journal_run(host, sid))
        deltas = [p["delta"] for e, p in journaled if e == "response.output_text.delta"]
        assert "".join(deltas) == _tokens(0, 240), "the journal's run, each delta once"
        _once_in_order(journaled, "response.completed")
        statuses = [p["status"] for e, p in journaled if e == "session.status"]
        assert statuses == ["running", "idle"], "the turn's edges journaled once each"


@pytest.mark.chaos
async def test_d08_kill9_of_dispatch_and_its_worker_together_doubles_nothing(
    host_factory, tunnels, server, tmp_path: Path
) -> None:
    """Dispatch and the turn's worker are killed together mid-turn (the worker sleeps after
    its tool call): what the worker held dies with it, the harness actor ends the turn
    ``failed`` (``harness_crashed``), and nothing reaches the server twice — the deltas are
    a prefix of the turn's, once each, with one terminal edge; the next turn runs."""
    agent_id, sid = _streaming_agent(server, tmp_path, {"sleep_ms": 60_000})
    host = host_factory(_config(tunnels, server, ""))
    async with running(host):
        t = await tunnels.wait_tunnel(RUNNER)
        await bind(t, sid, agent_id)
        assert await _post(t, sid, message("first", agent_id, "streams")) == 202
        await tunnels.until(
            lambda: _items(tunnels, sid, "function_call_output"), 60, "the tool's output"
        )
        await _kill9_dispatch_and_worker(host, sid)
        await tunnels.until_status(sid, "failed", timeout=60)
        streamed = tunnels.deltas(sid)
        assert _tokens(0, 120).startswith(streamed), "a prefix of the turn, once each"
        assert tunnels.statuses(sid) == ["running", "failed"]
        edge = next(e for e in tunnels.events[sid] if e.get("status") == "failed")
        assert edge["error"]["code"] in ("harness_crashed", "harness_restarted"), edge
        journaled = _journaled(await _journal_run(host, sid))
        deltas = [p["delta"] for e, p in journaled if e == "response.output_text.delta"]
        assert "".join(deltas) == streamed, "the journal has what the server has, once"
        _once_in_order(journaled, "response.failed")
        assert len(_items(tunnels, sid, "function_call_output")) == 1
        server.add_item(sid, user_message("first"))
        assert await _post(t, sid, message("second", agent_id, "streams")) == 202
        await tunnels.until_status(sid, timeout=60)
        assert tunnels.deltas(sid) == streamed + "done."
        assert _runs(tmp_path) == 1


@pytest.mark.chaos
async def test_j32_a_journal_that_dies_holding_a_turns_appends_still_journals_every_event_once(
    host_factory, tunnels, server, tmp_path: Path
) -> None:
    """The journal actor is stopped for a whole streaming turn, then killed: what dispatch
    sent it meanwhile is durable on the bus, so the next incarnation journals every event of
    the run once, in the server's order. The appends used to go as stream messages (only a
    run's last one was durable), lost with the journal that held them, and the worker, told
    its events were confirmed once the gateway had them, had forgotten them too."""
    agent_id, sid = _streaming_agent(server, tmp_path, STREAMED_TAIL)
    host = host_factory(_config(tunnels, server, ""))
    async with running(host):
        t = await tunnels.wait_tunnel(RUNNER)
        await bind(t, sid, agent_id)
        journal = host.actor("journal")
        os.kill(journal["pid"], signal.SIGSTOP)
        try:
            assert await _post(t, sid, message("first", agent_id, "streams")) == 202
            await tunnels.until_status(sid, timeout=60)
            assert tunnels.deltas(sid) == _tokens(0, 240), "the stream does not wait for it"
        finally:
            with contextlib.suppress(ProcessLookupError):  # the supervisor may have already
                os.kill(journal["pid"], signal.SIGKILL)
        await trio.to_thread.run_sync(lambda: host.restarted("journal", journal))
        await _journal_is_the_servers(host, tunnels, sid)
