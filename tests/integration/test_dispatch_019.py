"""Dispatch against the 0.19 server's expectations (PROTOCOL_0_19.md §B.1, §C.3, §E.3, §E.4,
§I.1): mid-turn messages as turns of their own, interrupts recorded as the server records
them, the forwarded control events, session-init v2 fields, and ``DELETE /v1/sessions/{id}``.

BEHAVIOURS.md D-30 offered a mid-turn message to the running turn as an injection; the real
server saves each turn's answer as its own item, so the second message runs as its own turn
and D-30 no longer holds (D-29 and D-31 do).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

from corral.actors.dispatch import SessionRecord
from corral.actors.dispatch._history import INTERRUPT_NOTE
from corral.actors.journal import JournalRead
from corral.routes import HttpRequest
from tests.conftest import FAST_LIVENESS, HostProcess, shared_or_fresh
from tests.fake_server import FakeOmnigentServer
from tests.integration._gateway import FakeGateway, fake_gateway
from tests.integration.test_tools_policy import restarted, tool

SLOW = {"text": "s ", "repeat": 300, "delay_ms": 10}
ECHO = {"echo_history": True}
NOTE_ID = re.compile(r"^cancel_[0-9a-f]{32}$")


def _config(server: FakeOmnigentServer | None, extra: str = "") -> str:
    url = f"server_url = {json.dumps(server.base_url)}\n" if server else ""
    policy = f"[actors.policy.options]\n{url}" if server else ""
    return (
        FAST_LIVENESS
        + f'[actors.dispatch.options]\n{url}subscribers = ["test-gateway"]\n'
        + extra
        + policy
    )


@pytest.fixture(scope="module")
def shared_dhost(module_host_factory, module_server: FakeOmnigentServer) -> Iterator[HostProcess]:
    h = module_host_factory(_config(module_server)).start()
    yield h
    if h.proc is not None and h.proc.poll() is None:
        h.stop()


@pytest.fixture
def dhost(request, host_factory, server: FakeOmnigentServer) -> Iterator[HostProcess]:
    """The module's dispatch host; its own for a test marked chaos or fresh_host."""
    yield from shared_or_fresh(
        request, "shared_dhost", lambda: host_factory(_config(server)).start()
    )


def _agent(server: FakeOmnigentServer, *turns: list[dict[str, Any]], **extra: Any) -> str:
    """A scripted agent (turn *i* runs ``turns[i % len(turns)]``), as JSON (which is YAML)."""
    spec = {
        "name": "agent",
        "executor": {"harness": "scripted", "model": "m", "script": {"turns": list(turns)}},
        **extra,
    }
    return server.add_agent(json.dumps(spec) + "\n")


def _session(server: FakeOmnigentServer, *turns: list[dict[str, Any]]) -> tuple[str, str]:
    agent_id = _agent(server, *turns)
    return agent_id, server.add_session(agent_id)["id"]


def _types(gw: FakeGateway, sid: str) -> list[str]:
    return [e["type"] for e in gw.events.get(sid, [])]


def _echoed(gw: FakeGateway, sid: str) -> list[list[str]]:
    """The history the session's last ``echo_history`` step was given."""
    deltas = [
        e["delta"]
        for e in gw.events[sid]
        if e["type"] == "response.output_text.delta" and e["delta"].startswith("[")
    ]
    assert deltas, ("no echo_history step ran", gw.events[sid])
    return json.loads(deltas[-1])


async def _post(gw: FakeGateway, sid: str, body: Any = None, raw: bytes | None = None) -> Any:
    return await gw.request("POST", f"/v1/sessions/{sid}/events", body, raw=raw)


def _notes(server: FakeOmnigentServer, sid: str) -> list[dict[str, Any]]:
    return [e for e in server.events.get(sid, []) if e.get("type") == "external_conversation_item"]


async def _until(predicate: Any, timeout: float = 15) -> None:
    """Poll a condition on another process's state (the fake server's thread, the disk)."""
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.02)


# --- §E.3: a second message mid-turn is its own turn ----------------------------------------


