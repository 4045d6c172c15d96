"""The gateway end to end: a real host, the fake tunnel server (0.19: PROTOCOL_0_19.md; §i,
§ii, §v.6 of PROTOCOL_FACTS.md where 0.19 left them), the fake HTTP server for agent specs,
scripted workers. The 0.19 additions (close-code recycles, routes, the stream vocabulary) are
in ``test_gateway_019.py``."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from corral import ConfigError, __version__
from corral.actors.gateway import (
    Responder,
    ResponseBodyFrame,
    StreamBuffer,
    backoff_delay,
    body_encoding,
    tunnel_url,
)
from corral.actors.gateway._options import GatewayOptions
from corral.config import check_options, parse_config
from corral.routes import json_response
from corral.server_client import runner_id_for_token
from tests.conftest import FAST_LIVENESS, HostProcess
from tests.fake_server import FakeOmnigentServer
from tests.fake_tunnel_server import FakeTunnelServer, Tunnel, token_bound_runner_id
from tests.integration._gateway import scripted_yaml

# --- helpers ---------------------------------------------------------------------------------


def _q(value: str) -> str:
    return json.dumps(value)


#: Reconnects in a fraction of a second, a recycle (1012) too.
FAST_BACKOFF = (
    "backoff_base_s = 0.05\nbackoff_cap_s = 0.2\nrecycle_min_s = 0.05\nrecycle_max_s = 0.2\n"
)


def host_config(
    tunnels: FakeTunnelServer,
    runners: list[dict[str, str]],
    *,
    server: FakeOmnigentServer | None = None,
    gateway: dict[str, Any] | None = None,
) -> str:
    text = FAST_LIVENESS
    text += "[actors.dispatch.options]\n"
    if server is not None:
        text += f"server_url = {_q(server.base_url)}\n"
        text += f"[actors.policy.options]\nserver_url = {_q(server.base_url)}\n"
    text += "[actors.gateway.options]\n" + FAST_BACKOFF
    for key, value in (gateway or {}).items():
        text += f"{key} = {json.dumps(value)}\n"
    for runner in runners:
        text += "[[runners]]\n"
        text += "".join(f"{k} = {_q(v)}\n" for k, v in {"server": tunnels.url, **runner}.items())
    return text


@asynccontextmanager
async def running(host: HostProcess) -> AsyncIterator[HostProcess]:
    await trio.to_thread.run_sync(host.start)
    try:
        yield host
    finally:
        await trio.to_thread.run_sync(host.stop)


async def gateway_state(host: HostProcess) -> dict[str, Any]:
    reply = await trio.to_thread.run_sync(lambda: host.ask("inspect", actor="gateway"))
    return reply["state"]


async def poll(
    host: HostProcess, predicate: Callable[[dict[str, Any]], Any], timeout: float = 15
) -> dict[str, Any]:
    """The gateway's snapshot once ``predicate`` holds (polled, with a deadline)."""
    state: dict[str, Any] = {}
    with trio.move_on_after(timeout):
        while True:
            state = await gateway_state(host)
            if predicate(state):
                return state
            await trio.sleep(0.05)
    raise AssertionError(f"gateway never reached the state; last: {state}")


def tunnel_of(state: dict[str, Any], runner_id: str) -> dict[str, Any]:
    return next(t for t in state["tunnels"] if t["runner_id"] == runner_id)


def error_code(body: Any) -> Any:
    """The code of an error body in either shape: 0.19 ``{"error": {"code"}}`` or 0.11's."""
    error = body["error"]
    return error["code"] if isinstance(error, dict) else error


def numbered(n: int) -> str:
    """``n`` distinct 4-character words: a lost or repeated delta shows in the text."""
    return "".join(f"{i:03d} " for i in range(n))


async def bind(tunnel: Tunnel, session_id: str, agent_id: str) -> None:
    """§B.3: init, snapshot, stream (and remember the session for re-inits)."""
    init = await tunnel.request(
        "POST",
        "/v1/sessions",
        {"session_id": session_id, "agent_id": agent_id, "sub_agent_name": None},
    )
    assert init.status == 201, init.body
    assert init.json["id"] == session_id
    assert (await tunnel.request("GET", f"/v1/sessions/{session_id}")).status == 200
    tunnel.server.bind(tunnel.runner_id, session_id, agent_id)
    await tunnel.open_stream(session_id)


def message(text: str, agent_id: str, name: str) -> dict[str, Any]:
    """A client message as the server flattens it (§ii.7)."""
    return {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": text}],
        "agent_id": agent_id,
        "model": name,
        "has_mcp_servers": False,
        "persisted_item_id": os.urandom(16).hex(),
    }


