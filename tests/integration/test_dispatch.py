"""Dispatch end to end through the bus: real host, fake server for runner → server calls."""

from __future__ import annotations

import functools
import json
import os
import signal
from collections.abc import Iterator

import pytest
import trio

from tests.conftest import FAST_LIVENESS, HostProcess, shared_or_fresh
from tests.fake_server import FakeOmnigentServer, assistant_message, user_message
from tests.integration._gateway import fake_gateway, scripted_yaml
from tests.integration.test_tools_policy import _verdict, restarted


def _dhost(factory, server: FakeOmnigentServer, dispatch: str = "") -> HostProcess:
    """A host of dispatch and policy on ``server``; ``dispatch``: more dispatch options."""
    return factory(
        FAST_LIVENESS
        + "[actors.dispatch.options]\n"
        + f'server_url = "{server.base_url}"\nsubscribers = ["test-gateway"]\n{dispatch}'
        + f'[actors.policy.options]\nserver_url = "{server.base_url}"\n'
    ).start()


@pytest.fixture(scope="module")
def shared_dhost(module_host_factory, module_server: FakeOmnigentServer) -> Iterator[HostProcess]:
    h = _dhost(module_host_factory, module_server)
    yield h
    if h.proc is not None and h.proc.poll() is None:
        h.stop()


@pytest.fixture
def dhost(request, host_factory, server: FakeOmnigentServer) -> Iterator[HostProcess]:
    """The module's dispatch host; its own for a test marked chaos or fresh_host."""
    yield from shared_or_fresh(request, "shared_dhost", lambda: _dhost(host_factory, server))


def _session(server: FakeOmnigentServer, *steps: str, name: str = "agent") -> tuple[str, str]:
    agent_id = server.add_agent(scripted_yaml(name, *steps))
    session = server.add_session(agent_id)
    return agent_id, session["id"]


async def _streaming_turn(gw, sid: str, agent_id: str, request_id: str):
    """Start a ``?stream=true`` turn; its 200 head (the SSE frames follow as chunks)."""
    await gw.init(sid, agent_id)
    body = {"type": "message", "role": "user", "content": "hi", "agent_id": agent_id}
    reply = await gw.request(
        "POST", f"/v1/sessions/{sid}/events", body, query="stream=true", request_id=request_id
    )
    assert (reply.status, reply.streaming) == (200, True)
    return reply


async def _elicited(gw, sid: str, agent_id: str) -> dict:
    """Start a turn whose harness asks a human first; its elicitation request."""
    await gw.init(sid, agent_id)
    await gw.message(sid, "go")
    kind = "response.elicitation_request"
    await gw.wait(lambda: any(e["type"] == kind for e in gw.events.get(sid, [])))
    return next(e for e in gw.events[sid] if e["type"] == kind)


async def test_d08_background_turn_streams_events_and_ends_idle(dhost: HostProcess, server) -> None:
    agent_id, sid = _session(server, '{text: "hello world", chunk: 5}')
    async with fake_gateway(dhost.endpoint) as gw:
        reply = await gw.init(sid, agent_id)
        assert reply.status == 201
        assert json.loads(reply.body)["id"] == sid
        reply = await gw.message(sid, "hi", agent_id=agent_id)
        assert (reply.status, json.loads(reply.body)) == (
            202,
            {"status": "accepted", "detail": "Turn started."},
        )
        assert await gw.until_status(sid) == ["running", "idle"]
        assert gw.texts(sid) == "hello world"
        types = [e["type"] for e in gw.events[sid]]
        assert "response.created" not in types, "not on the session stream (§ii.6)"
        assert types[0] == "session.status" and types[-1] == "session.status"
        assert "response.completed" in types


