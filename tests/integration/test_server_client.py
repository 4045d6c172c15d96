"""The runner → server client against the fake omnigent server (PROTOCOL_FACTS §iii)."""

from __future__ import annotations

import hashlib
import json
import logging
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import trio

from corral._exceptions import (
    ServerError,
    ServerProtocolError,
    ServerRejected,
    ServerTimeout,
    ServerUnavailable,
    SpecError,
)
from corral.server_client import ServerClient, runner_id_for_token
from corral.spec import load_spec_yaml
from tests.fake_server import FakeOmnigentServer, assistant_message, user_message
from tests.unit.test_spec import CAPTURED_YAML

TOKEN = "p0Wi9WCKsT-binding-token-secret"
DEADLINE = 10


@pytest.fixture
async def server(nursery: trio.Nursery) -> FakeOmnigentServer:
    s = FakeOmnigentServer(token=TOKEN)
    await s.start(nursery)
    return s


def make_client(server: FakeOmnigentServer, **kwargs: Any) -> ServerClient:
    options: dict[str, Any] = {
        "token": TOKEN,
        "connect_timeout_s": 2.0,
        "read_timeout_s": 5.0,
        "retries": 2,
        "backoff_base_s": 0.001,
        "backoff_max_s": 0.005,
    }
    options.update(kwargs)
    return ServerClient(server.base_url, **options)


@pytest.fixture
async def client(server: FakeOmnigentServer) -> AsyncIterator[ServerClient]:
    async with make_client(server) as c:
        yield c


@pytest.fixture
def session_id(server: FakeOmnigentServer) -> str:
    agent_id = server.add_agent(CAPTURED_YAML, version=3)
    return server.add_session(agent_id, session_id="3d7f35bf59b0472c8157693018a2cb80")["id"]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- identity and headers ----------------------------------------------------------------------


def test_runner_id_is_derived_from_the_token_as_in_i_1() -> None:
    runner_id = runner_id_for_token("secret")
    expected = hashlib.sha256(b"omnigent-runner:secret").hexdigest()[:32]
    assert runner_id == f"runner_token_{expected}"
    assert len(runner_id) == len("runner_token_") + 32
    assert runner_id_for_token("other") != runner_id


async def test_every_call_carries_the_token_and_origin(
    server: FakeOmnigentServer, client: ServerClient
) -> None:
    with trio.fail_after(DEADLINE):
        assert await client.version() == "0.11.0.dev0"
    (request,) = server.received()
    assert (request.method, request.path) == ("GET", "/api/version")
    assert request.headers["origin"] == "omnigent://internal"
    assert request.headers["x-omnigent-runner-tunnel-token"] == TOKEN
    assert "authorization" not in request.headers


async def test_a_bearer_is_sent_when_configured_and_a_wrong_token_is_rejected(
    server: FakeOmnigentServer,
) -> None:
    with trio.fail_after(DEADLINE):
        async with make_client(server, bearer="jwt-abc") as c:
            await c.version()
        async with make_client(server, token="wrong") as c:
            with pytest.raises(ServerRejected) as info:
                await c.version()
    assert server.requests[0].headers["authorization"] == "Bearer jwt-abc"
    assert info.value.status == 401 and info.value.code == "unauthorized"


async def test_a_base_url_path_prefix_is_kept(server: FakeOmnigentServer) -> None:
    with trio.fail_after(DEADLINE):
        async with ServerClient(server.base_url + "/prefix/", token=TOKEN, retries=0) as c:
            with pytest.raises(ServerRejected):
                await c.version()
    assert server.requests[0].path == "/prefix/api/version"


# -- iii.1 token -------------------------------------------------------------------------------


async def test_runner_token_answers_as_captured(
    server: FakeOmnigentServer, client: ServerClient
) -> None:
    runner_id = runner_id_for_token(TOKEN)
    with trio.fail_after(DEADLINE):
        with pytest.raises(ServerRejected) as info:
            await client.runner_token(runner_id)
        assert (info.value.status, info.value.code) == (401, "unauthorized")
        server.token_mode = "unsupported"
        with pytest.raises(ServerRejected) as info:
            await client.runner_token(runner_id)
        assert (info.value.status, info.value.code) == (400, "invalid_input")
        assert str(info.value) == (
            f"POST /v1/runners/{runner_id}/token -> 400: "
            "runner token minting is unsupported in this auth mode"
        )
        server.token_mode = "ok"
        minted = await client.runner_token(runner_id)
    assert minted["token"] == f"jwt-for-{runner_id}" and isinstance(minted["expires_at"], int)
    request = server.requests[0]
    assert request.method == "POST" and request.body == b""
    assert request.headers["content-length"] == "0"