async def test_e3_d29_d31_a_message_mid_turn_runs_as_its_own_turn(
    dhost: HostProcess, server
) -> None:
    """202 buffered; turn 1 ends with its own ``response.completed`` and only its own text;
    then ``running`` again (no ``idle`` between) and a new response id, whose history has
    turn 1's answer before the second message. ``response.in_progress`` says
    ``background: false, store: true`` like omnigent's runner."""
    agent_id, sid = _session(server, [{"text": "w ", "repeat": 30, "delay_ms": 20}], [ECHO])
    async with fake_gateway(dhost.endpoint) as gw:
        await gw.init(sid, agent_id)
        assert (await gw.message(sid, "first")).status == 202
        await gw.wait(lambda: "w" in gw.texts(sid))
        reply = await gw.message(sid, "second")
        assert reply.status == 202
        assert json.loads(reply.body) == {
            "status": "buffered",
            "detail": "Message buffered; active turn will process it.",
        }
        await gw.until_status(sid, "idle", timeout=30)
        assert gw.statuses(sid) == ["running", "running", "idle"]
        events = gw.events[sid]
        starts = [e for e in events if e["type"] == "response.in_progress"]
        ends = [e for e in events if e["type"] == "response.completed"]
        assert len(starts) == len(ends) == 2
        assert starts[0]["response"]["id"] != starts[1]["response"]["id"]
        assert all(
            (s["response"]["background"], s["response"]["store"]) == (False, True) for s in starts
        )
        # Turn 1's stream holds turn 1's text only; then the second turn starts.
        first = events[: events.index(ends[0]) + 1]
        assert "".join(e.get("delta", "") for e in first) == "w " * 30
        after = events[events.index(ends[0]) + 1]
        assert (after["type"], after["status"]) == ("session.status", "running")
        assert "injection.consumed" not in _types(gw, sid)
        assert _echoed(gw, sid) == [["user", "first"], ["assistant", "w " * 30], ["user", "second"]]


async def test_e3_several_buffered_messages_run_as_one_turn(dhost: HostProcess, server) -> None:
    """As omnigent's runner does for a non-native harness (it drains the whole buffer into
    one turn): every buffered message, in order, after turn 1's answer."""
    agent_id, sid = _session(server, [{"text": "w ", "repeat": 40, "delay_ms": 20}], [ECHO])
    async with fake_gateway(dhost.endpoint) as gw:
        await gw.init(sid, agent_id)
        await gw.message(sid, "m1")
        await gw.wait(lambda: "w" in gw.texts(sid))
        for text in ("m2", "m3", "m4"):
            assert json.loads((await gw.message(sid, text)).body)["status"] == "buffered"
        await gw.until_status(sid, "idle", timeout=30)
        assert gw.statuses(sid) == ["running", "running", "idle"]
        assert _echoed(gw, sid) == [
            ["user", "m1"],
            ["assistant", "w " * 40],
            ["user", "m2"],
            ["user", "m3"],
            ["user", "m4"],
        ]


# --- §E.4: interrupt and stop_session ---------------------------------------------------------


@pytest.mark.parametrize("kind", ["interrupt", "stop_session"])
async def test_e4_an_interrupted_turn_ends_idle_with_a_note_and_no_terminal_upstream(
    dhost: HostProcess, server, kind: str
) -> None:
    agent_id, sid = _session(server, [SLOW], [ECHO], [ECHO])
    async with fake_gateway(dhost.endpoint) as gw:
        await gw.init(sid, agent_id)
        await gw.message(sid, "first")
        await gw.wait(lambda: "s" in gw.texts(sid))
        reply = await _post(gw, sid, {"type": kind})
        assert (reply.status, reply.body) == (204, b"")
        assert await gw.until_status(sid) == ["running", "idle"]
        types = _types(gw, sid)
        for terminal in ("response.cancelled", "response.completed", "response.failed"):
            assert terminal not in types, "the server would save the partial text (§E.4)"
        turn_id = next(e["turn_id"] for e in gw.events[sid] if "turn_id" in e)
        await _until(lambda: _notes(server, sid))
        (note,) = _notes(server, sid)
        assert note["data"]["item_type"] == "message"
        assert NOTE_ID.match(note["data"]["response_id"])
        assert note["data"]["source_id"] == note["data"]["response_id"]
        assert note["data"]["item_data"] == {
            "role": "user",
            "content": [{"type": "input_text", "text": INTERRUPT_NOTE}],
        }
        assert INTERRUPT_NOTE.startswith("[System: interrupted]\n")
        # The next request is [user1, note, user2]: the partial answer is not in it.
        await gw.message(sid, "second")
        await gw.until_status(sid, count=2)
        assert _echoed(gw, sid) == [["user", "first"], ["user", INTERRUPT_NOTE], ["user", "second"]]
        # The journal keeps the worker's cancelled (J-32: the run is complete).
        with trio.fail_after(10):
            while True:
                rows = (
                    await gw.peer.call("journal", JournalRead(session_id=sid, run_id=turn_id))
                ).result["events"]
                if rows and rows[-1]["event"] == "session.status":
                    break
                await trio.sleep(0.05)
        assert [r["event"] for r in rows][-2:] == ["response.cancelled", "session.status"]