async def test_d29_d31_d33_buffered_message_runs_as_continuation_without_idle_between(
    dhost: HostProcess, server
) -> None:
    """The continuation is a turn of its own (``running`` again, no ``idle`` between,
    PROTOCOL_0_19.md §E.3) and sees the whole history, including the first turn's streamed
    text, committed as one assistant message when that turn completed (D-33)."""
    agent_id, sid = _session(
        server, '{text: "w ", repeat: 30, delay_ms: 20}', "{echo_history: true}"
    )
    async with fake_gateway(dhost.endpoint) as gw:
        await gw.init(sid, agent_id)
        assert (await gw.message(sid, "first")).status == 202
        await gw.wait(lambda: "w" in gw.texts(sid))
        reply = await gw.message(sid, "second")
        assert (reply.status, json.loads(reply.body)["status"]) == (202, "buffered")
        await gw.until_status(sid, "idle", timeout=20)
        assert gw.statuses(sid) == ["running", "running", "idle"]
        echoed = [
            e["delta"]
            for e in gw.events[sid]
            if e["type"] == "response.output_text.delta" and e["delta"].startswith("[")
        ]
        # The continuation saw the whole history: first message, first answer, second message.
        last = json.loads(echoed[-1])
        assert [r for r, _ in last] == ["user", "assistant", "user"]
        assert last[0][1] == "first" and last[2][1] == "second"
        assert last[1][1].startswith("w w w")


@pytest.mark.fresh_host
async def test_d30_a_buffered_message_never_waits_on_the_harness(
    dhost: HostProcess, server
) -> None:
    """With the harness actor stopped (SIGSTOP), a message during the turn is still answered
    202 buffered at once: nothing is sent to the harness (the real server has it run as its
    own turn, §E.3, where D-30 offered it as an injection). The buffered message runs once
    the turn ends."""
    agent_id, sid = _session(server, '{text: "w ", repeat: 50, delay_ms: 20}')
    async with fake_gateway(dhost.endpoint) as gw:
        await gw.init(sid, agent_id)
        assert (await gw.message(sid, "first")).status == 202
        await gw.wait(lambda: "w" in gw.texts(sid))
        harness = dhost.actor("harness")["pid"]
        os.kill(harness, signal.SIGSTOP)
        try:
            with trio.fail_after(5):
                reply = await gw.message(sid, "second")
        finally:
            os.kill(harness, signal.SIGCONT)
        assert (reply.status, json.loads(reply.body)["status"]) == (202, "buffered")
        # The first turn ends (perhaps failed, if the stop outlasted the harness's
        # liveness window); the buffered message then runs as a turn of its own.
        await gw.wait(lambda: gw.statuses(sid)[-1:] == ["idle"], timeout=30)
        assert gw.statuses(sid)[0] == "running" and gw.texts(sid).count("w") > 50


async def test_d16_d17_setup_failure_ends_failed_with_the_message(
    dhost: HostProcess, server
) -> None:
    agent_id = server.add_agent(
        "name: broken\nexecutor:\n  harness: scripted\n"
        "  auth: {type: api_key, api_key: $CORRAL_TEST_UNSET}\n"
        "  script: {turns: [[{text: x}]]}\n"
    )
    sid = server.add_session(agent_id)["id"]
    async with fake_gateway(dhost.endpoint) as gw:
        await gw.init(sid, agent_id)
        await gw.message(sid, "go")
        assert await gw.until_status(sid) == ["running", "failed"]
        edge = gw.events[sid][-1]
        assert edge["error"]["code"]
        assert "turn setup failed" in edge["error"]["message"]
        # D-18: the session is released; the next message starts a new turn.
        await gw.message(sid, "again")
        assert await gw.until_status(sid, count=2) == ["running", "failed", "running", "failed"]


async def test_d19_d20_in_stream_failure_is_a_failed_edge(dhost: HostProcess, server) -> None:
    """D-20 holds for every harness here: dispatch publishes each turn's terminal edge
    itself and suppresses no harness's ``idle`` edge (corral has no Codex-style forwarder
    that owns it), so a failed stream always ends ``["running", "failed"]``."""
    agent_id, sid = _session(
        server,
        '{text: "partial"}',
        "{fail: {code: executor_error, "
        'message: "harness turn failed: executor stream disconnected"}}',
    )
    async with fake_gateway(dhost.endpoint) as gw:
        await gw.init(sid, agent_id)
        await gw.message(sid, "go")
        assert await gw.until_status(sid) == ["running", "failed"]
        assert gw.events[sid][-1]["error"] == {
            "code": "executor_error",
            "message": "harness turn failed: executor stream disconnected",
        }