# -- iii.3 agent bundle ------------------------------------------------------------------------


async def test_agent_bundle_is_fetched_and_parsed(
    server: FakeOmnigentServer, client: ServerClient, session_id: str
) -> None:
    with trio.fail_after(DEADLINE):
        spec = await client.agent_bundle(session_id)
        info = await client.agent_bundle_info(session_id)
    assert spec == load_spec_yaml(CAPTURED_YAML)
    assert (info.name, info.version, info.session_scoped) == ("proto-tool-021697", "3", True)
    assert info.spec == spec and info.size > 0
    assert server.requests[0].path == f"/v1/sessions/{session_id}/agent/contents"


async def test_an_invalid_agent_is_a_spec_error(
    server: FakeOmnigentServer, client: ServerClient
) -> None:
    agent_id = server.add_agent("name: bad\nexecutor: {model: 5}\n")
    sid = server.add_session(agent_id)["id"]
    with trio.fail_after(DEADLINE), pytest.raises(SpecError, match=r"at \$\.executor\.model$"):
        await client.agent_bundle(sid)


async def test_an_oversized_bundle_is_refused(server: FakeOmnigentServer, session_id: str) -> None:
    with trio.fail_after(DEADLINE):
        async with make_client(server, max_bundle_bytes=64) as c:
            with pytest.raises(ServerProtocolError, match=r"over the 64-byte limit$"):
                await c.agent_bundle(session_id)


# -- iii.4/5/7 snapshot, patch, labels ---------------------------------------------------------


async def test_session_snapshot_has_the_captured_fields(
    server: FakeOmnigentServer, client: ServerClient, session_id: str
) -> None:
    with trio.fail_after(DEADLINE):
        snapshot = await client.session_snapshot(session_id)
    assert snapshot["id"] == session_id
    assert snapshot["agent_id"] in server.agents
    assert snapshot["agent_name"] == "proto-tool-021697"
    assert snapshot["pending_elicitations"] == [] and snapshot["status"] == "idle"


async def test_an_unknown_session_is_a_404_without_retries(
    server: FakeOmnigentServer, client: ServerClient
) -> None:
    with trio.fail_after(DEADLINE), pytest.raises(ServerRejected) as info:
        await client.session_snapshot("nope")
    assert info.value.status == 404 and info.value.code == "not_found"
    assert str(info.value) == "GET /v1/sessions/nope -> 404: Session 'nope' not found"
    assert len(server.requests) == 1


async def test_patch_sets_labels_as_captured(
    server: FakeOmnigentServer, client: ServerClient, session_id: str
) -> None:
    with trio.fail_after(DEADLINE):
        snapshot = await client.patch_session(session_id, {"labels": {"omnigent.ui": "terminal"}})
        labels = await client.labels(session_id)
    assert snapshot["labels"] == {"omnigent.ui": "terminal"} == labels
    patch = server.received("PATCH")[0]
    assert patch.body == b'{"labels":{"omnigent.ui":"terminal"}}'
    assert patch.headers["content-type"] == "application/json"
    assert server.received("GET")[0].path == f"/v1/sessions/{session_id}/labels"


# -- iii.6 items -------------------------------------------------------------------------------


async def test_items_are_read_with_the_captured_query(
    server: FakeOmnigentServer, client: ServerClient, session_id: str
) -> None:
    server.add_item(session_id, user_message("say the words"))
    server.add_item(session_id, assistant_message("w0 w1 "))
    with trio.fail_after(DEADLINE):
        items = await client.items(session_id)
    assert [i["role"] for i in items] == ["user", "assistant"]
    assert set(items[0]) >= {"id", "response_id", "type", "status", "created_at", "content"}
    (request,) = server.requests
    assert request.query == "limit=100&order=asc"


async def test_items_follow_pagination_in_order(
    server: FakeOmnigentServer, client: ServerClient, session_id: str
) -> None:
    added = [server.add_item(session_id, user_message(f"m{n}")) for n in range(250)]
    with trio.fail_after(DEADLINE):
        items = await client.items(session_id)
    assert [i["id"] for i in items] == [i["id"] for i in added]
    queries = [r.params for r in server.requests]
    assert queries == [
        {"limit": "100", "order": "asc"},
        {"limit": "100", "order": "asc", "after": added[99]["id"]},
        {"limit": "100", "order": "asc", "after": added[199]["id"]},
    ]


