"""Bad input is answered 4xx where it enters, and the session goes on (issue #15, item 6).

A real host through the fake tunnel server (the gateway, dispatch and a scripted worker), and
dispatch on its own behind a stand-in gateway: a body over the bus limit is 413, a body that
is not UTF-8, holds a lone surrogate escape or nests too deep is 400 naming the reason, a
session id that breaks the rule (``corral._input.SESSION_ID_RULE``) is 400 naming it, and a
message whose ``content`` is not a list (D-02) is 422 naming the field. Each refusal is logged
once, without a traceback, and a good message afterwards runs as if nothing had happened.
The control plane's HTTP API is in ``test_control_plane_bad_input.py``.
"""

from __future__ import annotations

import json
from typing import Any

from corral._input import MAX_JSON_DEPTH, SESSION_ID_RULE
from tests.conftest import FAST_LIVENESS
from tests.fake_server import user_message
from tests.fake_tunnel_server import FakeTunnelServer, Response, Tunnel
from tests.integration._gateway import fake_gateway, scripted_yaml
from tests.integration.test_gateway import bind, host_config, message, running

#: The worker's answer: the user texts of the history it was given, so a turn shows what the
#: session kept (and that no refused input left a trace in it).
_ECHO = "{echo_history: true}"


def deep(depth: int) -> bytes:
    """A message whose ``content`` is ``depth`` nested arrays."""
    return b'{"type": "message", "content": ' + b"[" * depth + b"]" * depth + b"}"


#: An escaped high surrogate with no low one after it: JSON's grammar allows it, Unicode not.
LONE_SURROGATE = rb'{"type": "message", "content": [{"type": "input_text", "text": "\ud800"}]}'
NOT_UTF8 = b'{"type": "message", "content": [{"type": "input_text", "text": "\xff"}]}'


def refusal(answer: Response) -> tuple[int | None, str, str]:
    error = answer.json["error"]
    return answer.status, error["code"], error["message"]


def user_texts(deltas: str) -> list[str]:
    """The user texts of an ``echo_history`` turn's ``[role, text]`` pairs."""
    return [text for role, text in json.loads(deltas) if role == "user"]


async def turn(tunnels: FakeTunnelServer, t: Tunnel, sid: str, agent_id: str, text: str) -> str:
    """A good message, run to its end; the text the worker streamed."""
    idle = tunnels.statuses(sid).count("idle")
    before = len(tunnels.deltas(sid))
    answer = await t.request("POST", f"/v1/sessions/{sid}/events", message(text, agent_id, "a"))
    assert answer.status == 202, answer.body
    await tunnels.until_status(sid, count=idle + 1)
    return tunnels.deltas(sid)[before:]