_DISCONNECTED = (
    '{report: failed, code: executor_error, message: "harness turn failed: executor stream '
    'disconnected"}'
)


@pytest.mark.parametrize(
    ("steps", "statuses"),
    [
        ((_DISCONNECTED, '{text: "recovered"}', "{report: completed}"), ["running", "idle"]),
        (('{text: "partial"}', _DISCONNECTED), ["running", "failed"]),
    ],
    ids=["d21-a-completion-after-a-failure-wins", "d19-a-failure-with-nothing-after"],
)
async def test_d19_d21_the_last_end_the_harness_stream_reports_stands(
    dhost: HostProcess, server, steps: tuple[str, ...], statuses: list[str]
) -> None:
    agent_id, sid = _session(server, *steps)
    async with fake_gateway(dhost.endpoint) as gw:
        await gw.init(sid, agent_id)
        await gw.message(sid, "go")
        assert await gw.until_status(sid) == statuses
        failed = [e for e in gw.events[sid] if e.get("status") == "failed"]
        if statuses[-1] == "idle":
            assert failed == [] and gw.texts(sid) == "recovered"
        else:
            (edge,) = failed
            assert edge["error"]["code"] == "executor_error"
            assert "harness turn failed: executor stream disconnected" in edge["error"]["message"]


async def test_d13_d14_spec_failure_before_streaming_is_a_generic_503(
    dhost: HostProcess, server
) -> None:
    async with fake_gateway(dhost.endpoint) as gw:
        await gw.init("no-such-session", "ag_missing")
        body = {"type": "message", "role": "user", "content": "hi", "agent_id": "ag_missing"}
        reply = await gw.request(
            "POST", "/v1/sessions/no-such-session/events", body, query="stream=true"
        )
        assert reply.status == 503
        assert json.loads(reply.body) == {
            "error": {
                "code": "spec_resolver_failed",
                "message": "Request failed on the runner; see runner logs for details.",
            }
        }
        assert await gw.until_status("no-such-session") == ["running", "failed"]
    assert "spec resolver failed for session no-such-session" in dhost.log()


async def test_d23_d24_cold_history_rehydrates_and_drops_the_persisted_copy(
    dhost: HostProcess, server
) -> None:
    agent_id, sid = _session(server, "{echo_history: true}")
    server.add_item(sid, user_message("prior question"))
    server.add_item(sid, assistant_message("prior answer"))
    stored = server.add_item(sid, user_message("new question"))
    async with fake_gateway(dhost.endpoint) as gw:
        await gw.init(sid, agent_id)
        await gw.message(sid, "new question", persisted_item_id=stored["id"])
        await gw.until_status(sid)
        pairs = json.loads(gw.texts(sid))
    assert pairs == [
        ["user", "prior question"],
        ["assistant", "prior answer"],
        ["user", "new question"],
    ]


async def test_d25_without_persisted_id_nothing_is_dropped(dhost: HostProcess, server) -> None:
    agent_id, sid = _session(server, "{echo_history: true}")
    server.add_item(sid, user_message("prior user, reply lost"))
    async with fake_gateway(dhost.endpoint) as gw:
        await gw.init(sid, agent_id)
        await gw.message(sid, "new user")
        await gw.until_status(sid)
        assert [t for _, t in json.loads(gw.texts(sid))] == ["prior user, reply lost", "new user"]


async def test_e04_approval_is_a_control_event_and_passes_the_harness_answer(
    dhost: HostProcess, server
) -> None:
    agent_id, sid = _session(server, '{text: "x"}')
    async with fake_gateway(dhost.endpoint) as gw:
        await gw.init(sid, agent_id)
        body = {"type": "approval", "data": {"elicitation_id": "elicit_x", "action": "accept"}}
        reply = await gw.request("POST", f"/v1/sessions/{sid}/events", body)
        assert reply.status == 404
        assert json.loads(reply.body)["error"]["code"] == "not_found"
        assert gw.statuses(sid) == [], "an approval never starts a turn"