async def test_items_refuse_a_cursor_that_does_not_move(
    server: FakeOmnigentServer, client: ServerClient, session_id: str
) -> None:
    page = {"object": "list", "data": [{"id": "x"}], "last_id": "x", "has_more": True}
    server.fail("GET", r".*/items", status=200, times=5, body=json.dumps(page).encode())
    with trio.fail_after(DEADLINE), pytest.raises(ServerProtocolError, match=r"did not move$"):
        await client.items(session_id)
    assert len(server.requests) == 2


# -- iii.8 policies, iii.9 mcp, iii.10 events ----------------------------------------------------


async def test_evaluate_policy(
    server: FakeOmnigentServer, client: ServerClient, session_id: str
) -> None:
    seen: list[dict[str, Any]] = []

    def policy(sid: str, body: dict[str, Any]) -> dict[str, Any]:
        seen.append(body)
        return {"result": "POLICY_ACTION_DENY"}

    server.policy = policy
    body = {"event": {"type": "PHASE_LLM_REQUEST", "data": {"model": "m", "messages_count": 1}}}
    with trio.fail_after(DEADLINE):
        assert await client.evaluate_policy(session_id, body) == {"result": "POLICY_ACTION_DENY"}
    assert seen == [body]


async def test_mcp_call_direct_result(
    server: FakeOmnigentServer, client: ServerClient, session_id: str
) -> None:
    output = {"stdout": "hello-from-tool\n", "exit_code": 0}
    server.tool = lambda sid, name, args: {
        "content": [{"type": "text", "text": json.dumps(output)}]
    }
    with trio.fail_after(DEADLINE):
        result = await client.mcp_call(session_id, "sys_os_shell", {"command": "echo hi"})
    assert json.loads(result["content"][0]["text"]) == output
    assert server.requests[0].json == {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "sys_os_shell", "arguments": {"command": "echo hi"}},
    }


async def test_mcp_input_required_is_retried_with_the_verdict(
    server: FakeOmnigentServer, client: ServerClient, session_id: str
) -> None:
    server.ask = lambda sid, name, args: name == "sys_os_shell"
    asked: list[dict[str, Any]] = []

    async def on_input_required(result: dict[str, Any]) -> dict[str, Any]:
        asked.append(result)
        snapshot = await client.session_snapshot(session_id)
        assert len(snapshot["pending_elicitations"]) == 1
        (eid,) = result["inputRequests"]
        return {eid: {"action": "accept"}}

    with trio.fail_after(DEADLINE):
        result = await client.mcp_call(
            session_id,
            "sys_os_shell",
            {"command": "echo approved-run"},
            on_input_required=on_input_required,
        )
        snapshot = await client.session_snapshot(session_id)
    assert "content" in result and snapshot["pending_elicitations"] == []
    (first,) = asked
    (eid,) = first["inputRequests"]
    assert first["resultType"] == "input_required"
    assert first["inputRequests"][eid]["method"] == "elicitation/create"
    calls = server.received("POST", r".*/mcp")
    assert [c.json["id"] for c in calls] == [1, 2]
    assert calls[1].json["params"] == {
        "name": "sys_os_shell",
        "arguments": {"command": "echo approved-run"},
        "requestState": first["requestState"],
        "inputResponses": {eid: {"action": "accept"}},
    }


async def test_mcp_input_required_without_a_callback_is_returned(
    server: FakeOmnigentServer, client: ServerClient, session_id: str
) -> None:
    server.ask = lambda sid, name, args: True
    with trio.fail_after(DEADLINE):
        result = await client.mcp_call(session_id, "sys_os_shell", {"command": "x"})
        assert result["resultType"] == "input_required"

        async def decline(result: dict[str, Any]) -> dict[str, Any]:
            return {eid: {"action": "decline"} for eid in result["inputRequests"]}

        declined = await client.mcp_call(session_id, "t", {}, on_input_required=decline)
    assert declined["isError"] is True


async def test_mcp_rounds_are_bounded(
    server: FakeOmnigentServer, client: ServerClient, session_id: str
) -> None:
    server.ask = lambda sid, name, args: True

    async def never_answers_right(result: dict[str, Any]) -> dict[str, Any]:
        return {"elicit_unknown": {"action": "accept"}}

    with trio.fail_after(DEADLINE), pytest.raises(ServerRejected) as info:
        await client.mcp_call(session_id, "t", {}, on_input_required=never_answers_right)
    assert info.value.status == 200 and info.value.code == "-32602"

    async def always_asked(result: dict[str, Any]) -> dict[str, Any] | None:
        return {}

    server.fail(
        "POST",
        r".*/mcp",
        status=200,
        times=10,
        body=json.dumps(
            {"jsonrpc": "2.0", "id": 1, "result": {"resultType": "input_required"}}
        ).encode(),
    )
    with trio.fail_after(DEADLINE), pytest.raises(ServerProtocolError, match=r"after 3 rounds$"):
        await client.mcp_call(session_id, "t", {}, on_input_required=always_asked, max_rounds=3)


