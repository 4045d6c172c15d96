"""Each runner id of a host is its own runner (issue #16, docs/security.md "Runner isolation").

A real host serves three runner ids, each with its own tunnel to the fake tunnel server. A
session bound through one of them is, through the other two, a session this runner does not
have: every session route answers the 404 of an unknown session, byte for byte, and nothing
of the session (its turn, its stream, its files, its terminals, its elicitations) is read,
started or changed; through its own runner id every route answers as before.
"""

from __future__ import annotations

import json
from typing import Any

import trio

from tests.conftest import HostProcess
from tests.fake_server import FakeOmnigentServer
from tests.fake_tunnel_server import FakeTunnelServer, Tunnel
from tests.integration._gateway import scripted_yaml
from tests.integration.test_gateway import bind, host_config, message, running

RUNNERS = ("iso-a", "iso-b", "iso-c")
FILE = "resources/environments/default/filesystem/a-only.txt"


def unknown(session_id: str) -> bytes:
    """The body of GET for a session no runner id of the host ever bound."""
    text = f"No session '{session_id}' on this runner."
    body = {"error": {"code": "not_found", "message": text}}
    return json.dumps(body, separators=(",", ":")).encode()


def probes(session_id: str, agent_id: str) -> list[tuple[str, str, Any, str]]:
    """Every session route (method, path, body, query): dispatch's, the gateway's own, and
    the resources the tools actor serves, mutating ones included."""
    s = f"/v1/sessions/{session_id}"
    shell = {"method": "tools/call", "params": {"name": "sys_os_shell", "arguments": {}}}
    shell["params"]["arguments"] = {"command": "echo through-mcp"}
    return [
        ("POST", "/v1/sessions", {"session_id": session_id, "agent_id": agent_id}, ""),
        ("GET", s, None, ""),
        ("POST", f"{s}/events", message("not yours", agent_id, "iso"), ""),
        ("POST", f"{s}/events", message("not yours", agent_id, "iso"), "stream=true"),
        ("POST", f"{s}/events", {"type": "interrupt"}, ""),
        ("POST", f"{s}/events", {"type": "stop_session"}, ""),
        (
            "POST",
            f"{s}/events",
            {"type": "approval", "data": {"elicitation_id": "e_1", "action": "accept"}},
            "",
        ),
        ("POST", f"{s}/mcp/execute", shell, ""),
        ("GET", f"{s}/stream", None, ""),
        ("GET", f"{s}/skills", None, ""),
        ("POST", f"{s}/background-title", {"prompt": "x", "agent_id": agent_id}, ""),
        ("GET", f"{s}/resources", None, ""),
        ("GET", f"{s}/resources/environments", None, ""),
        ("GET", f"{s}/resources/environments/default", None, ""),
        ("GET", f"{s}/resources/environments/default/filesystem", None, ""),
        ("GET", f"{s}/{FILE}", None, ""),
        ("GET", f"{s}/{FILE}", None, "download=true"),
        ("PUT", f"{s}/{FILE}", {"content": "overwritten"}, ""),
        ("PATCH", f"{s}/{FILE}", {"old_text": "written", "new_text": "edited"}, ""),
        ("DELETE", f"{s}/{FILE}", None, ""),
        ("GET", f"{s}/resources/environments/default/search", None, "q=written"),
        ("GET", f"{s}/resources/environments/default/changes", None, ""),
        ("GET", f"{s}/resources/environments/default/diff/a-only.txt", None, ""),
        ("POST", f"{s}/resources/environments/default/shell", {"command": "cat a-only.txt"}, ""),
        ("GET", f"{s}/resources/terminals", None, ""),
        ("POST", f"{s}/resources/terminals", {}, ""),
        ("DELETE", f"{s}/resources/terminals/t_1", None, ""),
        ("DELETE", f"{s}/resources", None, ""),
        ("DELETE", s, None, ""),
    ]


