"""The gateway against the fake tunnel server's 0.19 behaviour (PROTOCOL_0_19.md): close codes
(§K.1, §K.4), the stream vocabulary (§D.2), the resource routes and their fallback (§H),
``DELETE /v1/sessions/{id}`` (§I.1, §A.5), advertised harnesses (§L) and error shapes (§H.2).

A small stand-in actor (:class:`OwnerActor`) takes the place of dispatch and of the tools
actor, so that what the gateway does with their answers is tested on its own: it publishes
the session events a test names, answers ``DELETE /v1/sessions/{id}`` as dispatch does, and
echoes every resource request it gets.
"""

from __future__ import annotations

import json
import re
from typing import Any

import trio
from trio_websocket import ConnectionClosed, open_websocket_url

from corral.actors._actor import Actor, handles
from corral.actors.gateway.messages import SessionEvent, SessionEvents
from corral.bus import Incoming
from corral.routes import HttpRequest, HttpResponse, json_response
from tests.fake_tunnel_server import FakeTunnelServer, Tunnel
from tests.integration.test_gateway import (
    FAST_BACKOFF,
    gateway_state,
    host_config,
    poll,
    running,
    tunnel_of,
)


class OwnerActor(Actor):
    """Stands in for dispatch and the tools actor (configured under either name).

    ``POST /v1/sessions/{id}/events`` with ``{"publish": [[seq, event], ...]}`` publishes
    those events to the gateway (durably, as dispatch does) and answers 202;
    ``DELETE /v1/sessions/{id}`` answers 200 ``session.deleted`` (404 for ids starting with
    ``keep-``); anything else is echoed back as 200 ``{"owner", "method", "path", "query",
    "body"}``.
    """

    @handles(HttpRequest)
    async def http(self, msg: HttpRequest, incoming: Incoming) -> HttpResponse:
        parts = msg.path.strip("/").split("/")
        session_id, rest = (parts[2] if len(parts) > 2 else ""), parts[3:]
        if msg.method == "POST" and rest == ["events"] and "publish" in (msg.json() or {}):
            events = [
                SessionEvent(session_id=session_id, seq=seq, event=json.dumps(event).encode())
                for seq, event in msg.json()["publish"]
            ]
            await self.peer.cast("gateway", SessionEvents(events=events), durable=True)
            return json_response(202, {"queued": True})
        if msg.method == "DELETE" and parts[:2] == ["v1", "sessions"] and not rest:
            if session_id.startswith("keep-"):
                error = {"code": "not_found", "message": f"no session {session_id}"}
                return json_response(404, {"error": error})
            deleted = {"session_id": session_id, "object": "session.deleted", "deleted": True}
            return json_response(200, deleted)
        echo = {
            "owner": self.ctx.name,
            "method": msg.method,
            "path": msg.path,
            "query": msg.query,
            "body": msg.body.decode(),
        }
        return json_response(200, echo)


_OWNER = "tests.integration.test_gateway_019:OwnerActor"
_QUIET = "[actors.harness]\nenabled = false\n[actors.policy]\nenabled = false\n"


def owner_config(tunnels: FakeTunnelServer, runner: str, *, tools: bool = True, **gateway) -> str:
    """A host whose dispatch (and tools, or none) is the stand-in, with one runner."""
    text = host_config(tunnels, [{"id": runner}], gateway=gateway)
    text += _QUIET + f'[actors.dispatch]\ntarget = "{_OWNER}"\n'
    text += (
        f'[actors.tools]\ntarget = "{_OWNER}"\n' if tools else "[actors.tools]\nenabled = false\n"
    )
    return text


async def publish(t: Tunnel, session_id: str, *events: tuple[int, dict[str, Any]]) -> None:
    body = {"publish": [[seq, event] for seq, event in events]}
    answer = await t.request("POST", f"/v1/sessions/{session_id}/events", body)
    assert answer.status == 202, answer.body


def delta(text: str) -> dict[str, Any]:
    return {"type": "response.output_text.delta", "delta": text}


# --- close codes (§K.1, §K.4) -----------------------------------------------------------------