async def test_h14_an_approval_goes_to_the_harness_side_channel_not_a_new_turn(
    dhost: HostProcess, server
) -> None:
    """The approval event is the parked harness's answer (the harness's 204 is the caller's,
    E-01..E-03), and the turn it belongs to goes on: one running, one idle, no second turn."""
    agent_id, sid = _session(
        server, '{elicit: {message: "Deploy?"}}', '{text: "Deployed.", on_decline: "Not deployed."}'
    )
    async with fake_gateway(dhost.endpoint) as gw:
        req = await _elicited(gw, sid, agent_id)
        reply = await _verdict(gw, sid, req["elicitation_id"], "decline")
        assert reply.headers == []
        assert await gw.until_status(sid) == ["running", "idle"]
        assert gw.texts(sid) == "Not deployed."


async def test_t04_t20_tool_call_runs_through_policy_and_tools_and_the_turn_completes(
    dhost: HostProcess, server
) -> None:
    agent_id, sid = _session(
        server, '{tool: sys_os_shell, arguments: {command: "echo hi"}}', '{text: "done"}'
    )
    async with fake_gateway(dhost.endpoint) as gw:
        await gw.init(sid, agent_id)
        await gw.message(sid, "go")
        assert await gw.until_status(sid) == ["running", "idle"]
        outputs = [
            e["item"]
            for e in gw.events[sid]
            if e["type"] == "response.output_item.done"
            and e["item"]["type"] == "function_call_output"
        ]
        result = json.loads(outputs[0]["output"])
        assert (result["stdout"], result["exit_code"], result["timed_out"]) == ("hi\n", 0, False)
        types = [e["type"] for e in gw.events[sid]]
        assert types.count("session.changed_files.invalidated") == 1
        assert types.index("session.changed_files.invalidated") < types.index("response.completed")
        statuses = [
            e["item"].get("status")
            for e in gw.events[sid]
            if e["type"] == "response.output_item.done" and e["item"]["type"] == "function_call"
        ]
        assert "action_required" not in statuses, "not relayed on the session stream"


async def test_interrupt_and_bad_events(dhost: HostProcess, server) -> None:
    agent_id, sid = _session(server, '{text: "x", repeat: 500, delay_ms: 10}')
    async with fake_gateway(dhost.endpoint) as gw:
        await gw.init(sid, agent_id)
        for raw, status in [
            (b"not json", 400),
            (b"[1]", 400),
            (b'{"type": "nope"}', 422),
            (b'{"type": "message", "agent_id": 5}', 422),
        ]:
            reply = await gw.request("POST", f"/v1/sessions/{sid}/events", raw=raw)
            assert reply.status == status, raw
        assert gw.statuses(sid) == [], "bad events change nothing"
        await gw.message(sid, "go")
        await gw.wait(lambda: "x" in gw.texts(sid))
        reply = await gw.request("POST", f"/v1/sessions/{sid}/events", {"type": "interrupt"})
        assert (reply.status, reply.body) == (204, b"")
        assert await gw.until_status(sid) == ["running", "idle"]


async def test_d32_reinit_keeps_the_session(dhost: HostProcess, server) -> None:
    agent_id, sid = _session(server, '{text: "x", repeat: 100, delay_ms: 10}')
    async with fake_gateway(dhost.endpoint) as gw:
        await gw.init(sid, agent_id)
        await gw.message(sid, "first")
        await gw.wait(lambda: "x" in gw.texts(sid))
        assert json.loads((await gw.message(sid, "second")).body)["status"] == "buffered"
        reply = await gw.init(sid, agent_id)
        assert reply.status == 201
        get = await gw.request("GET", f"/v1/sessions/{sid}")
        assert json.loads(get.body)["status"] == "running"
        assert await gw.until_status(sid, timeout=20) == ["running", "running", "idle"]
        missing = await gw.request("GET", "/v1/sessions/unknown-session")
        assert missing.status == 404
        assert json.loads(missing.body)["error"] == {
            "code": "not_found",
            "message": "No session 'unknown-session' on this runner.",
        }