#: The fake server's tunnel endpoint is under a path prefix here (the ``tunnels`` fixture).
TUNNEL_PREFIX = "/omni"


@pytest.fixture
async def server() -> AsyncIterator[FakeOmnigentServer]:
    fake = FakeOmnigentServer()
    async with trio.open_nursery() as nursery:
        await fake.start(nursery)
        yield fake
        nursery.cancel_scope.cancel()


# --- pure parts ------------------------------------------------------------------------------


def test_tunnel_url_keeps_the_prefix_and_quotes_the_id() -> None:
    assert tunnel_url("http://h:1/base/", "a b/c") == "ws://h:1/base/v1/runners/a%20b%2Fc/tunnel"
    assert tunnel_url("https://h", "r") == "wss://h/v1/runners/r/tunnel"
    assert runner_id_for_token("t") == token_bound_runner_id("t")


def test_backoff_doubles_from_half_a_second_to_ten_with_jitter() -> None:
    assert [backoff_delay(n, base=0.5, cap=10, rand=lambda: 0.5) for n in range(7)] == [
        0.5,
        1.0,
        2.0,
        4.0,
        8.0,
        10.0,
        10.0,
    ]
    assert backoff_delay(0, base=0.5, cap=10, rand=lambda: 0.0) == 0.25
    assert backoff_delay(9, base=0.5, cap=10, rand=lambda: 0.999999) == pytest.approx(15, rel=1e-5)


@pytest.mark.parametrize(
    ("runners", "key"),
    [
        ([{"server": "ftp://x"}], "runners[0].server"),
        ([{"server": "http://x"}, {"server": "nohost"}], "runners[1].server"),
        ([{"server": "http://x", "id": ""}], "runners[0].id"),
        ([{"server": "http://x", "id": "a"}, {"server": "http://y", "id": "a"}], "runners[1].id"),
        (
            [{"server": "http://x", "token": "t"}, {"server": "http://x", "token": "t"}],
            "runners[1].token",
        ),
        ([{"id": "a"}], "runners[0].server"),
        ([{"server": "http://x", "nope": 1}], "runners[0].nope"),
    ],
)
def test_runner_config_errors_name_the_key(runners: list[dict[str, Any]], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"runners": runners})
    assert info.value.key == key


def test_body_encoding_rule() -> None:
    for ctype in ("application/json", "text/plain", "text/event-stream; charset=utf-8"):
        assert body_encoding([("Content-Type", ctype)]) == "utf-8"
    for ctype in ("application/jsonl", "application/x-ndjson"):
        assert body_encoding([("content-type", ctype)]) == "utf-8"
    assert body_encoding([("content-type", "application/octet-stream")]) == "base64"
    assert body_encoding([]) == "base64"


class _Sink:
    """Stands in for a tunnel: records the frames a Responder sends."""

    def __init__(self) -> None:
        self.frames: list[Any] = []

    async def send(self, frame: Any, **kw: Any) -> None:
        self.frames.append(frame)


async def test_responder_binary_and_large_bodies() -> None:
    sink = _Sink()
    data = bytes(range(256)) * 5000  # 1.28 MB, not UTF-8
    await Responder(sink, "r1").respond(  # type: ignore[arg-type]
        json_response(200, {}).__class__(
            status=200, headers=[("content-type", "application/octet-stream")], body=data
        )
    )
    bodies = [f for f in sink.frames if isinstance(f, ResponseBodyFrame)]
    assert len(bodies) > 1 and {f.encoding for f in bodies} == {"base64"}
    assert b"".join(base64.b64decode(f.body) for f in bodies) == data
    sink.frames.clear()
    # Declared text that is not UTF-8 falls back to base64 rather than failing.
    await Responder(sink, "r2").respond(  # type: ignore[arg-type]
        json_response(200, {}).__class__(
            status=200, headers=[("content-type", "text/plain")], body=b"\xff\xfe"
        )
    )
    body = next(f for f in sink.frames if isinstance(f, ResponseBodyFrame))
    assert (body.encoding, base64.b64decode(body.body)) == ("base64", b"\xff\xfe")