async def test_recycles_reconnect_soon_1013_backs_off_4500_is_fatal(host_factory, tunnels) -> None:
    """1012/1001 and HTTP 502 are recycles: a fresh backoff and U(recycle_min, recycle_max)
    seconds. With a 5 s backoff base, four tunnels within a few seconds can only come so."""
    tunnels.close_after_hello = {
        "r-1012": (1012, "service restart"),
        "r-1001": (1001, "going away"),
        "r-1013": (1013, "hello timeout"),
        "r-4500": (4500, "internal error"),
    }
    tunnels.reject_runner = {"r-502": 502}
    runners = [{"id": r} for r in ("r-1012", "r-1001", "r-502", "r-1013", "r-4500")]
    slow = "backoff_base_s = 5\nbackoff_cap_s = 10\nrecycle_min_s = 0.1\nrecycle_max_s = 0.3\n"
    config = host_config(tunnels, runners).replace(FAST_BACKOFF, slow)
    host = host_factory(config)
    async with running(host):
        with trio.fail_after(8):
            await tunnels.wait_tunnel("r-1012", count=4)
            await tunnels.wait_tunnel("r-1001", count=4)
            await tunnels.until(
                lambda: [path for path, _ in tunnels.rejected if "/r-502/" in path][3:],
                what="4 refused upgrades of r-502",
            )
        for runner_id, why in [
            ("r-1012", "1012 (service restart): the server is restarting"),
            ("r-1001", "1001 (going away): the server is going away (recycled)"),
            ("r-502", "the server refused the tunnel upgrade with HTTP 502"),
        ]:
            state = await poll(
                host, lambda s, r=runner_id: tunnel_of(s, r)["state"] == "reconnecting"
            )
            recycling = tunnel_of(state, runner_id)
            assert why in recycling["error"]
            assert 0.0 <= recycling["next_attempt_at"] - recycling["since"] <= 0.31
        # 1013: the normal backoff (the first step of a 5 s base is 2.5-7.5 s), and why.
        state = await poll(host, lambda s: tunnel_of(s, "r-1013")["state"] == "reconnecting")
        hello_timeout = tunnel_of(state, "r-1013")
        assert hello_timeout["close_code"] == 1013
        assert hello_timeout["error"] == (
            "the tunnel closed with 1013 (hello timeout): the server got no hello from this "
            "runner within its 30 s limit"
        )
        assert hello_timeout["next_attempt_at"] - hello_timeout["since"] >= 2.4
        fatal = tunnel_of(state, "r-4500")
        assert (fatal["state"], fatal["close_code"]) == ("fatal", 4500)
        assert "4500" in fatal["error"] and "internal" in fatal["error"]
        assert len([t for t in tunnels.tunnels if t.runner_id == "r-4500"]) == 1


# --- the stream vocabulary (§D.2) -------------------------------------------------------------


async def test_only_the_servers_stream_types_go_upstream(host_factory, tunnels) -> None:
    host = host_factory(owner_config(tunnels, "vocab"))
    async with running(host):
        t = await tunnels.wait_tunnel("vocab")
        # Published before any stream is open: only accepted events wait in the buffer.
        await publish(
            t,
            "s1",
            (1, delta("a")),
            (2, {"type": "runtime_model", "model": "m", "provider": "p"}),
            (3, delta("b")),
            (4, {"type": "injection.consumed", "injection_id": "i"}),
        )
        state = await poll(host, lambda s: s["off_stream"].get("injection.consumed"))
        assert state["pending_events"] == 2
        await t.open_stream("s1")
        await tunnels.until(lambda: tunnels.deltas("s1") == "ab", what="the deltas")
        # Redelivered (same seqs): duplicates, counted once; then new ones, filtered or sent.
        await publish(t, "s1", (2, {"type": "runtime_model"}), (3, delta("b")))
        await publish(
            t,
            "s1",
            (5, {"type": "warning", "message": "fallback"}),
            (6, {"type": "policy_evaluation.requested", "phase": "PHASE_TOOL_CALL"}),
            (7, {"no": "type"}),
            (8, delta("c")),
            (9, {"type": "session.status", "status": "idle"}),
        )
        await tunnels.until(lambda: tunnels.statuses("s1") == ["idle"], what="idle")
        state = await poll(host, lambda s: s["pending_events"] == 0)
        assert state["off_stream"] == {
            "runtime_model": 1,
            "injection.consumed": 1,
            "warning": 1,
            "policy_evaluation.requested": 1,
            "(no type)": 1,
        }
        assert state["buffer"]["duplicates"] == 2
        assert tunnels.deltas("s1") == "abc"
        assert [e["type"] for e in tunnels.events["s1"]] == [
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.delta",
            "session.status",
        ]
        assert tunnels.stream_violations == [] and t.violations == []
    assert host.log().count("session events of type runtime_model stay off") == 1


