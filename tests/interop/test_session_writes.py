"""The session tools that write, through the real omnigent 0.19.1 server (#17): corral, its
runner, sends the server the requests omnigent's own runner sends (T-26), and the server's
own state shows they did what they say (S-29..S-31, S-36..S-39, S-41, S-47, P-07, P-18)."""

from __future__ import annotations

import json
from typing import Any

import trio

from corral.server_client import ServerClient
from tests.fake_server import FakeOmnigentServer

from ._stack import Client, LogWatch, Stream
from .conftest import Stack

#: The items of one ``calls`` turn: the user's text, the call, its output, the answer.
TURN_ITEMS = 4


class Caller:
    """A session of the ``calls`` agent: each turn calls one tool with the arguments given."""

    def __init__(self, client: Client, session: str, stream: Stream) -> None:
        self.client = client
        self.session = session
        self.stream = stream
        self.turns = 0

    @classmethod
    async def open(cls, client: Client) -> Caller:
        session = await client.session("calls")
        return cls(client, session, await client.open_stream(session))

    async def call(self, tool: str, **arguments: Any) -> Any:
        text = json.dumps({"tool": tool, "arguments": arguments})
        _, end = await self.client.turn(self.stream, text)
        assert self.stream.events[end]["status"] == "idle", self.stream.events[end]
        self.turns += 1
        items = await self.client.wait_items(self.session, TURN_ITEMS * self.turns)
        outputs = [i for i in items if i["type"] == "function_call_output"]
        return json.loads(outputs[-1]["output"])


async def _assistant_text(client: Client, session: str) -> str:
    items = await client.wait_items(session, 2, timeout=60)
    texts = [
        block["text"]
        for item in items
        if item["type"] == "message" and item.get("role") == "assistant"
        for block in item.get("content") or []
        if isinstance(block.get("text"), str)
    ]
    return "".join(texts)


async def test_s38_sys_session_create_makes_a_child_on_the_real_server(client: Client) -> None:
    caller = await Caller.open(client)
    plain = await client.agent_id("plain")
    handle = await caller.call(
        "sys_session_create", agent_id=plain, title="researcher:auth", message="hi child"
    )
    child = handle["conversation_id"]
    assert handle["kind"] == "sub_agent"
    assert (handle["agent_id"], handle["agent_name"]) == (plain, "plain")
    assert handle["title"] == "researcher:auth"
    snap = (await client.http.get(f"/v1/sessions/{child}")).json()
    assert snap["parent_session_id"] == caller.session
    assert snap["root_conversation_id"] == caller.session
    # The server bound the child to the parent's runner, corral, which ran its first turn.
    assert await _assistant_text(client, child) == "w0 w1 w2 w3 w4"
    first = (await client.items(child))[0]
    assert first["content"][0]["text"] == "hi child"


async def test_s29_s31_p18_sys_session_close_on_the_real_server(
    client: Client, server_log: LogWatch
) -> None:
    server_log.allow(r'"GET /v1/sessions/conv_nope HTTP/1.1" 404')  # the last close, on purpose
    caller = await Caller.open(client)
    other = await Caller.open(client)
    plain = await client.agent_id("plain")
    child = (await caller.call("sys_session_create", agent_id=plain, title="researcher:auth"))[
        "conversation_id"
    ]
    foreign = (await other.call("sys_session_create", agent_id=plain, title="x:y"))[
        "conversation_id"
    ]
    # S-30: another tree's child is refused, and the server's copy is untouched.
    out = await caller.call("sys_session_close", conversation_id=foreign)
    assert out == {"error": "session_out_of_tree", "conversation_id": foreign}
    # S-31: the caller's own (top-level) session is not a sub-agent.
    out = await caller.call("sys_session_close", conversation_id=caller.session)
    assert out == {"error": "session_not_a_sub_agent", "conversation_id": caller.session}
    out = await caller.call("sys_session_close", conversation_id=child)
    assert out == {"closed": True, "conversation_id": child, "agent": "researcher", "title": "auth"}
    snap = (await client.http.get(f"/v1/sessions/{child}")).json()
    # The server keeps the tombstoned title and shows it without its marker.
    assert snap["title"] == "researcher:auth"
    assert snap["labels"]["omnigent.closed"] == "true"
    assert snap["archived"] is True
    # Archived, it leaves the caller's children: a named send would make a fresh one.
    listed = (await client.http.get(f"/v1/sessions/{caller.session}/child_sessions")).json()
    assert child not in [r["id"] for r in listed["data"]]
    untouched = (await client.http.get(f"/v1/sessions/{foreign}")).json()
    assert untouched["title"] == "x:y" and "omnigent.closed" not in untouched["labels"]
    out = await caller.call("sys_session_close", conversation_id="conv_nope")
    assert out == {"error": "session_not_found", "conversation_id": "conv_nope"}