def s_path(session_id: str) -> str:
    return f"/v1/sessions/{session_id}"


async def three_runners(
    host_factory: Any, tunnels: FakeTunnelServer, server: FakeOmnigentServer
) -> tuple[HostProcess, dict[str, str]]:
    host = host_factory(host_config(tunnels, [{"id": r} for r in RUNNERS], server=server))
    agent_id = server.add_agent(scripted_yaml("iso", '{text: "hello from a"}'))
    return host, {"agent_id": agent_id, "sid": server.add_session(agent_id)["id"]}


async def dispatch_state(host: HostProcess) -> dict[str, Any]:
    reply = await trio.to_thread.run_sync(lambda: host.ask("inspect", actor="dispatch"))
    return reply["state"]


async def write_file(t: Tunnel, sid: str) -> None:
    put = await t.request("PUT", f"/v1/sessions/{sid}/{FILE}", {"content": "written by a"})
    assert put.status == 200, put.body


async def test_every_session_route_of_another_runner_id_is_an_unknown_sessions_404(
    host_factory, tunnels, server
) -> None:
    """Bound through iso-a: iso-b and iso-c get the unknown session's 404 on every route (none
    answers what the session holds, none starts, interrupts, approves, writes or deletes
    anything of it), and iso-a then finds its session, its file and its stream as they were."""
    host, ids = await three_runners(host_factory, tunnels, server)
    sid, agent_id = ids["sid"], ids["agent_id"]
    async with running(host):
        a, b, c = [await tunnels.wait_tunnel(r) for r in RUNNERS]
        never = await b.request("GET", "/v1/sessions/never-bound-anywhere")
        assert (never.status, never.body) == (404, unknown("never-bound-anywhere"))
        await bind(a, sid, agent_id)
        own_stream = tunnels.streams[sid][0]
        turn = await a.request("POST", f"/v1/sessions/{sid}/events", message("hi", agent_id, "iso"))
        assert turn.status == 202, turn.body
        assert await tunnels.until_status(sid) == ["running", "idle"]
        await write_file(a, sid)
        before = (await a.request("GET", f"/v1/sessions/{sid}")).body
        turns = (await dispatch_state(host))["turns"]
        for other in (b, c):
            for method, path, body, query in probes(sid, agent_id):
                got = await other.request(method, path, body, query=query)
                where = (other.runner_id, method, path, query)
                assert (got.status, got.body) == (404, unknown(sid)), (where, got.body)
        # Nothing of the session moved: no turn, no event, the same view, the file intact.
        assert (await dispatch_state(host))["turns"] == turns
        assert tunnels.statuses(sid) == ["running", "idle"]
        assert (await a.request("GET", f"/v1/sessions/{sid}")).body == before
        read = await a.request("GET", f"/v1/sessions/{sid}/{FILE}")
        assert read.status == 200 and "written by a" in read.body.decode(), read.body
        # Through iso-a every route reaches the session (whatever it answers, it is not the
        # unknown session's 404); its stream takes the events of its next turn.
        for method, path, body, query in probes(sid, agent_id):
            if path.endswith(("/stream", "/events")) or (method, path) == ("DELETE", s_path(sid)):
                continue  # the stream is open (a second would take its events); turns below
            got = await a.request(method, path, body, query=query, timeout=30)
            assert got.body != unknown(sid), (method, path, query)
        again = await a.request("POST", f"/v1/sessions/{sid}/events", message("2", agent_id, "iso"))
        assert again.status == 202, again.body
        assert await tunnels.until_status(sid, count=2) == ["running", "idle"] * 2
        assert "hello from a" in "".join(
            e.get("delta", "") for e in own_stream.events if e.get("type", "").endswith("delta")
        )
        assert (await a.request("DELETE", s_path(sid))).status == 200
        assert b.violations == [] and c.violations == [] and a.violations == []