async def test_e4_a_stream_true_caller_still_gets_the_cancelled(dhost: HostProcess, server) -> None:
    agent_id, sid = _session(server, [SLOW])
    async with fake_gateway(dhost.endpoint) as gw:
        await gw.init(sid, agent_id)
        body = {"type": "message", "role": "user", "content": "hi", "agent_id": agent_id}
        reply = await gw.request(
            "POST", f"/v1/sessions/{sid}/events", body, query="stream=true", request_id="req-i"
        )
        assert (reply.status, reply.streaming) == (200, True)
        await gw.wait(lambda: b"output_text.delta" in b"".join(gw.chunks.get("req-i", [])))
        assert (await _post(gw, sid, {"type": "interrupt"})).status == 204
        await gw.wait(lambda: "req-i" in gw.ended)
        frames = b"".join(gw.chunks["req-i"]).decode()
        assert frames.rstrip().split("\n\n")[-1].startswith("event: response.cancelled")
        assert "response.cancelled" not in _types(gw, sid)


async def test_e4_a_failed_note_post_is_logged_and_the_next_turn_runs(
    dhost: HostProcess, server
) -> None:
    agent_id, sid = _session(server, [SLOW], [ECHO], [ECHO])
    server.fail("POST", rf"/v1/sessions/{sid}/events", status=500, times=10)
    async with fake_gateway(dhost.endpoint) as gw:
        await gw.init(sid, agent_id)
        await gw.message(sid, "first")
        await gw.wait(lambda: "s" in gw.texts(sid))
        await _post(gw, sid, {"type": "interrupt"})
        await gw.until_status(sid)
        await gw.message(sid, "second")
        assert await gw.until_status(sid, count=2) == ["running", "idle", "running", "idle"]
        assert _echoed(gw, sid) == [["user", "first"], ["user", INTERRUPT_NOTE], ["user", "second"]]
    await _until(lambda: "interrupt note of session" in dhost.log())
    assert _notes(server, sid) == []


async def test_e4_without_a_server_the_note_is_kept_in_history(host_factory) -> None:
    echo = "[{echo_history = true}]"
    turns = f'[[{{text = "s ", repeat = 300, delay_ms = 10}}], {echo}, {echo}]'
    host = host_factory(
        _config(None, f"[actors.dispatch.options.default_spec.executor.script]\nturns = {turns}\n")
    ).start()
    async with fake_gateway(host.endpoint) as gw:
        await gw.message("s-local", "first")
        await gw.wait(lambda: "s" in gw.texts("s-local"))
        assert (await _post(gw, "s-local", {"type": "stop_session"})).status == 204
        await gw.until_status("s-local")
        await gw.message("s-local", "second")
        await gw.until_status("s-local", count=2)
        assert _echoed(gw, "s-local") == [
            ["user", "first"],
            ["user", INTERRUPT_NOTE],
            ["user", "second"],
        ]
    host.stop()