async def test_s39_sys_session_create_uploads_a_bundle_to_the_real_server(
    client: Client, stack: Stack
) -> None:
    # The plain agent's file as the server loaded it, renamed: an agent new to the server.
    text = (stack.server.agents_dir / "plain.yaml").read_text()
    (stack.workspace / "uploaded.yaml").write_text(text.replace("name: plain", "name: uploaded"))
    caller = await Caller.open(client)
    handle = await caller.call(
        "sys_session_create", config_path="uploaded.yaml", title="up", message="hi bundle"
    )
    child = handle["conversation_id"]
    assert handle["agent_name"] == "uploaded"
    assert handle["agent_id"] != await client.agent_id("plain")
    snap = (await client.http.get(f"/v1/sessions/{child}")).json()
    assert snap["parent_session_id"] == caller.session
    assert snap["agent_id"] == handle["agent_id"]
    assert await _assistant_text(client, child) == "w0 w1 w2 w3 w4"


async def test_s41_sys_session_create_unknown_agent_on_the_real_server(
    client: Client, server_log: LogWatch
) -> None:
    server_log.allow(r'"POST /v1/sessions HTTP/1.1" 404')  # the unknown agent, on purpose
    caller = await Caller.open(client)
    out = await caller.call("sys_session_create", agent_id="ag_missing")
    assert out == {"error": "agent_not_found", "agent_id": "ag_missing"}


async def test_s36_s37_p07_sys_session_share_on_the_real_server(
    client: Client, server_log: LogWatch
) -> None:
    server_log.allow(r'"PUT /v1/sessions/\w+/permissions HTTP/1.1" 400')  # public edit, below
    caller = await Caller.open(client)
    sid = caller.session
    out = await caller.call("sys_session_share", user_id="__public__")
    assert out == {"shared": True, "session_id": sid, "user_id": "__public__", "level": "read"}
    alice = "alice@example.com"
    out = await caller.call("sys_session_share", user_id=alice, level="edit")
    assert out == {"shared": True, "session_id": sid, "user_id": alice, "level": "edit"}
    # S-37: the server's own refusal, its message shown.
    out = await caller.call("sys_session_share", user_id="__public__", level="edit")
    assert out == {
        "error": "Public access is limited to read (level 1)",
        "status_code": 400,
        "session_id": sid,
    }
    grants = (await client.http.get(f"/v1/sessions/{sid}/permissions")).json()["permissions"]
    levels = {g["user_id"]: g["level"] for g in grants}
    assert {"__public__": 1, alice: 2}.items() <= levels.items()


async def test_s47_sys_list_models_runs_in_corral(client: Client) -> None:
    caller = await Caller.open(client)
    out = await caller.call("sys_list_models")
    assert set(out) == {"self"}
    assert set(out["self"]) == {"source", "verified", "models", "note"}


def _keys(value: Any) -> set[str]:
    assert isinstance(value, dict), value
    return set(value)


async def test_the_fake_server_s_write_answers_have_the_real_server_s_keys(
    client: Client,
) -> None:
    """``tests/fake_server.py`` answers the writes these tools send with the real keys."""
    real = client.http
    parent = await client.session("plain", bind=False)
    plain = await client.agent_id("plain")
    body = {"agent_id": plain, "parent_session_id": parent, "title": "a:b"}
    child = (await real.post("/v1/sessions", json=body)).json()
    grant = (
        await real.put(f"/v1/sessions/{parent}/permissions", json={"user_id": "bob", "level": 1})
    ).json()
    fake = FakeOmnigentServer()
    async with trio.open_nursery() as nursery:
        await fake.start(nursery)
        agent_id = fake.add_agent("name: plain\n")
        fake.add_session(agent_id, session_id="s1")
        async with ServerClient(fake.base_url) as c:
            fake_child = await c.write(
                "POST", "/v1/sessions", {**body, "agent_id": agent_id, "parent_session_id": "s1"}
            )
            fake_grant = await c.write(
                "PUT", "/v1/sessions/s1/permissions", {"user_id": "bob", "level": 1}
            )
        nursery.cancel_scope.cancel()
    assert _keys(grant) == _keys(fake_grant)
    assert {"id", "agent_name", "status", "parent_session_id", "root_conversation_id"} <= (
        _keys(child) & _keys(fake_child)
    )
    assert (child["parent_session_id"], child["root_conversation_id"]) == (parent, parent)