@pytest.mark.chaos
async def test_kill9_dispatch_mid_turn_resumes_and_ends_once(dhost: HostProcess, server) -> None:
    """The resumed turn ends once, and what its worker streamed while dispatch restarted
    was held by the broker for the new incarnation: only the few deltas the killed process
    had taken and not yet published are lost (stream messages are not acked). Without the
    hold, a restart lost a fifth of this turn."""
    agent_id, sid = _session(server, '{text: "x", repeat: 300, delay_ms: 5}')
    async with fake_gateway(dhost.endpoint) as gw:
        await gw.init(sid, agent_id)
        await gw.message(sid, "go")
        await gw.wait(lambda: "x" in gw.texts(sid))
        os.kill(dhost.actor("dispatch")["pid"], signal.SIGKILL)
        statuses = await gw.until_status(sid, timeout=20)
        assert statuses == ["running", "idle"], statuses
        assert len(gw.texts(sid)) >= 290
        # The session still works after the restart.
        await gw.message(sid, "again")
        assert await gw.until_status(sid, count=2, timeout=20) == [
            "running",
            "idle",
            "running",
            "idle",
        ]


@pytest.mark.chaos
async def test_kill9_dispatch_mid_stream_true_turn_the_caller_still_gets_its_end(
    dhost: HostProcess, server
) -> None:
    """The caller of a ``?stream=true`` turn is in the session record: after a restart the
    resumed turn goes on streaming to it and ends its response (else it would hang)."""
    agent_id, sid = _session(server, '{text: "x", repeat: 150, delay_ms: 10}')
    async with fake_gateway(dhost.endpoint) as gw:
        await _streaming_turn(gw, sid, agent_id, "req-k")
        await gw.wait(lambda: b"output_text.delta" in b"".join(gw.chunks.get("req-k", [])))
        os.kill(dhost.actor("dispatch")["pid"], signal.SIGKILL)
        await gw.wait(lambda: "req-k" in gw.ended, timeout=20)
        frames = b"".join(gw.chunks["req-k"]).decode()
        assert frames.rstrip().split("\n\n")[-1].startswith("event: response.completed")
        assert await gw.until_status(sid, timeout=20) == ["running", "idle"]


async def test_d01_d04_stream_true_relays_sse_frames_in_order(dhost: HostProcess, server) -> None:
    agent_id, sid = _session(server, '{text: "abc", chunk: 1}')
    async with fake_gateway(dhost.endpoint) as gw:
        reply = await _streaming_turn(gw, sid, agent_id, "req-1")
        assert ("content-type", "text/event-stream; charset=utf-8") in reply.headers
        await gw.wait(lambda: "req-1" in gw.ended)
        frames = b"".join(gw.chunks["req-1"]).decode().split("\n\n")
        kinds = [f.split("\n")[0] for f in frames if f]
        assert kinds[0] == "event: response.created"
        assert kinds[-1] == "event: response.completed"
        assert kinds.count("event: response.output_text.delta") == 3


async def test_d03_a_host_without_a_harness_actor_answers_501(host_factory, server) -> None:
    host = host_factory(
        FAST_LIVENESS
        + "[actors.harness]\nenabled = false\n"
        + "[actors.dispatch.options]\n"
        + f'server_url = "{server.base_url}"\nsubscribers = ["test-gateway"]\n'
    ).start()
    agent_id, sid = _session(server, '{text: "never"}')
    async with fake_gateway(host.endpoint) as gw:
        assert (await gw.init(sid, agent_id)).status == 201
        for query in ("", "stream=true"):
            body = {"type": "message", "role": "user", "content": "hi", "agent_id": agent_id}
            reply = await gw.request("POST", f"/v1/sessions/{sid}/events", body, query=query)
            assert reply.status == 501
            answer = json.loads(reply.body)["error"]
            assert answer["code"] == "not_implemented"
            assert "HarnessProcessManager" in answer["message"]
        assert gw.statuses(sid) == [], "no turn started"
        # Dispatch did not crash: the session still answers.
        assert (await gw.request("GET", f"/v1/sessions/{sid}")).status == 200
    assert host.actor("dispatch")["restarts"] == 0
    host.stop()