def test_stream_buffer_replays_dedups_repairs_and_compacts(tmp_path: Path) -> None:
    path = tmp_path / "streams.log"
    buf = StreamBuffer(path, max_events=3, compact_bytes=1)
    buf.load()
    assert buf.add("s", 1, b'{"n": 1}') and buf.add("s", 2, b'{"n": 2}')
    assert not buf.add("s", 2, b'{"n": 2}'), "same seq: a duplicate"
    assert buf.add("s", 5, b'{"n": 5}'), "gaps are fine"
    buf.delivered("s", 2)
    assert [seq for seq, _ in buf.take("s", 10, 10_000)] == [5]
    buf.add("t", 1, b"{}")
    buf.close()
    # A torn tail (a half-written record) is cut off; everything before it survives.
    with open(path, "ab") as f:
        f.write(b"\x10\x00\x00\x00garbage")
    again = StreamBuffer(path, max_events=3, compact_bytes=1)
    again.load()
    assert [seq for seq, _ in again.take("s", 10, 10_000)] == [5]
    assert not again.add("s", 2, b"{}"), "delivered before the restart: still a duplicate"
    for seq in range(6, 10):
        assert again.add("s", seq, b"{}")
    assert [seq for seq, _ in again.take("s", 10, 10_000)] == [7, 8, 9], "bounded: oldest dropped"
    assert again.stats["dropped"] == 2
    again.compact()
    again.close()
    third = StreamBuffer(path, max_events=3, compact_bytes=1)
    third.load()
    assert [seq for seq, _ in third.take("s", 2, 10_000)] == [7, 8]
    assert [seq for seq, _ in third.take("t", 10, 10_000)] == [1]
    assert not third.add("s", 6, b"{}")
    third.close()


# --- through a real host ---------------------------------------------------------------------


async def test_handshake_headers_hello_ping_and_runner_ids(host_factory, tunnels) -> None:
    token = "tok-" + os.urandom(4).hex()
    host = host_factory(host_config(tunnels, [{"token": token}, {"id": "runner a/b"}, {}]))
    async with running(host):
        by_token = await tunnels.wait_tunnel(token_bound_runner_id(token))
        named = await tunnels.wait_tunnel("runner a/b")
        state = await poll(
            host,
            lambda s: (
                len(s["tunnels"]) == 3 and all(t["state"] == "connected" for t in s["tunnels"])
            ),
        )
        stored_id = state["tunnels"][2]["runner_id"]
        unnamed = await tunnels.wait_tunnel(stored_id)
        assert stored_id.startswith("runner_")
        for t in (by_token, named, unnamed):
            assert t.prefix == "/omni"
            assert t.headers["origin"] == "omnigent://internal"
            # §A.2: the 0.19 fields, in the wire order omnigent's runner uses.
            assert list(t.hello) == [
                "kind",
                "runner_version",
                "frame_protocol_version",
                "harnesses",
                "envs",
                "telemetry_opt_out",
                "capabilities",
                "connection_id",
            ]
            assert t.hello == {
                "kind": "hello",
                "runner_version": __version__,
                "frame_protocol_version": 1,
                "harnesses": t.hello["harnesses"],
                # The sandbox is on offer where bubblewrap is installed (docs/tools.md).
                "envs": ["os_sandbox"] if shutil.which("bwrap") else [],
                "telemetry_opt_out": True,
                "capabilities": ["session-event-ingest-v1"],
                "connection_id": t.hello["connection_id"],
            }
            assert re.fullmatch(r"[0-9a-f]{32}", t.hello["connection_id"])
            # Every kind built in runs on this host (§L): all of them are advertised.
            assert t.hello["harnesses"] == ["open-responses", "openai", "openai-agents", "scripted"]
            # The fake sends event.ready after it takes the tunnel as live: wait, not assume.
            await tunnels.until(lambda t=t: t.event_ready, what="the server's event.ready")
            status = tunnel_of(state, t.runner_id)
            assert status["connection_id"] == t.hello["connection_id"]
            assert f"(connection {t.hello['connection_id']})" in host.log()
        assert by_token.headers["x-omnigent-runner-tunnel-token"] == token
        assert "x-omnigent-runner-tunnel-token" not in named.headers
        assert named.path == "/omni/v1/runners/runner%20a%2Fb/tunnel"
        assert await by_token.ping(1795966688595) == 1795966688595
        assert await named.ping(7) == 7
        assert tunnel_of(state, "runner a/b")["url"].startswith("ws://127.0.0.1:")
        # event.ready (§A.3) is recorded; event.ack for a batch nobody sent is counted, ignored.
        state = await poll(host, lambda s: all(t["event_ready"] for t in s["tunnels"]))
        await named.ack("b" * 32, applied=0, error="event type is not allowed on runner tunnel")
        await named.ack("c" * 32, applied=2)
        assert await named.ping(8) == 8
        state = await poll(host, lambda s: tunnel_of(s, "runner a/b")["event_acks"] == 2)
        assert tunnel_of(state, "runner a/b")["malformed"] == 0
        # A restarted gateway comes back under the same ids (the stored one included).
        pid = (await trio.to_thread.run_sync(host.actor, "gateway"))["pid"]
        os.kill(pid, signal.SIGKILL)
        again = await tunnels.wait_tunnel(stored_id, count=2)
        last = await tunnels.wait_tunnel(token_bound_runner_id(token), count=2)
        assert again.hello["connection_id"] != unnamed.hello["connection_id"], "new per attempt"
        ids = [t.hello["connection_id"] for t in tunnels.tunnels if t.hello]
        assert len(set(ids)) == len(ids)
        for t in tunnels.tunnels:
            assert t.violations == []
    # An orderly stop (SIGTERM) closes the tunnels with 1000 (§i.3).
    with trio.fail_after(5):
        await last.closed.wait()
    assert last.close_code == 1000