async def test_post_event_adds_the_interrupt_note(
    server: FakeOmnigentServer, client: ServerClient, session_id: str
) -> None:
    body = {
        "type": "external_conversation_item",
        "data": {
            "item_type": "message",
            "item_data": {"role": "user", "content": [{"type": "input_text", "text": "[System"}]},
            "response_id": "cancel_5536bf073b294f918f36b81b5a2efa55",
        },
    }
    with trio.fail_after(DEADLINE):
        answer = await client.post_event(session_id, body)
        items = await client.items(session_id)
    assert answer == {"queued": False, "item_id": items[-1]["id"]}
    assert items[-1]["response_id"] == "cancel_5536bf073b294f918f36b81b5a2efa55"
    assert items[-1]["role"] == "user"
    assert server.events[session_id] == [body]


async def test_file_content(server: FakeOmnigentServer, client: ServerClient) -> None:
    server.add_file("file_1", b"\x89PNG...", "image/png")
    with trio.fail_after(DEADLINE):
        assert await client.file_content("file_1") == (b"\x89PNG...", "image/png")
        with pytest.raises(ServerRejected) as info:
            await client.file_content("file_2")
    assert info.value.status == 404
    assert server.requests[0].path == "/v1/files/file_1/content"


# -- retries, timeouts, malformed answers ------------------------------------------------------


async def test_idempotent_calls_are_retried_on_503(
    server: FakeOmnigentServer, client: ServerClient, session_id: str
) -> None:
    server.fail("GET", rf"/v1/sessions/{session_id}", status=503, times=2)
    with trio.fail_after(DEADLINE):
        snapshot = await client.session_snapshot(session_id)
    assert snapshot["id"] == session_id
    assert len(server.requests) == 3
    assert client.statistics().retries == 2 and client.statistics().failures == 0


async def test_retries_are_bounded(
    server: FakeOmnigentServer, client: ServerClient, session_id: str
) -> None:
    server.fail("GET", r".*/labels", status=502, times=100, body=b"bad gateway")
    with trio.fail_after(DEADLINE), pytest.raises(ServerUnavailable) as info:
        await client.labels(session_id)
    assert info.value.status == 502 and info.value.body == b"bad gateway"
    assert str(info.value) == f"GET /v1/sessions/{session_id}/labels -> 502: bad gateway"
    assert len(server.requests) == 3  # 1 + retries=2
    assert client.statistics().failures == 1


async def test_a_retry_after_is_honoured_up_to_the_cap(
    server: FakeOmnigentServer, client: ServerClient, session_id: str
) -> None:
    server.fail("GET", r".*/items", status=503, headers={"retry-after": "3600"})
    with trio.fail_after(DEADLINE):  # capped at backoff_max_s, not an hour
        assert await client.items(session_id) == []
    assert len(server.requests) == 2


@pytest.mark.parametrize(
    ("call", "path"),
    [
        (lambda c, sid: c.post_event(sid, {"type": "x"}), r".*/events"),
        (lambda c, sid: c.mcp_call(sid, "t", {}), r".*/mcp"),
        (
            lambda c, sid: c.evaluate_policy(sid, {"event": {"type": "P", "data": {}}}),
            r".*/evaluate",
        ),
    ],
)
async def test_non_idempotent_calls_are_not_retried_on_503(
    server: FakeOmnigentServer, client: ServerClient, session_id: str, call: Any, path: str
) -> None:
    server.fail("POST", path, status=503, times=5)
    with trio.fail_after(DEADLINE), pytest.raises(ServerUnavailable) as info:
        await call(client, session_id)
    assert info.value.status == 503
    assert len(server.requests) == 1


async def test_a_dropped_connection_is_retried_only_when_idempotent(
    server: FakeOmnigentServer, client: ServerClient, session_id: str
) -> None:
    server.fail("GET", rf"/v1/sessions/{session_id}", mode="drop")
    server.fail("POST", r".*/events", mode="drop")
    with trio.fail_after(DEADLINE):
        assert (await client.session_snapshot(session_id))["id"] == session_id
        with pytest.raises(ServerUnavailable, match=r"^POST .*/events: RemoteProtocolError"):
            await client.post_event(session_id, {"type": "x"})
    assert len(server.received("GET")) == 2
    assert len(server.received("POST")) == 1