@pytest.mark.parametrize("default_spec", [True, False], ids=["default-spec", "nothing"])
async def test_d05_nothing_identifies_the_agent_the_default_harness_runs(
    host_factory, default_spec: bool
) -> None:
    """No server (the null server client), no ``agent_id``, no ``harness``: the turn runs on
    the host's default harness with its default spec, and with no spec at all it still
    ends with one terminal edge; dispatch does not crash."""
    spec = '[actors.dispatch.options.default_spec.executor.script]\nturns = [[{text = "hi"}]]\n'
    host = host_factory(
        FAST_LIVENESS
        + '[actors.dispatch.options]\nsubscribers = ["test-gateway"]\n'
        + (spec if default_spec else "")
    ).start()
    async with fake_gateway(host.endpoint) as gw:
        reply = await gw.request(
            "POST", "/v1/sessions/s-d05/events", {"type": "message", "role": "user"}
        )
        assert reply.status == 202
        statuses = await gw.until_status("s-d05", timeout=20)
        assert statuses[0] == "running" and len(statuses) == 2
        if default_spec:
            assert (statuses[1], gw.texts("s-d05")) == ("idle", "hi")
    assert host.actor("dispatch")["restarts"] == 0
    host.stop()


async def test_d06_missing_llm_credentials_fail_inside_the_stream(
    dhost: HostProcess, server
) -> None:
    """An agent on the openai harness with no API key: 200 SSE, then an in-stream
    ``response.failed`` that says so; not a spawn failure, not an HTTP error."""
    agent_id = server.add_agent("name: keyless\nexecutor:\n  harness: openai-agents\n  model: m\n")
    sid = server.add_session(agent_id)["id"]
    async with fake_gateway(dhost.endpoint) as gw:
        await _streaming_turn(gw, sid, agent_id, "req-d06")
        await gw.wait(lambda: "req-d06" in gw.ended, timeout=20)
        frames = b"".join(gw.chunks["req-d06"]).decode()
        last = frames.rstrip().split("\n\n")[-1]
        assert last.startswith("event: response.failed")
        assert "missing_credentials" in last and "no API key" in last
        assert await gw.until_status(sid) == ["running", "failed"]
        (failed,) = [e for e in gw.events[sid] if e.get("status") == "failed"]
        assert failed["error"]["code"] == "missing_credentials"
        assert not failed["error"]["message"].startswith("turn setup failed")


async def test_d09_agent_comes_from_the_snapshot_when_the_message_lacks_it(
    dhost: HostProcess, server
) -> None:
    _, sid = _session(server, '{text: "resolved"}')
    async with fake_gateway(dhost.endpoint) as gw:
        # No init, no agent_id: the first-message race.
        await gw.message(sid, "hi")
        assert await gw.until_status(sid) == ["running", "idle"]
        assert gw.texts(sid) == "resolved"
    assert server.received("GET", f"/v1/sessions/{sid}")


async def test_d10_d12_harness_override_replaces_the_spec_harness(
    dhost: HostProcess, server
) -> None:
    agent_id, sid = _session(server, '{text: "x"}')
    async with fake_gateway(dhost.endpoint) as gw:
        await gw.init(sid, agent_id)
        await gw.message(sid, "hi", harness_override="no-such-harness")
        assert await gw.until_status(sid) == ["running", "failed"]
        assert gw.events[sid][-1]["error"]["code"] == "unknown_harness"
        assert "no-such-harness" in gw.events[sid][-1]["error"]["message"]
        # An explicit harness in the body wins over the override (D-10 order).
        await gw.message(sid, "again", harness="scripted")
        assert await gw.until_status(sid, count=2) == ["running", "failed", "running", "idle"]