async def test_close_codes_4001_4002_4004_are_fatal_others_reconnect(host_factory, tunnels) -> None:
    tunnels.close_after_hello = {
        "r-4001": (4001, "expected hello frame"),
        "r-4002": (4002, "frame_protocol_version mismatch: server supports 1, runner sent 2"),
        "r-drop": (1011, "internal error"),
    }
    tunnels.reject_status = 403
    host = host_factory(
        host_config(
            tunnels,
            [
                {"id": "r-4001"},
                {"id": "r-4002"},
                {"id": "r-4004", "token": "not-the-token-of-this-id"},
                {"id": "r-drop"},
            ],
        )
    )
    async with running(host):
        # An HTTP refusal of the upgrade is retried, and says why meanwhile.
        await tunnels.until(lambda: len(tunnels.rejected) >= 8, what="rejected upgrades")
        state = await gateway_state(host)
        refused = tunnel_of(state, "r-drop")
        assert refused["state"] in ("reconnecting", "connecting")
        assert "HTTP 403" in (refused["error"] or "")
        tunnels.reject_status = None
        state = await poll(
            host,
            lambda s: [t["state"] for t in s["tunnels"][:3]] == ["fatal"] * 3,
        )
        for runner_id, code, cause in [
            ("r-4001", 4001, "hello"),
            ("r-4002", 4002, "frame protocol version"),
            ("r-4004", 4004, "does not match the tunnel token"),
        ]:
            t = tunnel_of(state, runner_id)
            assert t["close_code"] == code
            assert str(code) in t["error"] and cause in t["error"], t["error"]
            assert t["next_attempt_at"] is None
        # r-drop keeps reconnecting; meanwhile no fatal runner tries again.
        drops = len([t for t in tunnels.tunnels if t.runner_id == "r-drop"])
        await tunnels.wait_tunnel("r-drop", count=drops + 3)
        state = await poll(host, lambda s: tunnel_of(s, "r-drop")["next_attempt_at"] is not None)
        assert "1011" in tunnel_of(state, "r-drop")["error"]
        for runner_id in ("r-4001", "r-4002", "r-4004"):
            assert len([t for t in tunnels.tunnels if t.runner_id == runner_id]) == 1
        # Once the server stops closing it, r-drop stays connected.
        del tunnels.close_after_hello["r-drop"]
        await poll(host, lambda s: tunnel_of(s, "r-drop")["state"] == "connected")
    assert "not reconnecting" in host.log()