@pytest.mark.chaos
async def test_e4_kill9_of_dispatch_after_an_interrupt_still_records_it(
    host_factory, server
) -> None:
    """The interrupt is in the session record before the harness hears of it: a dispatch
    killed then resumes the turn as an interrupted one, so the worker's cancelled, reaching
    the new incarnation, ends it ``idle`` with no terminal upstream and posts the note.

    The harness actor is stopped (SIGSTOP) while that happens, so the cancelled cannot reach
    the old incarnation; liveness is slowed so that the host does not take the stop for a
    hang.
    """
    host = host_factory(_config(server).replace("interval_s = 0.2", "interval_s = 1.0")).start()
    agent_id, sid = _session(server, [SLOW], [ECHO])
    async with fake_gateway(host.endpoint) as gw, trio.open_nursery() as nursery:
        await gw.init(sid, agent_id)
        await gw.message(sid, "first")
        await gw.wait(lambda: "s" in gw.texts(sid))
        before, harness = host.actor("dispatch"), host.actor("harness")["pid"]
        os.kill(harness, signal.SIGSTOP)
        try:

            async def interrupt() -> None:
                with contextlib.suppress(Exception):  # its dispatch is killed before answering
                    await _post(gw, sid, {"type": "interrupt"})

            nursery.start_soon(interrupt)
            await _until(lambda: any(r.interrupted for r in _records(host, sid)))
            os.kill(before["pid"], signal.SIGKILL)
        finally:
            os.kill(harness, signal.SIGCONT)
        await restarted(host, "dispatch", before)
        assert await gw.until_status(sid, timeout=20) == ["running", "idle"]
        assert "response.cancelled" not in _types(gw, sid)
        await _until(lambda: _notes(server, sid))
        await gw.message(sid, "second")
        await gw.until_status(sid, count=2, timeout=20)
        # A cold cache (a new incarnation): the history is the server's items and the message.
        assert _echoed(gw, sid) == [["user", INTERRUPT_NOTE], ["user", "second"]]
        assert len(_notes(server, sid)) == 1
        nursery.cancel_scope.cancel()
    host.stop()


# --- §C.3: control events ---------------------------------------------------------------------


async def test_c3_forwarded_control_events_answer_like_omnigents_runner(
    dhost: HostProcess, server
) -> None:
    agent_id, sid = _session(server, [{"text": "x"}])
    no_ops = [
        {
            "type": "cost_approval_popup",
            "elicitation_id": "elicit_1",
            "message": "ok?",
            "policy_name": "p",
        },
        {"type": "policy_blocked_notice", "message": "blocked", "policy_name": "p"},
        {"type": "compact"},
        {"type": "clear"},
        {"type": "effort_change", "effort": "high"},
        {"type": "model_change", "model": "gpt-x"},
        {"type": "permission_mode_change", "permission_mode": "plan"},
        {"type": "plan_mode_change", "enabled": True},
        {"type": "codex_approval_mode_change", "approval_mode": "never"},
        {"type": "btw_dismiss"},
        {"type": "external_session_status", "data": {"status": "idle"}},
    ]
    async with fake_gateway(dhost.endpoint) as gw:
        await gw.init(sid, agent_id)
        for body in no_ops:
            reply = await _post(gw, sid, body)
            assert (reply.status, reply.body) == (204, b""), body
        for body in (
            {"type": "cost_approval_popup"},
            {"type": "cost_approval_popup", "elicitation_id": ""},
        ):
            reply = await _post(gw, sid, body)
            assert reply.status == 400
            assert json.loads(reply.body)["error"]["code"] == "invalid_input"
            assert "elicitation_id" in json.loads(reply.body)["error"]["message"]
        for body in ({"type": "plan_mode_change", "enabled": "yes"}, {"type": "nope"}):
            reply = await _post(gw, sid, body)
            assert reply.status == 422
            error = json.loads(reply.body)["error"]
            assert error["code"] == "invalid_event" and isinstance(error["message"], str)
        reply = await _post(gw, sid, raw=b"not json")
        assert json.loads(reply.body) == {
            "error": {
                "code": "invalid_json",
                "message": "The event body is not valid JSON: JSON is malformed: invalid "
                "character (byte 4).",
            }
        }
        assert gw.statuses(sid) == [], "no control event starts a turn"