async def test_d11_model_override_reaches_the_worker_env(dhost: HostProcess, server) -> None:
    from pathlib import Path

    agent_id, sid = _session(server, '{text: "x"}')
    async with fake_gateway(dhost.endpoint) as gw:
        await gw.init(sid, agent_id)
        await gw.message(sid, "hi", model_override="claude-sonnet-4-6")
        await gw.until_status(sid)
    (worker,) = [w for w in dhost.status()["workers"] if w["session_id"] == sid]
    raw = Path(f"/proc/{worker['pid']}/environ").read_bytes().split(b"\0")
    env = dict(i.decode().split("=", 1) for i in raw if b"=" in i)
    assert env["HARNESS_SCRIPTED_MODEL"] == "claude-sonnet-4-6"


async def test_flood_of_messages_to_one_session_keeps_order(dhost: HostProcess, server) -> None:
    agent_id, sid = _session(
        server, '{text: "w", repeat: 20, delay_ms: 10}', "{echo_history: true}"
    )
    async with fake_gateway(dhost.endpoint) as gw:
        await gw.init(sid, agent_id)
        replies = [await gw.message(sid, f"m{i}") for i in range(30)]
        kinds = [json.loads(r.body)["status"] for r in replies]
        assert kinds[0] == "accepted" and set(kinds[1:]) == {"buffered"}
        await gw.until_status(sid, "idle", timeout=60)
        statuses = gw.statuses(sid)
        assert statuses.count("idle") == 1 and statuses[-1] == "idle", "no idle in between"
        assert len(statuses) >= 3, "the buffered messages ran as a turn of their own"
        last = json.loads(
            [
                e["delta"]
                for e in gw.events[sid]
                if e["type"] == "response.output_text.delta" and e["delta"].startswith("[")
            ][-1]
        )
        users = [t for r, t in last if r == "user"]
        assert users == [f"m{i}" for i in range(30)], "every message once, in order"


@pytest.mark.chaos
async def test_200_sessions_at_once(host_factory, server) -> None:
    config = (
        FAST_LIVENESS.replace("interval_s = 0.2", "interval_s = 1.0")
        + "[actors.dispatch.options]\n"
        + f'server_url = "{server.base_url}"\nsubscribers = ["test-gateway"]\n'
    )
    h = host_factory(config).start()
    agent_id = server.add_agent(scripted_yaml("many", '{text: "ok"}'))
    sids = [server.add_session(agent_id)["id"] for _ in range(200)]
    async with fake_gateway(h.endpoint) as gw:
        async with trio.open_nursery() as nursery:
            for sid in sids:
                # 200 workers importing at once keep two cores busy for a while.
                nursery.start_soon(functools.partial(gw.message, sid, "hi", timeout=120))
        await gw.wait(lambda: all(gw.statuses(s)[-1:] == ["idle"] for s in sids), timeout=300)
        assert all(gw.statuses(s) == ["running", "idle"] and gw.texts(s) == "ok" for s in sids)
    h.stop()


async def test_every_event_of_a_turn_is_journaled_in_order(dhost: HostProcess, server) -> None:
    from corral.actors.journal import JournalRead

    agent_id, sid = _session(server, '{text: "abc", chunk: 1}', '{text: "!"}')
    async with fake_gateway(dhost.endpoint) as gw:
        await gw.init(sid, agent_id)
        await gw.message(sid, "go")
        await gw.until_status(sid)
        turn_id = next(e["turn_id"] for e in gw.events[sid] if "turn_id" in e)
        published = [{k: v for k, v in e.items() if k != "_seq"} for e in gw.events[sid]]
        with trio.fail_after(10):
            while True:
                reply = await gw.peer.call("journal", JournalRead(session_id=sid, run_id=turn_id))
                rows = reply.result["events"]
                if rows and rows[-1]["event"] == "session.status" and len(rows) > 2:
                    break
                await trio.sleep(0.05)
    assert [r["payload"] for r in rows] == published, "the run mirrors the stream (J-32)"
    assert [r["seq"] for r in rows] == list(range(1, len(rows) + 1))
    assert rows[-1]["payload"] == {"type": "session.status", "status": "idle"}