async def test_h01_h02_turn_end_to_end_with_an_approval(host_factory, tunnels, server) -> None:
    """A turn with a tool call and an approval through the tunnel. The harness's answers to
    control events pass through: a 204 with no body and no content-length (H-01), a JSON
    error byte for byte with its exact content-length (H-02)."""
    agent_id = server.add_agent(
        scripted_yaml(
            "approver",
            '{text: "Let me check. ", chunk: 4}',
            '{elicit: {message: "Deploy?"}}',
            '{text: "Deployed.", on_decline: "Not deployed."}',
        )
    )
    sid = server.add_session(agent_id)["id"]
    host = host_factory(host_config(tunnels, [{"id": "e2e"}], server=server))
    async with running(host):
        t = await tunnels.wait_tunnel("e2e")
        missing = await t.request("GET", f"/v1/sessions/{sid}")
        assert missing.status == 404, "not known before the init (§ii.3)"
        await bind(t, sid, agent_id)
        stream = tunnels.streams[sid][0]
        assert stream.first_was_heartbeat
        assert stream.response.status == 200
        assert stream.response.headers == [
            ["cache-control", "no-cache"],
            ["x-accel-buffering", "no"],
            ["content-type", "text/event-stream; charset=utf-8"],
        ]
        skills = await t.request("GET", f"/v1/sessions/{sid}/skills")
        assert (skills.status, skills.body) == (200, b'{"skills":[]}')
        terms = await t.request(
            "GET", f"/v1/sessions/{sid}/resources/terminals", query="order=asc&limit=1000"
        )
        assert terms.body == (
            b'{"object":"list","data":[],"first_id":null,"last_id":null,"has_more":false}'
        )
        accepted = await t.request(
            "POST", f"/v1/sessions/{sid}/events", message("go", agent_id, "approver")
        )
        assert (accepted.status, accepted.json) == (
            202,
            {"status": "accepted", "detail": "Turn started."},
        )
        title = await t.request(
            "POST", f"/v1/sessions/{sid}/background-title", {"prompt": "go", "agent_id": agent_id}
        )
        assert title.body == b'{"status":"unsupported","title":null}'
        ask = await tunnels.until(
            lambda: next(
                (
                    e
                    for e in tunnels.events.get(sid, [])
                    if e["type"] == "response.elicitation_request"
                ),
                None,
            ),
            what="the elicitation",
        )
        approval = {
            "type": "approval",
            "data": {"elicitation_id": ask["elicitation_id"], "action": "accept"},
        }
        answer = await t.request("POST", f"/v1/sessions/{sid}/events", approval)
        assert (answer.status, answer.body, answer.headers) == (204, b"", [])
        assert [c for c in t.received if c.get("id") == answer.id][-1]["kind"] == "response.end"
        approval["data"]["elicitation_id"] = "elicit_nobody_asked"
        unknown = await t.request("POST", f"/v1/sessions/{sid}/events", approval)
        assert unknown.status == 404
        assert unknown.body == json.dumps(json.loads(unknown.body), separators=(",", ":")).encode()
        assert dict(unknown.headers)["content-length"] == str(len(unknown.body))
        assert await tunnels.until_status(sid) == ["running", "idle"]
        assert tunnels.deltas(sid) == "Let me check. Deployed."
        types = [e["type"] for e in tunnels.events[sid]]
        assert types[0] == "session.status" and "response.completed" in types
        assert "response.created" not in types
        # The routes nobody owns, and the server's leg of a tool call.
        mcp = await t.request("POST", f"/v1/sessions/{sid}/mcp/execute", {"method": "tools/call"})
        assert (mcp.status, error_code(mcp.json)) == (422, "invalid_request")
        # §ii.9: the server's leg of a tool round trip runs the tool here.
        call = {
            "method": "tools/call",
            "params": {"name": "sys_os_shell", "arguments": {"command": "echo via-mcp"}},
        }
        mcp = await t.request("POST", f"/v1/sessions/{sid}/mcp/execute", call)
        assert mcp.status == 200, mcp.body
        assert json.loads(mcp.json["result"]["output"])["stdout"] == "via-mcp\n"
        nowhere = await t.request("GET", "/v2/elsewhere")
        assert (nowhere.status, nowhere.json) == (
            404,
            {
                "error": {
                    "code": "not_found",
                    "message": "No route GET /v2/elsewhere on this runner.",
                }
            },
        )
        assert nowhere.header("content-type") == "application/json"
        assert t.violations == []
        assert tunnels.stream_violations == []


async def test_concurrent_requests_multiplex_with_streams_heartbeats_and_cancel(
    host_factory, tunnels, server
) -> None:
    # The turn streams for ~1.8 s, so that the 120 requests are answered while it does (at
    # 4 ms a delta a busy machine once answered them all after its last one).
    agent_id = server.add_agent(scripted_yaml("busy", '{text: "x ", repeat: 150, delay_ms: 12}'))
    sid = server.add_session(agent_id)["id"]
    host = host_factory(
        host_config(tunnels, [{"id": "mux"}], server=server, gateway={"heartbeat_s": 0.3})
    )
    async with running(host):
        t = await tunnels.wait_tunnel("mux")
        await bind(t, sid, agent_id)
        stream = tunnels.streams[sid][0]
        await t.request("POST", f"/v1/sessions/{sid}/events", message("go", agent_id, "busy"))
        await tunnels.until(lambda: len(tunnels.deltas(sid)) > 20, what="deltas")
        results: dict[int, Any] = {}

        async def one(i: int) -> None:
            kind = i % 4
            if kind == 0:
                r = await t.request("GET", f"/v1/sessions/{sid}")
                results[i] = (r.status, r.json["id"])
            elif kind == 1:
                r = await t.request("GET", f"/v1/sessions/{sid}/skills")
                results[i] = (r.status, r.json)
            elif kind == 2:
                r = await t.request(
                    "POST", f"/v1/sessions/{sid}/background-title", {"prompt": str(i)}
                )
                results[i] = (r.status, r.json["status"])
            else:
                results[i] = await t.ping(i)

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                for i in range(120):
                    nursery.start_soon(one, i)
        assert len(results) == 120
        for i, got in results.items():
            assert (
                got
                == [
                    (200, sid),
                    (200, {"skills": []}),
                    (200, "unsupported"),
                    i,
                ][i % 4]
            ), (i, got)
        # Frames of different requests interleaved with the stream's bodies.
        ids = [f.get("id") for f in t.received if f.get("kind", "").startswith("response.")]
        first, last = (
            ids.index(stream.response.id),
            len(ids) - 1 - ids[::-1].index(stream.response.id),
        )
        assert len(set(ids[first:last])) > 10
        assert await tunnels.until_status(sid) == ["running", "idle"]
        assert tunnels.deltas(sid) == "x " * 150
        # Silence: heartbeats keep coming, and the stream never ends.
        beats = stream.heartbeats
        await tunnels.until(lambda: stream.heartbeats >= beats + 3, what="heartbeats")
        assert not stream.response.ended
        # request.cancel stops that request's work: a second session's stream goes away.
        other = await t.open_stream("other-session")
        await poll(host, lambda s: s["streams"] == 2)
        await t.cancel(other.response.id)
        await poll(host, lambda s: s["streams"] == 1)
        assert t.violations == []