# --- DELETE /v1/sessions/{id} (§I.1, §A.5) ----------------------------------------------------


async def test_delete_ends_the_stream_with_done_and_forgets_the_session(
    host_factory, tunnels
) -> None:
    host = host_factory(owner_config(tunnels, "del"))
    async with running(host):
        t = await tunnels.wait_tunnel("del")
        stream = await t.open_stream("s-del")
        await publish(t, "s-del", (1, delta("x")))
        await tunnels.until(lambda: tunnels.deltas("s-del") == "x", what="x")
        # A session whose stream is not open has undelivered events; they are forgotten.
        await publish(t, "s-idle", (1, delta("1")), (2, delta("2")), (3, delta("3")))
        await poll(host, lambda s: s["pending_events"] == 3)
        gone = await t.request("DELETE", "/v1/sessions/s-idle")
        assert gone.json == {"session_id": "s-idle", "object": "session.deleted", "deleted": True}
        state = await poll(host, lambda s: s["pending_events"] == 0)
        assert state["buffer"]["forgotten"] == 3
        # The open stream ends cleanly, [DONE] then response.end, before the 200 goes out.
        deleted = await t.request("DELETE", "/v1/sessions/s-del")
        assert (deleted.status, deleted.json["object"]) == (200, "session.deleted")
        assert stream.done and stream.response.ended
        kinds = [(f["kind"], f.get("id")) for f in t.received]
        assert kinds.index(("response.end", stream.response.id)) < kinds.index(
            ("response.head", deleted.id)
        )
        assert stream.response.body.endswith(b"data: [DONE]\n\n")
        # The fake (as the real server) cancels the finished stream: ignored; the tunnel lives.
        await tunnels.until(
            lambda: any(
                f.get("kind") == "request.cancel"
                for f in t.sent
                if f.get("id") == stream.response.id
            ),
            what="the server's request.cancel",
        )
        assert await t.ping(42) == 42
        # Events published after the delete go nowhere.
        await publish(t, "s-del", (2, delta("late")))
        state = await poll(host, lambda s: s["after_delete"] == 1)
        assert state["pending_events"] == 0 and state["streams"] == 0
        # A delete dispatch refuses leaves the stream open.
        kept = await t.open_stream("keep-1")
        refused = await t.request("DELETE", "/v1/sessions/keep-1")
        assert refused.status == 404
        await publish(t, "keep-1", (1, delta("still")))
        await tunnels.until(lambda: tunnels.deltas("keep-1") == "still", what="still")
        assert not kept.done and not kept.response.ended
        state = await gateway_state(host)
        assert tunnel_of(state, "del")["connects"] == 1
        assert t.violations == [] and tunnels.stream_violations == []


# --- resources (§H) ---------------------------------------------------------------------------

_RESOURCE_ROUTES = [
    ("GET", "resources", ""),
    ("GET", "resources/environments", ""),
    ("GET", "resources/environments/default", ""),
    ("GET", "resources/environments/default/filesystem", "limit=20&order=desc"),
    ("GET", "resources/environments/default/filesystem/hello.txt", "scope=reach"),
    ("PUT", "resources/environments/default/filesystem/new.txt", ""),
    ("PATCH", "resources/environments/default/filesystem/new.txt", ""),
    ("DELETE", "resources/environments/default/filesystem/new.txt", "recursive=true"),
    ("GET", "resources/environments/default/search", "q=hello&limit=500"),
    ("GET", "resources/environments/default/changes", ""),
    ("GET", "resources/environments/default/diff/hello.txt", ""),
    ("POST", "resources/environments/default/shell", ""),
    ("GET", "resources/terminals", "order=asc&limit=1000"),
    ("POST", "resources/terminals", ""),
    ("DELETE", "resources", ""),
]