async def test_d02_bad_bodies_and_session_ids_are_4xx_at_the_tunnel_and_the_session_goes_on(
    host_factory, tunnels, server
) -> None:
    agent_id = server.add_agent(scripted_yaml("a", _ECHO))
    sid = server.add_session(agent_id)["id"]  # 32 hex digits, as the real server mints
    host = host_factory(host_config(tunnels, [{"id": "bad-input"}], server=server))
    async with running(host):
        t = await tunnels.wait_tunnel("bad-input")
        await bind(t, sid, agent_id)
        assert user_texts(await turn(tunnels, t, sid, agent_id, "first")) == ["first"]
        events = f"/v1/sessions/{sid}/events"

        # Over the bus limit (4 MiB), under the tunnel's frame limit (100 MiB): 413, and
        # dispatch never hears of it.
        big = message("x" * (5 * 1024 * 1024), agent_id, "a")
        status, code, text = refusal(await t.request("POST", events, big, timeout=60))
        assert (status, code) == (413, "payload_too_large")
        assert "the limit is 4194304 bytes" in text

        # Not UTF-8, a lone surrogate, nesting 100,000 deep: 400, each naming its reason.
        status, code, text = refusal(
            await t.request("POST", events, raw=NOT_UTF8, encoding="base64")
        )
        assert (status, code) == (400, "invalid_json")
        assert "not valid UTF-8" in text
        status, code, text = refusal(await t.request("POST", events, raw=LONE_SURROGATE))
        assert (status, code) == (400, "invalid_json")
        assert "lone UTF-16 surrogate" in text
        status, code, text = refusal(await t.request("POST", events, raw=deep(100_000)))
        assert (status, code) == (400, "invalid_json")
        assert f"more than {MAX_JSON_DEPTH} levels deep" in text
        assert (await t.request("POST", events, raw=deep(MAX_JSON_DEPTH - 1))).status == 422

        # D-02: content is a list (of items or blocks); the field is named.
        status, code, text = refusal(
            await t.request("POST", events, {"type": "message", "content": 5})
        )
        assert (status, code) == (422, "invalid_event")
        assert "$.content" in text

        # Session ids: in a path (the gateway) and in an init body (dispatch).
        for path in ["/v1/sessions/../events", "/v1/sessions/a.b", "/v1/sessions/s%2F1/stream"]:
            status, code, text = refusal(await t.request("POST", path, {"type": "interrupt"}))
            assert (status, code) == (400, "invalid_session_id"), path
            assert SESSION_ID_RULE in text
        for bad in ["../../etc", "", "x" * 129, "s 1"]:
            init = {"session_id": bad, "agent_id": agent_id}
            status, code, text = refusal(await t.request("POST", "/v1/sessions", init))
            assert (status, code) == (400, "invalid_session_id"), bad
            assert SESSION_ID_RULE in text

        # A request frame that does not decode (a lone surrogate in the frame itself) is
        # answered too, instead of being left for the server to time out.
        broken, frame = t.start_request("GET", f"/v1/sessions/{sid}")
        await t.send(json.dumps(frame).replace(sid, "\\udc00"))
        await broken.wait()
        assert (broken.status, broken.json["error"]["code"]) == (400, "invalid_input")

        # The session goes on: the next turn's history holds both good messages, no bad one.
        assert user_texts(await turn(tunnels, t, sid, agent_id, "after")) == ["first", "after"]
        assert tunnels.statuses(sid) == ["running", "idle", "running", "idle"]

        # The real server stores a message before it forwards it, so the one refused 413 is in
        # every later history it gives; it is left out with a note, and the turn runs.
        stored = server.add_session(agent_id)["id"]
        server.add_item(stored, user_message("y" * (5 * 1024 * 1024)))
        await bind(t, stored, agent_id)
        [note, after] = user_texts(await turn(tunnels, t, stored, agent_id, "after"))
        assert note.startswith("[System: a message of ") and "is left out here" in note
        assert after == "after"
        assert t.violations == [] and tunnels.stream_violations == []
    log = host.log()
    assert "Traceback" not in log
    assert log.count("refused ") == 13, log
    assert log.count("payload_too_large") == 1


async def test_d02_dispatch_refuses_bad_ids_and_bodies_a_gateway_passes_on(
    host_factory, server
) -> None:
    """Dispatch checks what enters it too: a bus peer other than the gateway (or a gateway
    that does not check) gets the same 4xx."""
    agent_id = server.add_agent(scripted_yaml("a", _ECHO))
    sid = server.add_session(agent_id)["id"]
    config = (
        FAST_LIVENESS
        + "[actors.dispatch.options]\n"
        + f'server_url = "{server.base_url}"\nsubscribers = ["test-gateway"]\n'
        + f'[actors.policy.options]\nserver_url = "{server.base_url}"\n'
    )
    host = host_factory(config)
    async with running(host), fake_gateway(host.endpoint) as gw:
        assert (await gw.init(sid, agent_id)).status == 201

        async def refused(path: str, raw: bytes) -> tuple[int, str, str]:
            reply = await gw.request("POST", path, raw=raw)
            error: dict[str, Any] = json.loads(reply.body)["error"]
            return reply.status, error["code"], error["message"]

        events = f"/v1/sessions/{sid}/events"
        for path in ["/v1/sessions/../events", "/v1/sessions/./events", "/v1/sessions/a:b/events"]:
            status, code, text = await refused(path, b'{"type": "interrupt"}')
            assert (status, code) == (400, "invalid_session_id"), path
            assert SESSION_ID_RULE in text
        status, code, text = await refused("/v1/sessions", b'{"session_id": ".."}')
        assert (status, code) == (400, "invalid_session_id")
        for raw, why in [
            (deep(100_000), "levels deep"),
            (LONE_SURROGATE, "lone UTF-16 surrogate"),
            (NOT_UTF8, "not valid UTF-8"),
        ]:
            status, code, text = await refused(events, raw)
            assert (status, code) == (400, "invalid_json"), why
            assert why in text
            status, code, text = await refused(f"/v1/sessions/{sid}/mcp/execute", raw)
            assert (status, code) == (400, "invalid_json"), why
        status, code, text = await refused(events, b'{"type": "message", "content": 5}')
        assert (status, code) == (422, "invalid_event")
        assert "$.content" in text
        assert gw.statuses(sid) == [], "bad events change nothing"
        await gw.message(sid, "after")
        assert await gw.until_status(sid) == ["running", "idle"]
        assert user_texts(gw.texts(sid)) == ["after"]
    log = host.log()
    assert "Traceback" not in log
    assert log.count("refused ") == 11, log