async def _fewest_tasks(host: HostProcess, samples: int = 5) -> int:
    """The gateway's trio tasks, the fewest of a few looks: a heartbeat's sender task lives
    for a moment, and one look may catch it."""
    counts = []
    for _ in range(samples):
        counts.append((await gateway_state(host))["tasks"])
        await trio.sleep(0.05)
    return min(counts)


async def test_open_streams_hold_no_task_beat_and_go_with_their_connection(
    host_factory, tunnels, server
) -> None:
    """Issue #20: a stream the server holds open is a record, not a task — 30 idle streams
    leave the gateway's tasks as they were, every one of them still gets its heartbeats, and
    all of them are forgotten (nothing kept per session) when their connection goes."""
    host = host_factory(
        host_config(tunnels, [{"id": "idle"}], server=server, gateway={"heartbeat_s": 0.3})
    )
    async with running(host):
        t = await tunnels.wait_tunnel("idle")
        await poll(host, lambda s: tunnel_of(s, "idle")["state"] == "connected")
        before = await _fewest_tasks(host)
        streams = [await t.open_stream(f"idle-{i}") for i in range(30)]
        state = await poll(host, lambda s: s["streams"] == 30)
        assert state["stream_sessions"] == 30
        assert tunnel_of(state, "idle")["responses_open"] == 30
        assert tunnel_of(state, "idle")["requests_in_flight"] == 0
        assert await _fewest_tasks(host) <= before
        # A request frame reusing an open stream's id, well formed or not, is refused as
        # malformed and answered on nothing: the stream's response stays whole.
        taken = streams[1].response.id
        bad = {"kind": "request", "id": taken, "method": "GET", "path": "/v1/x", "headers": []}
        malformed = tunnel_of(await gateway_state(host), "idle")["malformed"]
        await t.send(bad)
        await t.send({**bad, "method": 5})
        await poll(host, lambda s: tunnel_of(s, "idle")["malformed"] == malformed + 2)
        for stream in streams:
            beats = stream.heartbeats
            await tunnels.until(lambda s=stream, b=beats: s.heartbeats >= b + 2, what="beats")
            assert not stream.response.ended
        assert t.violations == []
        # The server cancels one: it alone is gone.
        await t.cancel(streams[0].response.id)
        await poll(host, lambda s: s["streams"] == 29 and s["stream_sessions"] == 29)
        # The connection goes: so do the streams on it, and what was kept for their sessions.
        await t.close(1012, "restarting")
        state = await poll(host, lambda s: s["streams"] == 0)
        assert state["stream_sessions"] == 0
        again = await tunnels.wait_tunnel("idle", count=2)
        await poll(host, lambda s: tunnel_of(s, "idle")["state"] == "connected")
        assert tunnel_of(await gateway_state(host), "idle")["responses_open"] == 0
        fresh = await again.open_stream("idle-0")
        beats = fresh.heartbeats
        await tunnels.until(lambda: fresh.heartbeats >= beats + 2, what="beats on the new one")
        assert again.violations == []