async def test_every_resource_route_goes_to_the_tools_actor(host_factory, tunnels) -> None:
    host = host_factory(owner_config(tunnels, "res"))
    async with running(host):
        t = await tunnels.wait_tunnel("res")
        for method, rest, query in _RESOURCE_ROUTES:
            path = f"/v1/sessions/s-r/{rest}"
            body = {"command": "pwd"} if method in ("POST", "PUT", "PATCH") else None
            answer = await t.request(method, path, body, query=query)
            assert (answer.status, answer.json) == (
                200,
                {
                    "owner": "tools",
                    "method": method,
                    "path": path,
                    "query": query,
                    "body": json.dumps(body) if body else "",
                },
            ), (method, rest)
        assert t.violations == []


async def test_without_tools_lists_are_empty_the_rest_503_and_errors_are_019_shaped(
    host_factory, tunnels
) -> None:
    config = owner_config(
        tunnels, "down", tools=False, harnesses=["scripted", "no-such-kind", "openai", "scripted"]
    )
    no_dispatch = "[actors.dispatch]\nenabled = false\n"
    host = host_factory(config.replace(f'[actors.dispatch]\ntarget = "{_OWNER}"\n', no_dispatch))
    async with running(host):
        t = await tunnels.wait_tunnel("down")
        # §L: only kinds this host can run are advertised; the rest are logged once, with why.
        assert t.hello["harnesses"] == ["openai", "scripted"]
        log = host.log()
        assert "no-such-kind (not a harness kind registered on this host)" in log
        assert len(re.findall("hello leaves out harness kinds", log)) == 1
        assert (await gateway_state(host))["harnesses"] == ["openai", "scripted"]
        for method, rest, query in _RESOURCE_ROUTES:
            answer = await t.request(method, f"/v1/sessions/s-d/{rest}", query=query)
            if method == "GET" and rest.count("/") <= 1:
                assert (answer.status, answer.json["data"]) == (200, []), rest
            else:
                assert answer.status == 503, (method, rest)
                assert answer.json["error"]["code"] == "runner_unavailable"
                assert answer.json["error"]["message"]
        # Dispatch down too: 500 runner_dispatch_failed, in the 0.19 shape.
        failed = await t.request("GET", "/v1/sessions/s-d")
        assert (failed.status, failed.json["error"]["code"]) == (500, "runner_dispatch_failed")
        assert isinstance(failed.json["error"]["message"], str)
        assert t.violations == []


# --- the fake agrees with the real server (#13) ----------------------------------------------


async def test_the_fake_refuses_a_malformed_hello_and_answers_event_ready(tunnels) -> None:
    """What the real server did with these hellos (observed on 0.19.1): a string
    ``capabilities`` or a non-string ``connection_id`` fails the tunnel; unknown capabilities
    are ignored and ``session-event-ingest-v1`` gets ``event.ready``."""
    hello = {
        "kind": "hello",
        "runner_version": "0",
        "frame_protocol_version": 1,
        "harnesses": [],
        "envs": [],
        "telemetry_opt_out": True,
    }
    headers = [(b"Origin", b"omnigent://internal")]

    async def first_answer(runner_id: str, **fields: Any) -> str:
        url = f"ws://127.0.0.1:{tunnels.port}/v1/runners/{runner_id}/tunnel"
        async with open_websocket_url(url, extra_headers=headers) as ws:
            await ws.send_message(json.dumps({**hello, **fields}))
            try:
                with trio.fail_after(5):
                    return await ws.get_message()
            except ConnectionClosed as exc:
                return f"closed {exc.reason.code}"

    assert await first_answer("a", capabilities="session-event-ingest-v1") == "closed 4001"
    assert await first_answer("b", connection_id=5) == "closed 4001"
    ready = await first_answer("c", capabilities=["x-unknown", "session-event-ingest-v1"])
    assert json.loads(ready) == {"kind": "event.ready"}
    assert [bool(t.violations) for t in tunnels.tunnels] == [True, True, False]