async def test_connection_refused_is_retried_even_for_posts() -> None:
    # Nothing was sent, so retrying cannot run a tool or post an event twice.
    url = f"http://127.0.0.1:{closed_port()}"
    with trio.fail_after(DEADLINE):
        async with ServerClient(
            url, token=TOKEN, retries=2, backoff_base_s=0.001, backoff_max_s=0.002
        ) as c:
            with pytest.raises(ServerUnavailable, match=r"^POST /v1/sessions/s1/mcp: ConnectError"):
                await c.mcp_call("s1", "t", {})
            assert c.statistics().requests == 3


async def test_timeouts(server: FakeOmnigentServer, session_id: str) -> None:
    with trio.fail_after(DEADLINE):
        async with make_client(server, read_timeout_s=0.2, retries=1) as c:
            server.fail("GET", rf"/v1/sessions/{session_id}", mode="hang")
            assert (await c.session_snapshot(session_id))["id"] == session_id  # 2nd try answers
            server.fail("GET", rf"/v1/sessions/{session_id}", mode="hang", times=2)
            with pytest.raises(ServerTimeout, match=r"no answer in time \(ReadTimeout\)$"):
                await c.session_snapshot(session_id)
            server.fail("POST", r".*/events", mode="hang")
            with pytest.raises(ServerTimeout):
                await c.post_event(session_id, {"type": "x"})
    assert len(server.received("GET")) == 4
    assert len(server.received("POST")) == 1


async def test_the_tool_timeout_applies_to_mcp_calls(
    server: FakeOmnigentServer, session_id: str
) -> None:
    server.fail("POST", r".*/mcp", mode="hang")
    with trio.fail_after(DEADLINE):
        async with make_client(server, read_timeout_s=5.0, tool_timeout_s=0.2) as c:
            with pytest.raises(ServerTimeout):
                await c.mcp_call(session_id, "t", {})


async def test_a_2xx_that_is_not_json_is_a_protocol_error(
    server: FakeOmnigentServer, client: ServerClient, session_id: str
) -> None:
    server.fail("GET", rf"/v1/sessions/{session_id}", status=200, body=b"<html>")
    server.fail("GET", r".*/labels", status=200, body=b"[1, 2]")
    with trio.fail_after(DEADLINE):
        with pytest.raises(ServerProtocolError, match=r"the answer is not JSON"):
            await client.session_snapshot(session_id)
        with pytest.raises(ServerProtocolError, match=r"expected a JSON object, got list$"):
            await client.labels(session_id)


@pytest.mark.parametrize("bad", ["", "..", ".", "a/b", "../x", "a b", "x?y=1", "é", "x" * 257])
async def test_ids_are_validated_before_any_request(
    server: FakeOmnigentServer, client: ServerClient, bad: str
) -> None:
    with trio.fail_after(DEADLINE):
        with pytest.raises(ValueError, match=r"^session_id must match"):
            await client.session_snapshot(bad)
        with pytest.raises(ValueError, match=r"^file_id must match"):
            await client.file_content(bad)
        with pytest.raises(ValueError, match=r"^runner_id must match"):
            await client.runner_token(bad)
    assert server.requests == []


async def test_the_token_never_appears_in_logs_or_errors(
    server: FakeOmnigentServer, session_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    errors: list[ServerError] = []
    with trio.fail_after(DEADLINE):
        async with make_client(server, read_timeout_s=0.2) as c:
            await c.session_snapshot(session_id)
            server.fail("GET", r".*/labels", status=503, times=10)
            server.fail("GET", r".*/items", mode="hang", times=10)
            server.fail("POST", r".*/events", mode="drop")
            for call in (
                c.labels(session_id),
                c.items(session_id),
                c.session_snapshot("unknown"),
                c.post_event(session_id, {"type": "x"}),
            ):
                try:
                    await call
                except ServerError as exc:
                    errors.append(exc)
            assert TOKEN not in repr(c)
    assert len(errors) == 4
    assert any(r.levelno == logging.WARNING for r in caplog.records)  # retries were logged
    for exc in errors:
        assert TOKEN not in str(exc) and TOKEN not in repr(exc)
        assert TOKEN.encode() not in exc.body
    assert TOKEN not in caplog.text


def test_the_fake_server_also_serves_from_a_thread() -> None:
    server = FakeOmnigentServer()
    with server.serve_in_thread():
        agent_id = server.add_agent(CAPTURED_YAML)
        sid = server.add_session(agent_id)["id"]
        response = httpx.get(f"{server.base_url}/v1/sessions/{sid}", timeout=5)
    assert response.status_code == 200 and response.json()["agent_id"] == agent_id
    assert response.headers["cache-control"] == "no-store"