async def test_binary_bodies_malformed_and_oversized_frames(host_factory, tunnels, server) -> None:
    host = host_factory(
        host_config(tunnels, [{"id": "edge"}], server=server, gateway={"max_frame_bytes": 65536})
    )
    async with running(host):
        t = await tunnels.wait_tunnel("edge")
        body = json.dumps({"session_id": "s-bin", "agent_id": None}).encode()
        init = await t.request("POST", "/v1/sessions", raw=body, encoding="base64")
        assert (init.status, init.json["id"]) == (201, "s-bin")
        bad = await t.request("POST", "/v1/sessions", raw=b"x", encoding="base64")
        bad_frame = next(
            f for f in t.received if f.get("id") == bad.id and f["kind"] == "response.head"
        )
        assert bad_frame["status"] == 400
        # A body that is not base64 at all: the gateway itself refuses it.
        garbled, frame = t.start_request("POST", "/v1/sessions", raw=b"x", encoding="base64")
        await t.send({**frame, "body": "%%% not base64"})
        await garbled.wait()
        assert (garbled.status, garbled.json) == (
            400,
            {
                "error": {
                    "code": "invalid_input",
                    "message": "The request body is not valid base64.",
                }
            },
        )
        for junk in [
            "not json",
            '{"kind": "nope"}',
            '{"kind": "request", "id": 5, "method": "GET", "path": "/"}',
            '{"kind": "request"}',
            '{"kind": "ping", "ts": "soon"}',
            b"\x00binary",
        ]:
            await t.send(junk) if isinstance(junk, str) else await t.ws.send_message(junk)
        still = await t.request("GET", "/v1/sessions/s-bin/skills")
        assert still.status == 200
        state = await gateway_state(host)
        assert tunnel_of(state, "edge")["malformed"] == 6
        assert tunnel_of(state, "edge")["connects"] == 1
        # Over the limit: refused with 413, and the tunnel stays up.
        big = await t.request("POST", "/v1/sessions", {"session_id": "s", "pad": "x" * 70_000})
        assert (big.status, big.json["error"]["code"]) == (413, "payload_too_large")
        assert "limit of 65536" in big.json["error"]["message"]
        assert (await t.request("GET", "/v1/sessions/s-bin")).status == 200
        # Far over it: the runner closes the tunnel (1009) and comes back.
        _, frame = t.start_request("POST", "/v1/sessions", {"pad": "y" * 300_000})
        await t.send(frame)
        with trio.fail_after(10):
            await t.closed.wait()
        again = await tunnels.wait_tunnel("edge", count=2)
        assert (await again.request("GET", "/v1/sessions/s-bin")).status == 200
        state = await gateway_state(host)
        assert tunnel_of(state, "edge")["oversized"] == 1
        assert t.violations == [] and again.violations == []


async def test_reconnect_reinits_sessions_and_resumes_without_loss_or_duplicates(
    host_factory, tunnels, server
) -> None:
    """After a server restart (1012) every delta reaches the server, in order, and none a
    ping proved read goes again. omnigent 0.19.1 can neither acknowledge a stream event nor
    drop a replayed one, so the frames written since the last answered ping are in doubt
    at the cut: they go again on the resumed stream (``buffer.resent``), and only those can
    show twice across the two streams (the restarted process's relay has them once)."""
    text = numbered(300)
    agent_id = server.add_agent(scripted_yaml("long", f'{{text: "{text}", chunk: 4, delay_ms: 4}}'))
    sid = server.add_session(agent_id)["id"]
    host = host_factory(host_config(tunnels, [{"id": "rc"}], server=server))
    async with running(host):
        t = await tunnels.wait_tunnel("rc")
        await bind(t, sid, agent_id)
        await t.request("POST", f"/v1/sessions/{sid}/events", message("go", agent_id, "long"))
        await tunnels.until(lambda: len(tunnels.deltas(sid)) >= 40, what="deltas")
        # The server goes away for a while (restart): upgrades refused, then accepted again.
        tunnels.reject_status = 503
        await t.close(1012, "service restart")
        state = await poll(host, lambda s: s["pending_events"] >= 30 and len(tunnels.rejected) >= 2)
        assert tunnel_of(state, "rc")["state"] in ("reconnecting", "connecting")
        tunnels.reject_status = None
        assert await tunnels.until_status(sid, timeout=30) == ["running", "idle"]
        state = await poll(host, lambda s: s["pending_events"] == 0)
        first, resumed = tunnels.streams[sid]
        old, new = first.events, resumed.events
        again = next(
            k for k in range(min(len(old), len(new)), -1, -1) if old[len(old) - k :] == new[:k]
        )
        assert again <= state["buffer"]["resent"], "only events no ping proved read go again"
        got = "".join(e.get("delta", "") for e in old + new[again:])
        assert got == text, f"every event, in order: {_first_difference(got, text)}"
        runner_id, session_id, status, body = tunnels.reinits[0]
        assert (runner_id, session_id, status) == ("rc", sid, 201)
        assert body["session_init_protocol_version"] == 2
        assert resumed.first_was_heartbeat
        assert max(resumed.frame_sizes) > 1, "backed-up events share frames"
        assert max(resumed.frame_sizes) <= 64
        assert all(not x.violations for x in tunnels.tunnels)
        assert state["buffer"]["duplicates"] == 0