async def test_an_event_through_another_runner_id_runs_no_turn_and_changes_nothing(
    host_factory, tunnels, server
) -> None:
    """D-01 per runner id: a session created through iso-a and sent a message through iso-b
    neither runs a turn (no worker, no status, no delta on any stream) nor changes iso-a's
    session; iso-b's own session of another id runs its turns, and iso-a's next message is
    its second turn, not a continuation of the refused one."""
    host, ids = await three_runners(host_factory, tunnels, server)
    sid, agent_id = ids["sid"], ids["agent_id"]
    theirs = server.add_session(agent_id)["id"]
    async with running(host):
        a, b = [await tunnels.wait_tunnel(r) for r in RUNNERS[:2]]
        await bind(a, sid, agent_id)
        before = (await a.request("GET", f"/v1/sessions/{sid}")).body
        refused = await b.request(
            "POST", f"/v1/sessions/{sid}/events", message("from b", agent_id, "iso")
        )
        assert (refused.status, refused.body) == (404, unknown(sid))
        # Its own session, through iso-b, turns: the refusal was of A's session alone.
        await bind(b, theirs, agent_id)
        own = await b.request(
            "POST", f"/v1/sessions/{theirs}/events", message("mine", agent_id, "iso")
        )
        assert own.status == 202, own.body
        assert await tunnels.until_status(theirs) == ["running", "idle"]
        state = await dispatch_state(host)
        assert (state["turns"], state["buffered"]) == (1, 0)
        assert tunnels.statuses(sid) == [] and tunnels.deltas(sid) == ""
        assert (await a.request("GET", f"/v1/sessions/{sid}")).body == before
        # A's first message is A's first turn (nothing of B's was buffered or kept).
        turn = await a.request("POST", f"/v1/sessions/{sid}/events", message("a", agent_id, "iso"))
        assert turn.status == 202, turn.body
        assert await tunnels.until_status(sid) == ["running", "idle"]
        assert tunnels.deltas(sid) == "hello from a"
        assert (await dispatch_state(host))["turns"] == 2
        # A's session, re-inited and deleted through B, stays; deleted through A, it is gone.
        for method in ("POST", "DELETE"):
            path = "/v1/sessions" if method == "POST" else f"/v1/sessions/{sid}"
            body = {"session_id": sid, "agent_id": agent_id} if method == "POST" else None
            assert (await b.request(method, path, body)).body == unknown(sid)
        assert (await a.request("GET", f"/v1/sessions/{sid}")).status == 200
        assert (await a.request("DELETE", f"/v1/sessions/{sid}")).status == 200
        assert (await a.request("GET", f"/v1/sessions/{sid}")).body == unknown(sid)


async def test_a_removed_runner_ids_sessions_are_not_reached_through_the_one_left(
    host_factory, tunnels, server
) -> None:
    """A session bound through iso-a, then the host restarted with iso-a's ``[[runners]]``
    entry removed: through iso-b, now the host's only runner id, every route of the session
    (its stream and resources, which the gateway answers beside dispatch, included) is the
    unknown session's 404 (docs/security.md)."""
    host = host_factory(host_config(tunnels, [{"id": r} for r in RUNNERS[:2]], server=server))
    agent_id = server.add_agent(scripted_yaml("iso", '{text: "hello from a"}'))
    sid = server.add_session(agent_id)["id"]
    async with running(host):
        a = await tunnels.wait_tunnel("iso-a")
        await bind(a, sid, agent_id)
        await write_file(a, sid)
    host.config_path.write_text(host_config(tunnels, [{"id": "iso-b"}], server=server))
    async with running(host):
        b = await tunnels.wait_tunnel("iso-b", count=2)
        for method, path, body, query in probes(sid, agent_id):
            got = await b.request(method, path, body, query=query)
            where = (method, path, query)
            assert (got.status, got.body) == (404, unknown(sid)), (where, got.body)
        assert b.violations == []
    assert "written by a" in next(host.state_dir.rglob("a-only.txt")).read_text()