# --- §B.1: session-init v2 --------------------------------------------------------------------


def _envelope(sid: str, agent_id: str, **init: Any) -> dict[str, Any]:
    snapshot = {"harness_override": None, "model_override": None, "inference_config": None}
    snapshot.update(init.pop("snapshot", {}))
    return {
        "session_id": sid,
        "agent_id": agent_id,
        "sub_agent_name": None,
        "session_init": {
            "protocol_version": 2,
            "session_id": sid,
            "agent_id": agent_id,
            "snapshot": snapshot,
            "suppress_recovery_turn": False,
            "resume_interrupted_turn": False,
            "recovery_id": None,
            **init,
        },
    }


def _records(host: HostProcess, sid: str) -> list[SessionRecord]:
    data = (host.instance.actor_dir("dispatch") / "sessions.log").read_bytes()
    return [
        r
        for r in (msgspec.json.decode(line, type=SessionRecord) for line in data.splitlines())
        if r.id == sid
    ]


async def test_b1_init_v2_fields_are_kept_durably_and_inference_config_is_not_claimed(
    dhost: HostProcess, server
) -> None:
    agent_id, sid = _session(server, [{"text": "x"}])
    config = {"provider": "openai", "model": "gpt-x"}
    body = _envelope(
        sid,
        agent_id,
        resume_interrupted_turn=True,
        recovery_id="a" * 32,
        snapshot={"inference_config": config},
    )
    async with fake_gateway(dhost.endpoint) as gw:
        for _ in range(2):
            reply = await gw.request("POST", "/v1/sessions", body)
            assert reply.status == 201
            view = json.loads(reply.body)
            assert view["runner_id"] is None and view["session_init_protocol_version"] == 2
            assert "inference_config_verified" not in view
        assert (
            json.loads((await gw.request("GET", f"/v1/sessions/{sid}")).body)["runner_id"] is None
        )
    record = _records(dhost, sid)[-1]
    assert (record.recovery_id, record.resume_interrupted_turn) == ("a" * 32, True)
    assert record.inference_config == config
    assert dhost.log().count(f"session {sid} has a saved inference_config") == 1


@pytest.mark.chaos
async def test_b1_resume_interrupted_turn_keeps_a_live_turn_after_kill9_of_dispatch(
    dhost: HostProcess, server
) -> None:
    """The server re-inits with ``resume_interrupted_turn: true``: the turn, resumed by the
    new dispatch, goes on (201 says ``running``) and ends once ``idle``, not ``failed``."""
    agent_id, sid = _session(server, [SLOW])
    async with fake_gateway(dhost.endpoint) as gw:
        await gw.init(sid, agent_id)
        await gw.message(sid, "go")
        await gw.wait(lambda: "s" in gw.texts(sid))
        before = dhost.actor("dispatch")
        os.kill(before["pid"], signal.SIGKILL)
        await restarted(dhost, "dispatch", before)
        body = _envelope(sid, agent_id, resume_interrupted_turn=True, recovery_id="b" * 32)
        reply = await gw.request("POST", "/v1/sessions", body)
        assert (reply.status, json.loads(reply.body)["status"]) == (201, "running")
        assert await gw.until_status(sid, timeout=20) == ["running", "idle"]


def test_b1_a_record_written_before_the_v2_fields_still_loads() -> None:
    old = (
        b'{"id":"s1","agent_id":"a","turn_id":null,'
        b'"buffer":[{"injection_id":"inj_1","content":"x"}],"seq":7,"status":"idle"}'
    )
    record = msgspec.json.decode(old, type=SessionRecord)
    assert (record.recovery_id, record.resume_interrupted_turn, record.inference_config) == (
        None,
        False,
        None,
    )
    assert (record.interrupted, record.note_pending, record.deleted) == (False, None, False)


# --- §I.1: DELETE /v1/sessions/{id} -----------------------------------------------------------


def _deleted(sid: str) -> dict[str, Any]:
    return {"session_id": sid, "object": "session.deleted", "deleted": True}