async def test_d07_d15_explicit_harness_opens_the_stream_and_a_spec_failure_ends_it(
    host_factory, server
) -> None:
    config = (
        FAST_LIVENESS
        + "[actors.dispatch.options]\n"
        + f'server_url = "{server.base_url}"\nsubscribers = ["test-gateway"]\n'
        + "[actors.harness.options.harnesses]\n"
        + 'tool-caller = "tests.integration._tool_harness:ToolCaller"\n'
    )
    # The server knows the session but not its agent: the bundle cannot be had.
    server.add_session("ag_missing", session_id="no-spec-session")
    h = host_factory(config).start()
    async with fake_gateway(h.endpoint) as gw:
        await gw.init("no-spec-session", "ag_missing")
        body = {
            "type": "message",
            "role": "user",
            "content": "hi",
            "agent_id": "ag_missing",
            "harness": "tool-caller",
        }
        reply = await gw.request(
            "POST",
            "/v1/sessions/no-spec-session/events",
            body,
            query="stream=true",
            request_id="req-d15",
        )
        assert (reply.status, reply.streaming) == (200, True), "D-07: the stream opens"
        await gw.wait(lambda: "req-d15" in gw.ended)
        frames = b"".join(gw.chunks["req-d15"]).decode()
        kinds = [f.split("\n")[0] for f in frames.split("\n\n") if f]
        assert kinds[0] == "event: response.created"
        assert kinds[-1] == "event: response.failed"
        failed = json.loads(frames.split("\n\n")[len(kinds) - 1].split("data: ", 1)[1])
        assert failed["error"]["message"] == "Failed to resolve the agent spec for this turn."
        assert failed["error"]["type"] == "ServerRejected"
        # The error, not the whole event: its ids are random hex and may well hold "404".
        assert "404" not in json.dumps(failed["error"]), "the raw cause stays in the logs"
        assert await gw.until_status("no-spec-session") == ["running", "failed"]
    h.stop()


@pytest.mark.parametrize(
    "kill_dispatch",
    [False, pytest.param(True, marks=pytest.mark.chaos)],
    ids=["", "after-kill9-of-dispatch"],
)
async def test_d22_a_turn_whose_harness_waits_on_a_human_is_not_silent(
    host_factory, server, kill_dispatch: bool
) -> None:
    """The idle watchdog spares a turn while its harness's own elicitation is open, and ends
    it once the turn goes silent after the verdict. The open elicitation is in the session
    record, so a dispatch restarted meanwhile spares the turn too."""
    host = host_factory(
        FAST_LIVENESS
        + "[actors.dispatch.options]\n"
        + f'server_url = "{server.base_url}"\nsubscribers = ["test-gateway"]\n'
        + "turn_idle_timeout_s = 1.5\n"
    ).start()
    agent_id, sid = _session(
        server,
        '{elicit: {message: "Deploy?"}}',
        '{text: "Deployed.", on_decline: "Not deployed."}',
        "{sleep_ms: 20000}",
    )
    async with fake_gateway(host.endpoint) as gw:
        req = await _elicited(gw, sid, agent_id)
        if kill_dispatch:
            before = host.actor("dispatch")
            os.kill(before["pid"], signal.SIGKILL)
            await restarted(host, "dispatch", before)
        # Twice the idle timeout and more (watchdog rounds run once a second) pass while
        # the human decides.
        await trio.sleep(3.5)
        assert gw.statuses(sid) == ["running"]
        await _verdict(gw, sid, req["elicitation_id"], "accept")
        assert await gw.until_status(sid, timeout=15) == ["running", "failed"]
        (failed,) = [e for e in gw.events[sid] if e.get("status") == "failed"]
        assert failed["error"]["code"] == "turn_watchdog"
    host.stop()