async def test_a_frame_that_crosses_the_servers_close_is_sent_again_once(
    host_factory, tunnels
) -> None:
    """A server's Close proves nothing about frames still on the wire: omnigent's uvicorn
    sends 1012 and closes the socket, reading nothing after it. A stream frame written after
    the server stopped reading, and before its Close reached the gateway, goes again on the
    next stream; one a ping proved read does not. (Taking the Close as proof lost 2 to 4 deltas
    in about one reconnect test in ten.)"""
    from tests.integration.test_gateway_019 import delta, owner_config, publish

    host = host_factory(owner_config(tunnels, "cut"))
    async with running(host):
        t = await tunnels.wait_tunnel("cut")
        await t.open_stream("s-cut")
        await publish(t, "s-cut", (1, delta("a ")))
        await poll(host, lambda s: s["pending_events"] == 0)  # a ping proved "a " read
        # The server stops reading: its reader takes the pong of this ping and then of a
        # second one (into its one-message queue), and blocks on the next message, so no
        # ping after it is answered.
        t.pause()
        await t.ping()
        await t.send({"kind": "ping", "ts": 2})
        _, frame = t.start_request(
            "POST", "/v1/sessions/s-cut/events", {"publish": [[2, delta("b ")]]}
        )
        await t.send(frame)
        await poll(host, lambda s: s["unsent_events"] == 0 and s["pending_events"] == 1)
        await t.close(1012, "service restart")  # "b " was written, never read
        t.resume()
        again = await tunnels.wait_tunnel("cut", count=2)
        await again.open_stream("s-cut")
        await publish(again, "s-cut", (3, delta("c ")))
        await tunnels.until(lambda: tunnels.deltas("s-cut").endswith("c "), what='"c "')
        assert tunnels.deltas("s-cut") == "a b c ", "every delta once, in order"
        state = await poll(host, lambda s: s["pending_events"] == 0)
        assert state["buffer"]["resent"] == 1
        assert not again.violations


@pytest.mark.chaos
async def test_kill9_gateway_mid_stream_every_event_once(host_factory, tunnels, server) -> None:
    text = numbered(300)
    agent_id = server.add_agent(scripted_yaml("long", f'{{text: "{text}", chunk: 4, delay_ms: 4}}'))
    sid = server.add_session(agent_id)["id"]
    host = host_factory(host_config(tunnels, [{"id": "k9"}], server=server))
    async with running(host):
        t = await tunnels.wait_tunnel("k9")
        await bind(t, sid, agent_id)
        await t.request("POST", f"/v1/sessions/{sid}/events", message("go", agent_id, "long"))
        await tunnels.until(lambda: len(tunnels.deltas(sid)) >= 60, what="deltas")
        pid = (await trio.to_thread.run_sync(host.actor, "gateway"))["pid"]
        os.kill(pid, signal.SIGKILL)
        with trio.fail_after(10):
            await t.closed.wait()
        await tunnels.wait_tunnel("k9", count=2)
        assert await tunnels.until_status(sid, timeout=30) == ["running", "idle"]
        got = tunnels.deltas(sid)
        assert got == text, f"lost or repeated deltas around {_first_difference(got, text)}"
        assert len(tunnels.streams[sid]) == 2
        assert all(not x.violations for x in tunnels.tunnels)


def _first_difference(a: str, b: str) -> str:
    i = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return f"char {i}: got {a[i - 12 : i + 12]!r}, want {b[i - 12 : i + 12]!r}"


def test_a_buffer_bound_at_or_below_the_replay_window_is_refused() -> None:
    """Flow control waits for a full session's stream to confirm events; a stream keeps
    ``replay_window_events`` read ones for its server's cursor, so a bound at or below that
    would never clear: refused as the options decode (as ``corral up`` decodes them), the key
    named."""
    options = {"max_buffered_events": 1024, "replay_window_events": 1024}
    with pytest.raises(ConfigError, match="above replay_window_events") as info:
        check_options("gateway", options, GatewayOptions)
    assert info.value.key == "actors.gateway.options.max_buffered_events"
    options["max_buffered_events"] = 1025
    assert check_options("gateway", options, GatewayOptions).max_buffered_events == 1025