@pytest.mark.fresh_host  # it checks the host's dispatch restart count
async def test_i1_delete_interrupts_the_turn_drops_the_buffer_and_forgets_the_session(
    dhost: HostProcess, server
) -> None:
    """Every turn echoes its history first: after the delete a message to the same id starts
    from nothing (no cached history, the buffered message gone)."""
    agent_id, sid = _session(server, [ECHO, SLOW])
    async with fake_gateway(dhost.endpoint) as gw:
        await gw.init(sid, agent_id)
        await gw.message(sid, "first")
        await gw.wait(lambda: "s" in gw.texts(sid))
        assert json.loads((await gw.message(sid, "buffered")).body)["status"] == "buffered"
        reply = await gw.request("DELETE", f"/v1/sessions/{sid}")
        assert (reply.status, json.loads(reply.body)) == (200, _deleted(sid))
        # The edge reached the stand-in's inbox before the answer; its collecting task, which
        # the answer's arrival may have overtaken, reads it now.
        await trio.testing.wait_all_tasks_blocked()
        assert gw.statuses(sid) == ["running", "idle"], "one terminal edge"
        assert (await gw.request("GET", f"/v1/sessions/{sid}")).status == 404
        again = await gw.request("DELETE", f"/v1/sessions/{sid}")
        assert (again.status, json.loads(again.body)) == (200, _deleted(sid))
        await gw.message(sid, "third")
        await gw.wait(
            lambda: gw.statuses(sid).count("running") == 2 and _echoed(gw, sid)[-1][1] == "third"
        )
        assert _echoed(gw, sid) == [["user", "third"]]
        statuses = await gw.until_status(sid, count=2, timeout=20)
        assert statuses == ["running", "idle", "running", "idle"], "not turn_in_flight"
    assert dhost.actor("dispatch")["restarts"] == 0


async def test_i1_delete_of_an_unknown_session_is_answered_the_same(dhost: HostProcess) -> None:
    async with fake_gateway(dhost.endpoint) as gw:
        reply = await gw.request("DELETE", "/v1/sessions/never-seen")
        assert (reply.status, json.loads(reply.body)) == (200, _deleted("never-seen"))


@pytest.mark.chaos
async def test_i1_kill9_of_dispatch_right_after_a_delete_does_not_resurrect_it(
    dhost: HostProcess, server
) -> None:
    agent_id, sid = _session(server, [{"text": "x"}])
    async with fake_gateway(dhost.endpoint) as gw:
        await gw.init(sid, agent_id)
        await gw.message(sid, "go")
        await gw.until_status(sid)
        before = dhost.actor("dispatch")
        assert (await gw.request("DELETE", f"/v1/sessions/{sid}")).status == 200
        os.kill(before["pid"], signal.SIGKILL)
        await restarted(dhost, "dispatch", before)
        assert (await gw.request("GET", f"/v1/sessions/{sid}")).status == 404
    assert _records(dhost, sid)[-1].deleted


async def test_i1_delete_closes_the_sessions_terminals(
    dhost: HostProcess, server, tmp_path: Path
) -> None:
    launch = json.loads(tool("sys_terminal_launch", terminal="sh", session="s1"))
    agent_id = _agent(
        server,
        [launch],
        os_env={"type": "caller_process", "cwd": str(tmp_path)},
        terminals={"sh": {"command": "sh"}},
    )
    sid = server.add_session(agent_id)["id"]

    async def terminals(gw: FakeGateway) -> list[str]:
        request = HttpRequest(
            request_id="r", method="GET", path=f"/v1/sessions/{sid}/resources/terminals"
        )
        reply = await gw.peer.call("tools", request)
        return [r["id"] for r in json.loads(reply.body)["data"]]

    async with fake_gateway(dhost.endpoint) as gw:
        await gw.init(sid, agent_id)
        await gw.message(sid, "go")
        assert await gw.until_status(sid, timeout=30) == ["running", "idle"]
        assert await terminals(gw) == ["terminal_sh_s1"]
        assert (await gw.request("DELETE", f"/v1/sessions/{sid}")).status == 200
        assert await terminals(gw) == []
