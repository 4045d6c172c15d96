"""The embedded control plane (``corral.server``) against a fake runner, over real sockets.

The server runs in-process through its trio entry point (:func:`corral.server.serve`) and once
as the real ``python -m corral.server`` subprocess. The runner is ``tests/_fake_runner.py``
(hello, init/skills/stream answers, a scripted event stream); the runner's own HTTP calls go
through corral's real :class:`~corral.server_client.ServerClient`. Every wait is a condition
with a deadline.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import trio
from trio_websocket import ConnectionClosed, ConnectionRejected, open_websocket_url

from corral._exceptions import ServerRejected
from corral.config import PolicyRule, ServerSettings
from corral.server import ControlPlane, PlaneOptions, serve
from corral.server._state import StateDirBusy
from corral.server_client import ServerClient
from tests._fake_runner import HELLO, FakeRunner
from tests.conftest import wait_until

FAST = PlaneOptions(
    hello_timeout_s=5,
    keepalive_s=0.3,
    request_timeout_s=10,
    tool_timeout_s=10,
    deliver_wait_s=5,
    runner_wait_s=2,
    retry_base_s=0.05,
    retry_cap_s=0.5,
    graceful_timeout_s=1,
)
ALPHA = """\
name: alpha
description: the first test agent
executor:
  harness: scripted
  model: m-alpha
prompt: be brief
"""
BETA = """\
name: beta
executor:
  harness: openai
  model: m-beta
"""


@pytest.fixture
def agents_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "agents"
    directory.mkdir()
    (directory / "alpha.yaml").write_text(ALPHA)
    (directory / "beta.yml").write_text(BETA)
    (directory / "broken.yaml").write_text("name: [unclosed\n")
    (directory / "wrong-type.yaml").write_text("name: gamma\nexecutor:\n  model: 5\n")
    (directory / "notes.txt").write_text("not an agent")
    return directory


def make_settings(agents_dir: Path, **fields: Any) -> ServerSettings:
    return ServerSettings(agents_dirs=[str(agents_dir)], **fields)


# --- harness ---------------------------------------------------------------------------------


@dataclass
class Ctx:
    plane: ControlPlane
    client: httpx.AsyncClient
    nursery: trio.Nursery
    runners: list[FakeRunner] = field(default_factory=list)
    readers: list[trio.CancelScope] = field(default_factory=list)

    @property
    def url(self) -> str:
        assert self.plane.info is not None
        return self.plane.info.url

    @property
    def token(self) -> str:
        return self.plane.runner_token

    async def runner(self, **kwargs: Any) -> FakeRunner:
        runner = FakeRunner(self.url, kwargs.pop("token", self.token), **kwargs)
        await self.nursery.start(runner.run)
        self.runners.append(runner)
        return runner

    def runner_client(self) -> ServerClient:
        return ServerClient(self.url, token=self.token, retries=0)

    async def create(self, agent: str = "alpha", **body: Any) -> dict[str, Any]:
        answer = await self.client.post("/v1/sessions", json={"agent": agent, **body})
        assert answer.status_code == 201, answer.text
        return answer.json()

    async def snapshot(self, session_id: str) -> dict[str, Any]:
        answer = await self.client.get(f"/v1/sessions/{session_id}")
        assert answer.status_code == 200, answer.text
        return answer.json()

    async def items(self, session_id: str) -> list[dict[str, Any]]:
        answer = await self.client.get(
            f"/v1/sessions/{session_id}/items", params={"order": "asc", "limit": "100"}
        )
        assert answer.status_code == 200, answer.text
        return answer.json()["data"]

    async def message(self, session_id: str, content: Any) -> httpx.Response:
        return await self.client.post(
            f"/v1/sessions/{session_id}/events",
            json={"type": "message", "data": {"content": content}},
        )


def client_token(state_dir: Path) -> str:
    """The control plane's client token, from its file in the state dir."""
    return (state_dir / "server" / "client_token").read_text().strip()


@asynccontextmanager
async def running(
    state_dir: Path, settings: ServerSettings, options: PlaneOptions = FAST
) -> AsyncIterator[Ctx]:
    """The control plane in this trio loop; a clean shutdown on the way out."""
    async with trio.open_nursery() as nursery:
        plane = await nursery.start(partial(serve, state_dir, settings, options=options))
        assert plane.info is not None
        # A client's credential, read where the CLI reads it (docs/security.md).
        bearer = {"authorization": f"Bearer {client_token(state_dir)}"}
        async with httpx.AsyncClient(base_url=plane.info.url, headers=bearer, timeout=15) as client:
            ctx = Ctx(plane, client, nursery)
            try:
                yield ctx
            finally:
                for scope in ctx.readers:  # before the client (and its sockets) closes
                    scope.cancel()
                plane.begin_shutdown()


class Sse:
    """A client of ``GET /v1/sessions/{id}/stream``, collecting frames as they come."""

    def __init__(self) -> None:
        self.events: list[tuple[int, str, dict[str, Any]]] = []
        self.keepalives = 0
        self.status: int | None = None
        self.headers: httpx.Headers | None = None
        self._changed = trio.Event()

    async def run(
        self,
        client: httpx.AsyncClient,
        session_id: str,
        *,
        headers: dict[str, str] | None = None,
        params: dict[str, str] | None = None,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        path = f"/v1/sessions/{session_id}/stream"
        async with client.stream(
            "GET", path, headers=headers, params=params, timeout=None
        ) as response:
            self.status, self.headers = response.status_code, response.headers
            task_status.started()
            buffer = ""
            async for text in response.aiter_text():
                buffer += text
                while "\n\n" in buffer:
                    block, buffer = buffer.split("\n\n", 1)
                    self._frame(block)
                self._changed.set()
                self._changed = trio.Event()

    def _frame(self, block: str) -> None:
        if block.startswith(":"):
            self.keepalives += 1
            return
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        data = json.loads(fields["data"])
        assert data["type"] == fields["event"]
        self.events.append((int(fields["id"]), fields["event"], data))

    async def wait_until(self, predicate: Callable[[], Any], timeout: float = 10) -> Any:
        with trio.fail_after(timeout):
            while not (value := predicate()):
                await self._changed.wait()
        return value

    def types(self) -> list[str]:
        return [kind for _, kind, _ in self.events]

    def has(self, kind: str, count: int = 1) -> bool:
        return self.types().count(kind) >= count


async def open_sse(ctx: Ctx, session_id: str, **kwargs: Any) -> tuple[Sse, trio.CancelScope]:
    sse = Sse()
    scope = trio.CancelScope()
    ctx.readers.append(scope)

    async def reader(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with scope:
            await sse.run(ctx.client, session_id, task_status=task_status, **kwargs)

    await ctx.nursery.start(reader)
    return sse, scope


async def bound(runner: FakeRunner, session_id: str) -> None:
    """Wait until the server has (re)opened the session's stream on this runner."""
    await runner.wait_until(lambda: runner.stream_open(session_id))


def turn(text_parts: list[str], response_id: str = "resp_1") -> list[dict[str, Any]]:
    """The runner-stream events of a plain turn (§ii.6), heartbeats included."""
    response = {"id": response_id, "object": "response", "model": "alpha", "output": []}
    events: list[dict[str, Any]] = [
        {"type": "session.status", "status": "running"},
        {"sequence_number": 1, "type": "response.in_progress", "response": response},
    ]
    for i, part in enumerate(text_parts):
        events.append(
            {"sequence_number": 3 + i, "type": "response.output_text.delta", "delta": part}
        )
        if i == 0:
            events.append({"type": "session.heartbeat"})
    events.append(
        {
            "sequence_number": 3 + len(text_parts),
            "type": "response.completed",
            "response": {**response, "status": "completed"},
        }
    )
    events.append({"type": "session.status", "status": "idle"})
    return events


def interrupted_note(response_id: str) -> dict[str, Any]:
    """The ``external_conversation_item`` the runner posts after an interrupted turn (§E.4)."""
    return {
        "type": "external_conversation_item",
        "data": {
            "item_type": "message",
            "item_data": {
                "role": "user",
                "content": [{"type": "input_text", "text": "[System: interrupted]"}],
            },
            "response_id": response_id,
        },
    }


# --- the tunnel ------------------------------------------------------------------------------


async def test_tunnel_handshake_close_codes_and_liveness(tmp_path: Path, agents_dir: Path) -> None:
    options = msgspec.structs.replace(
        FAST, ping_interval_s=0.1, ping_timeout_s=1.5, hello_timeout_s=0.5
    )
    async with running(tmp_path / "state", make_settings(agents_dir), options) as ctx:
        ws_base = ctx.url.replace("http://", "ws://")
        origin = (b"Origin", b"omnigent://internal")
        good = [origin, (b"X-Omnigent-Runner-Tunnel-Token", ctx.token.encode())]
        path = f"/v1/runners/{ctx.plane.runner_id}/tunnel"

        async def close_of(
            path: str, headers: list[tuple[bytes, bytes]], first: Any = HELLO
        ) -> tuple[int, str]:
            async with open_websocket_url(ws_base + path, extra_headers=headers) as ws:
                if first is not None:
                    with suppress(ConnectionClosed):
                        await ws.send_message(json.dumps(first))
                with trio.fail_after(5):
                    while True:
                        try:
                            await ws.get_message()  # pings only; never answered
                        except ConnectionClosed as exc:
                            assert exc.reason is not None
                            return exc.reason.code, exc.reason.reason or ""

        wrong_id = "/v1/runners/runner_token_00000000000000000000000000000000/tunnel"
        assert await close_of(wrong_id, good) == (4004, "runner_id does not match tunnel token")
        assert await close_of(path, [origin]) == (4004, "runner tunnel token is required")
        bad = [origin, (b"X-Omnigent-Runner-Tunnel-Token", b"not-the-token")]
        assert await close_of(path, bad) == (4004, "unauthenticated")
        assert await close_of(path, good, {"kind": "ping", "ts": 1}) == (
            4001,
            "expected hello frame",
        )
        assert await close_of(path, good, None) == (4001, "expected hello frame")
        assert await close_of(path, good, {**HELLO, "frame_protocol_version": 2}) == (
            4002,
            "frame_protocol_version mismatch: server supports 1, runner sent 2",
        )
        # A runner that never sends another frame is dead after ping_timeout_s.
        assert await close_of(path, good) == (4003, "ping timeout")
        with pytest.raises(ConnectionRejected) as rejected:
            async with open_websocket_url(
                ws_base + path, extra_headers=[(b"Origin", b"https://evil.example"), good[1]]
            ):
                pass
        assert rejected.value.status_code == 403

        # A live runner answers the pings and stays connected past the timeout.
        first = await ctx.runner()
        await first.wait_until(lambda: len(first.pings) >= 20)  # 2 s > ping_timeout_s
        assert first.close_code is None
        assert all(isinstance(ts, int) and ts > 1_700_000_000_000 for ts in first.pings)
        health = (await ctx.client.get("/healthz")).json()
        assert health["runner_online"] is True
        assert health["runner"]["hello"]["harnesses"] == ["openai", "scripted"]

        # A second tunnel for the same runner id replaces the first (4000).
        second = await ctx.runner()
        await first.wait_until(lambda: first.close_code is not None)
        assert (first.close_code, first.close_reason) == (4000, "tunnel replaced")
        await second.wait_until(lambda: len(second.pings) >= 2)
        assert second.close_code is None
    # A clean shutdown tells the runner to reconnect at once (1012).
    assert second.close_code == 1012


# --- agents ----------------------------------------------------------------------------------


async def test_agents_listing(tmp_path: Path, agents_dir: Path) -> None:
    async with running(tmp_path / "state", make_settings(agents_dir)) as ctx:
        answer = await ctx.client.get("/v1/agents")
        assert answer.status_code == 200
        agents = answer.json()["agents"]
        names = [a["name"] for a in agents]
        assert names == sorted(names)
        mine = {a["name"]: a for a in agents if a["name"] in ("alpha", "beta", "gamma")}
        assert set(mine) == {"alpha", "beta"}  # the two broken files are skipped
        assert mine["alpha"]["harness"] == "scripted"
        assert mine["alpha"]["model"] == "m-alpha"
        assert mine["alpha"]["description"] == "the first test agent"
        assert mine["beta"]["harness"] == "openai"
        assert mine["beta"]["model"] == "m-beta"
        assert "description" not in mine["beta"]
        # A new file is picked up without a restart.
        (agents_dir / "delta.yaml").write_text("executor:\n  harness: scripted\n")
        names = [a["name"] for a in (await ctx.client.get("/v1/agents")).json()["agents"]]
        assert "delta" in names  # no name in the spec: the file stem


# --- sessions, messages, the conversation store ----------------------------------------------


async def test_session_binding_message_and_turn(tmp_path: Path, agents_dir: Path) -> None:
    async with running(tmp_path / "state", make_settings(agents_dir)) as ctx:
        early = await ctx.create(title="made before the runner")
        assert early["object"] == "session"
        assert early["agent"] == "alpha"
        assert early["runner_id"] == ctx.plane.runner_id
        assert early["title"] == "made before the runner"
        assert early["status"] == "idle"
        assert early["last_event_id"] == 0

        runner = await ctx.runner()
        await bound(runner, early["id"])
        order = [(r.method, r.path) for r in runner.requests]
        sid = early["id"]
        # The 0.19 server binds with the init envelope and opens the stream; no .../skills.
        assert order[:2] == [("POST", "/v1/sessions"), ("GET", f"/v1/sessions/{sid}/stream")]
        init = runner.requests[0].body
        assert init["session_id"] == sid
        assert init["agent_id"] == early["agent_id"]
        assert init["session_init"]["protocol_version"] == 2
        assert init["session_init"]["server_version"] == "0.19.1"
        assert init["session_init"]["session_id"] == sid
        assert init["session_init"]["snapshot"]["root_session_id"] == sid
        assert init["session_init"]["snapshot"]["inference_config"] is None
        assert init["session_init"]["suppress_recovery_turn"] is False
        assert init["session_init"]["resume_interrupted_turn"] is False
        assert init["session_init"]["recovery_id"] is None

        # A session created while the runner is connected is bound at once.
        session = await ctx.create()
        sid = session["id"]
        await bound(runner, sid)
        mine = [(r.method, r.path) for r in runner.requests if sid in json.dumps(r.body) + r.path]
        assert mine == [("POST", "/v1/sessions"), ("GET", f"/v1/sessions/{sid}/stream")]

        sse, _ = await open_sse(ctx, sid)
        assert sse.status == 200
        assert sse.headers is not None
        assert sse.headers["content-type"].startswith("text/event-stream")

        # The user item is persisted before the runner sees the message.
        seen_items: list[list[dict[str, Any]]] = []

        async def look(session_id: str, body: Any) -> None:
            async with ctx.runner_client() as client:
                seen_items.append(await client.items(session_id))

        runner.on_event = look
        answer = await ctx.message(sid, "hello there")
        assert answer.status_code == 202, answer.text
        accepted = answer.json()
        # As the real server (PROTOCOL_0_19 §C.1): stored and queued, answered at once.
        assert accepted == {"queued": True, "item_id": accepted["item_id"]}
        item_id = accepted["item_id"]
        [forwarded] = await runner.wait_until(lambda: runner.events_for(sid))
        await sse.wait_until(lambda: sse.has("session.input.consumed"))  # the runner answered
        assert forwarded["type"] == "message"
        assert forwarded["role"] == "user"
        assert forwarded["content"] == [{"type": "input_text", "text": "hello there"}]
        assert forwarded["persisted_item_id"] == item_id
        assert forwarded["agent_id"] == session["agent_id"]
        assert forwarded["model"] == "alpha"
        assert [i["id"] for i in seen_items[0]] == [item_id]
        assert seen_items[0][0]["role"] == "user"

        # Coalesced events (several in one frame), one event cut across two frames.
        events = turn(["Hel", "lo ", "wor", "ld"])
        await runner.emit(sid, *events[:4])
        await runner.emit(sid, *events[4:6], split=True)
        await runner.emit(sid, *events[6:])
        await sse.wait_until(lambda: sse.has("response.completed") and sse.has("session.status", 2))
        types = sse.types()
        assert "session.heartbeat" not in types
        assert types.count("response.output_text.delta") == 4
        assert types.index("response.output_item.done") < types.index("response.completed")
        assert types[0] == "session.input.consumed"
        ids = [seq for seq, _, _ in sse.events]
        assert ids == list(range(ids[0], ids[0] + len(ids)))
        consumed = sse.events[0][2]
        assert consumed["data"]["item_id"] == item_id
        status = [e for _, k, e in sse.events if k == "session.status"]
        assert status[0]["conversation_id"] == sid

        items = await ctx.items(sid)
        assert [(i["type"], i.get("role")) for i in items] == [
            ("message", "user"),
            ("message", "assistant"),
        ]
        assert items[1]["content"] == [{"type": "output_text", "text": "Hello world"}]
        assert items[1]["response_id"] == "resp_1"
        done = next(e for _, k, e in sse.events if k == "response.output_item.done")
        assert done["item"]["id"] == items[1]["id"]
        snap = await ctx.snapshot(sid)
        assert snap["status"] == "idle"
        assert snap["items_count"] == 2
        assert snap["last_event_id"] == ids[-1]

        # A tool turn: text before a completed function call becomes its own item.
        tool_events = [
            {"type": "session.status", "status": "running"},
            {"type": "response.in_progress", "response": {"id": "resp_2", "model": "alpha"}},
            {"type": "response.output_text.delta", "delta": "let me look"},
            {
                "type": "response.output_item.done",
                "item": {"type": "function_call", "status": "in_progress", "name": "sys_os_shell",
                         "arguments": "{}", "call_id": "call_1", "id": "fc_1"},
            },
            {
                "type": "response.output_item.done",
                "item": {"type": "function_call", "status": "completed", "name": "sys_os_shell",
                         "arguments": "{\"command\": \"ls\"}", "call_id": "call_1", "id": "fc_2"},
            },
            {
                "type": "response.output_item.done",
                "item": {"type": "function_call_output", "call_id": "call_1", "output": "a b",
                         "status": "completed", "id": "fco_1"},
            },
            {"type": "response.output_text.delta", "delta": "found a and b"},
            {"type": "response.completed", "response": {"id": "resp_2", "status": "completed"}},
            {"type": "session.status", "status": "idle"},
        ]  # fmt: skip
        answer = await ctx.message(sid, [{"type": "input_text", "text": "list files"}])
        assert answer.status_code == 202
        await runner.emit(sid, *tool_events)
        await sse.wait_until(lambda: sse.has("response.completed", 2))
        items = await ctx.items(sid)
        shapes = [(i["type"], i.get("role")) for i in items[2:]]
        assert shapes == [
            ("message", "user"),
            ("message", "assistant"),
            ("function_call", None),
            ("function_call_output", None),
            ("message", "assistant"),
        ]
        assert items[3]["content"][0]["text"] == "let me look"
        assert items[4]["name"] == "sys_os_shell"
        assert items[4]["call_id"] == "call_1"
        assert items[4]["arguments"] == '{"command": "ls"}'
        assert items[4]["response_id"] == "resp_2"
        assert items[5]["output"] == "a b"
        assert items[6]["content"][0]["text"] == "found a and b"

        # An interrupted turn (no terminal event) leaves no partial assistant item (§v.4).
        await ctx.message(sid, "slow one")
        await runner.emit(
            sid,
            {"type": "response.in_progress", "response": {"id": "resp_3"}},
            {"type": "response.output_text.delta", "delta": "partial"},
            {"type": "session.status", "status": "idle"},
        )
        await sse.wait_until(lambda: sse.has("session.status", 5))
        assert [i.get("role") for i in (await ctx.items(sid))[7:]] == ["user"]

        # Item paging (§iii.6): limit, order, after, has_more.
        page = (await ctx.client.get(f"/v1/sessions/{sid}/items?limit=3&order=asc")).json()
        assert [i["id"] for i in page["data"]] == [i["id"] for i in items[:3]]
        assert page["has_more"] is True
        assert page["first_id"] == items[0]["id"]
        assert page["last_id"] == items[2]["id"]
        after = page["last_id"]
        page2 = (
            await ctx.client.get(f"/v1/sessions/{sid}/items?limit=100&order=asc&after={after}")
        ).json()
        assert page2["data"][0]["id"] == items[3]["id"]
        assert page2["has_more"] is False
        desc = (await ctx.client.get(f"/v1/sessions/{sid}/items?limit=2")).json()
        assert desc["data"][0]["role"] == "user"
        assert desc["data"][0]["content"][0]["text"] == "slow one"
        unknown = await ctx.client.get(f"/v1/sessions/{sid}/items?after=nope")
        assert unknown.status_code == 400
        assert unknown.json()["error"] == "invalid_cursor"
        async with ctx.runner_client() as client:
            assert [i["id"] for i in await client.items(sid, page_size=2)] == [
                i["id"] for i in await ctx.items(sid)
            ]

        listing = (await ctx.client.get("/v1/sessions")).json()
        assert listing["object"] == "list"
        assert [s["id"] for s in listing["data"]] == [sid, early["id"]]  # newest first


async def test_sse_resume_sees_every_event_exactly_once(tmp_path: Path, agents_dir: Path) -> None:
    async with running(tmp_path / "state", make_settings(agents_dir)) as ctx:
        runner = await ctx.runner()
        sid = (await ctx.create())["id"]
        await bound(runner, sid)
        watcher, _ = await open_sse(ctx, sid)  # tells when events are stored
        first, scope = await open_sse(ctx, sid)
        batch = [{"type": "custom.event", "n": n} for n in range(10)]
        await runner.emit(sid, *batch[:5])
        await first.wait_until(lambda: len(first.events) >= 5)
        scope.cancel()  # the client goes away after 5 events
        last_seen = first.events[4][0]
        await runner.emit(sid, *batch[5:])  # published while it is away
        await watcher.wait_until(lambda: len(watcher.events) >= 10)

        resumed, _ = await open_sse(ctx, sid, headers={"Last-Event-ID": str(last_seen)})
        await resumed.wait_until(lambda: len(resumed.events) >= 5)
        await runner.emit(sid, {"type": "custom.event", "n": 10})  # and one live
        await resumed.wait_until(lambda: len(resumed.events) >= 6)
        seen = [e["n"] for _, _, e in first.events[:5]] + [e["n"] for _, _, e in resumed.events]
        assert seen == list(range(11))
        ids = [i for i, _, _ in first.events[:5]] + [i for i, _, _ in resumed.events]
        assert ids == sorted(set(ids))

        everything, _ = await open_sse(ctx, sid, params={"after": "0"})
        await everything.wait_until(lambda: len(everything.events) >= 11)
        assert [e["n"] for _, _, e in everything.events] == list(range(11))
        # Silence is filled with keepalive comments.
        await everything.wait_until(lambda: everything.keepalives >= 2, timeout=5)
        assert len(everything.events) == 11

        bad = await ctx.client.get(f"/v1/sessions/{sid}/stream", headers={"Last-Event-ID": "x"})
        assert bad.status_code == 400
        missing = await ctx.client.get("/v1/sessions/nope/stream")
        assert missing.status_code == 404


# --- policies and tools ----------------------------------------------------------------------

RULES = [
    PolicyRule(tool="sys_os_delete", action="deny", message="never delete"),
    PolicyRule(tool="sys_os_*", action="ask", message="ask_os"),
    PolicyRule(tool="*", action="deny", phase="PHASE_LLM_REQUEST", message="no llm"),
]


async def test_policies_evaluate(tmp_path: Path, agents_dir: Path) -> None:
    async with running(tmp_path / "state", make_settings(agents_dir, policies=RULES)) as ctx:
        sid = (await ctx.create())["id"]
        async with ctx.runner_client() as client:

            async def verdict(phase: str, data: dict[str, Any]) -> dict[str, Any]:
                return await client.evaluate_policy(sid, {"event": {"type": phase, "data": data}})

            tool = "PHASE_TOOL_CALL"
            assert await verdict(tool, {"name": "web_fetch"}) == {
                "result": "POLICY_ACTION_ALLOW",
                "reason": None,
            }
            assert await verdict(tool, {"name": "sys_os_delete"}) == {
                "result": "POLICY_ACTION_DENY",
                "reason": "never delete",
            }
            assert await verdict(tool, {"tool_name": "sys_os_shell"}) == {
                "result": "POLICY_ACTION_ASK",
                "reason": "ask_os",
            }
            assert (await verdict(tool, {"tool": "sys_os_read"}))["result"] == "POLICY_ACTION_ASK"
            assert (await verdict("PHASE_LLM_REQUEST", {"model": "m"}))["result"] == (
                "POLICY_ACTION_DENY"
            )
            assert (await verdict("PHASE_TOOL_RESULT", {"name": "sys_os_delete"}))[
                "result"
            ] == "POLICY_ACTION_ALLOW"
        url = f"/v1/sessions/{sid}/policies/evaluate"
        body = {"event": {"type": "PHASE_TOOL_CALL", "data": {}}}
        assert (await ctx.client.post(url, json=body)).status_code == 401
        headers = {"x-omnigent-runner-tunnel-token": ctx.token}
        bad = await ctx.client.post(url, json={"event": "x"}, headers=headers)
        assert bad.status_code == 422
        assert bad.json()["error"] == "invalid_request"
    async with running(tmp_path / "state2", make_settings(agents_dir)) as ctx:
        sid = (await ctx.create())["id"]
        async with ctx.runner_client() as client:
            answer = await client.evaluate_policy(
                sid, {"event": {"type": "PHASE_TOOL_CALL", "data": {"name": "sys_os_delete"}}}
            )
        assert answer["result"] == "POLICY_ACTION_ALLOW"  # no rules: allow


async def test_mcp_round_trip_through_the_tunnel(tmp_path: Path, agents_dir: Path) -> None:
    async with running(tmp_path / "state", make_settings(agents_dir, policies=RULES)) as ctx:
        runner = await ctx.runner()
        runner.tool = lambda name, args: f"ran {name} with {json.dumps(args, sort_keys=True)}"
        sid = (await ctx.create())["id"]
        await bound(runner, sid)
        sse, _ = await open_sse(ctx, sid)
        execute = f"/v1/sessions/{sid}/mcp/execute"
        async with ctx.runner_client() as client:
            # Allowed: straight to the runner's /mcp/execute, wrapped as MCP content.
            result = await client.mcp_call(sid, "web_fetch", {"url": "http://x"})
            assert result == {
                "content": [{"type": "text", "text": 'ran web_fetch with {"url": "http://x"}'}]
            }
            [call] = runner.seen("POST", execute)
            assert call.body == {
                "method": "tools/call",
                "params": {"name": "web_fetch", "arguments": {"url": "http://x"}},
            }
            # The same, with the runner answering in base64 body frames (non-ASCII output).
            runner.base64_bodies = True
            runner.tool = lambda name, args: f"ran {name} on {args['url']}"
            result = await client.mcp_call(sid, "web_fetch", {"url": "http://ü"})
            assert result["content"][0]["text"] == "ran web_fetch on http://ü"
            runner.base64_bodies = False
            runner.tool = lambda name, args: f"ran {name} with {json.dumps(args, sort_keys=True)}"
            del runner.requests[-1]

            # Denied: an error result, the runner is not asked.
            denied = await client.mcp_call(sid, "sys_os_delete", {"path": "/"})
            assert denied["isError"] is True
            assert "never delete" in denied["content"][0]["text"]
            assert len(runner.seen("POST", execute)) == 1

            # Ask → input_required → a human accepts → the retry runs the tool.
            asked: list[dict[str, Any]] = []

            async def approve(required: dict[str, Any]) -> dict[str, Any]:
                asked.append(required)
                [eid] = required["inputRequests"]
                await sse.wait_until(lambda: sse.has("response.elicitation_request"))
                pending = (await ctx.snapshot(sid))["pending_elicitations"]
                assert [p["id"] for p in pending] == [eid]
                assert pending[0]["elicitation_id"] == eid
                assert "sys_os_shell" in pending[0]["params"]["message"]
                assert pending[0]["params"]["message"].startswith("ask_os: ")
                assert len(runner.seen("POST", execute)) == 1  # not run yet
                answer = await ctx.client.post(
                    f"/v1/sessions/{sid}/elicitations/{eid}/resolve", json={"action": "accept"}
                )
                assert answer.status_code == 202, answer.text
                assert answer.json()["queued"] is False
                assert runner.events_for(sid)[-1] == {
                    "type": "approval",
                    "data": {"elicitation_id": eid, "action": "accept"},
                }
                return {eid: {"action": "accept"}}

            result = await client.mcp_call(
                sid, "sys_os_shell", {"command": "ls"}, on_input_required=approve
            )
            assert result["content"][0]["text"] == 'ran sys_os_shell with {"command": "ls"}'
            assert len(runner.seen("POST", execute)) == 2
            [required] = asked
            assert required["resultType"] == "input_required"
            [eid] = required["inputRequests"]
            state = json.loads(required["requestState"])
            assert state == {"elicitation_id": eid, "session_id": sid}
            request_event = next(e for _, k, e in sse.events if k == "response.elicitation_request")
            assert request_event["elicitation_id"] == eid
            assert (await ctx.snapshot(sid))["pending_elicitations"] == []

            # The approval is spent: replaying the retry does not run the tool again.
            replay = {
                "name": "sys_os_shell",
                "arguments": {"command": "ls"},
                "requestState": required["requestState"],
                "inputResponses": {eid: {"action": "accept"}},
            }
            answer = await rpc(ctx, sid, replay)
            assert answer["error"]["code"] == -32602
            assert len(runner.seen("POST", execute)) == 2

            # Decline (as an approval event): the retry is an error result, nothing runs.
            async def decline(required: dict[str, Any]) -> dict[str, Any]:
                [eid] = required["inputRequests"]
                answer = await ctx.client.post(
                    f"/v1/sessions/{sid}/events",
                    json={"type": "approval", "data": {"elicitation_id": eid, "action": "decline"}},
                )
                assert answer.status_code == 202, answer.text
                return {eid: {"action": "decline"}}

            declined = await client.mcp_call(
                sid, "sys_os_write", {"path": "x"}, on_input_required=decline
            )
            assert declined["isError"] is True
            assert "declined" in declined["content"][0]["text"]
            assert len(runner.seen("POST", execute)) == 2

        # A retry whose call differs from the approved one is refused.
        first = await rpc(ctx, sid, {"name": "sys_os_shell", "arguments": {"command": "ls"}})
        [eid] = first["result"]["inputRequests"]
        await ctx.client.post(
            f"/v1/sessions/{sid}/elicitations/{eid}/resolve", json={"action": "accept"}
        )
        swapped = await rpc(
            ctx,
            sid,
            {
                "name": "sys_os_shell",
                "arguments": {"command": "rm -rf /"},
                "requestState": first["result"]["requestState"],
                "inputResponses": {eid: {"action": "accept"}},
            },
        )
        assert swapped["error"]["code"] == -32602
        assert len(runner.seen("POST", execute)) == 2
        other = await ctx.client.post(
            f"/v1/sessions/{sid}/mcp",
            json={"jsonrpc": "2.0", "id": 9, "method": "tools/list"},
            headers={"x-omnigent-runner-tunnel-token": ctx.token},
        )
        assert other.json()["error"]["code"] == -32601


async def rpc(ctx: Ctx, sid: str, params: dict[str, Any]) -> dict[str, Any]:
    answer = await ctx.client.post(
        f"/v1/sessions/{sid}/mcp",
        json={"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params},
        headers={"x-omnigent-runner-tunnel-token": ctx.token},
    )
    assert answer.status_code == 200
    return answer.json()


# --- the runner's HTTP API -------------------------------------------------------------------


async def test_runner_http_api(tmp_path: Path, agents_dir: Path) -> None:
    async with running(tmp_path / "state", make_settings(agents_dir)) as ctx:
        session = await ctx.create()
        sid = session["id"]
        async with ctx.runner_client() as client:
            assert await client.version() == "0.19.1"
            with pytest.raises(ServerRejected) as minted:
                await client.runner_token(ctx.plane.runner_id)
            assert minted.value.status == 400
            bundle = await client.agent_bundle_info(sid)
            assert bundle.spec.name == "alpha"
            assert bundle.spec.model == "m-alpha"
            assert bundle.name == "alpha"
            assert bundle.session_scoped is True
            version = bundle.version
            snapshot = await client.session_snapshot(sid)
            assert snapshot["id"] == sid
            assert snapshot["agent_id"] == session["agent_id"]
            assert snapshot["agent_name"] == "alpha"
            assert snapshot["harness"] == "scripted"
            assert snapshot["llm_model"] == "m-alpha"
            assert snapshot["pending_elicitations"] == []
            assert snapshot["runner_online"] is False
            patched = await client.patch_session(sid, {"labels": {"omnigent.ui": "terminal"}})
            assert patched["labels"] == {"omnigent.ui": "terminal"}
            assert await client.labels(sid) == {"omnigent.ui": "terminal"}
            answer = await client.post_event(sid, interrupted_note("cancel_1"))
            assert answer["queued"] is False
            [item] = await client.items(sid)
            assert item["id"] == answer["item_id"]
            assert item["response_id"] == "cancel_1"
            assert item["content"][0]["text"] == "[System: interrupted]"
            # Editing the agent file reaches the next bundle, with a new version.
            (agents_dir / "alpha.yaml").write_text(ALPHA.replace("m-alpha", "m-alpha-2"))
            bundle = await client.agent_bundle_info(sid)
            assert bundle.spec.model == "m-alpha-2"
            assert bundle.version != version
            # Gone from disk: the copy taken at creation is served.
            (agents_dir / "alpha.yaml").unlink()
            assert (await client.agent_bundle(sid)).model == "m-alpha"
        unauthenticated = await ctx.client.get(f"/v1/sessions/{sid}/agent/contents")
        assert unauthenticated.status_code == 401
        assert unauthenticated.json()["error"] == "unauthorized"
        external = await ctx.client.post(
            f"/v1/sessions/{sid}/events",
            json={"type": "external_conversation_item", "data": {"item_data": {}}},
        )
        assert external.status_code == 401
        wrong = await ctx.client.get(
            f"/v1/sessions/{sid}", headers={"x-omnigent-runner-tunnel-token": "wrong"}
        )
        assert wrong.status_code == 401
        foreign = await ctx.client.get("/v1/agents", headers={"Origin": "https://evil.example"})
        assert foreign.status_code == 403
        assert foreign.json()["error"] == "forbidden_origin"


async def test_non_loopback_listener_takes_the_client_token_not_the_runners(
    tmp_path: Path, agents_dir: Path
) -> None:
    settings = make_settings(agents_dir, host="0.0.0.0")
    async with running(tmp_path / "state", settings) as ctx:
        assert ctx.url.startswith("http://127.0.0.1:")
        assert (await ctx.client.get("/v1/agents")).status_code == 200  # the client token
        anonymous = {"authorization": ""}
        assert (await ctx.client.get("/v1/agents", headers=anonymous)).status_code == 401
        # The runner's token is the runner's: it is no client credential, as bearer or header
        # (a client-only route: the runner's session tools may read the agents list, #17).
        resolve = "/v1/sessions/s/elicitations/e/resolve"
        runner_bearer = {"Authorization": f"Bearer {ctx.token}"}
        refused = await ctx.client.post(resolve, headers=runner_bearer, json={"action": "accept"})
        assert refused.status_code == 401
        runner_header = {"x-omnigent-runner-tunnel-token": ctx.token, "authorization": ""}
        refused = await ctx.client.post(resolve, headers=runner_header, json={"action": "accept"})
        assert refused.status_code == 401
        assert (await ctx.client.get("/v1/agents", headers=runner_header)).status_code == 200
        async with ctx.runner_client() as client:
            assert await client.version() == "0.19.1"
        runner = await ctx.runner()
        answer = await ctx.client.post("/v1/sessions", json={"agent": "alpha"})
        assert answer.status_code == 201
        await bound(runner, answer.json()["id"])


# --- verdicts, interrupts, reconnects, restarts ----------------------------------------------


async def test_resolve_and_verdict_given_while_runner_offline(
    tmp_path: Path, agents_dir: Path
) -> None:
    state = tmp_path / "state"
    settings = make_settings(agents_dir)
    async with running(state, settings) as ctx:
        runner = await ctx.runner()
        sid = (await ctx.create())["id"]
        await bound(runner, sid)
        sse, _ = await open_sse(ctx, sid)
        params = {"message": "Proceed?", "requestedSchema": {"type": "object", "properties": {}}}
        await runner.emit(
            sid,
            {
                "type": "response.elicitation_request",
                "elicitation_id": "elicit_r1",
                "params": params,
            },
        )
        await sse.wait_until(lambda: sse.has("response.elicitation_request"))
        [pending] = (await ctx.snapshot(sid))["pending_elicitations"]
        assert pending["id"] == pending["elicitation_id"] == "elicit_r1"
        assert pending["params"] == params

        answer = await ctx.client.post(
            f"/v1/sessions/{sid}/elicitations/elicit_r1/resolve",
            json={"action": "accept", "content": {"note": "ok"}},
        )
        assert answer.status_code == 202
        assert answer.json()["queued"] is False
        assert runner.events_for(sid)[-1] == {
            "type": "approval",
            "data": {"elicitation_id": "elicit_r1", "action": "accept", "content": {"note": "ok"}},
        }
        assert (await ctx.snapshot(sid))["pending_elicitations"] == []
        await sse.wait_until(lambda: sse.has("response.elicitation_resolved"))
        again = await ctx.client.post(
            f"/v1/sessions/{sid}/elicitations/elicit_r1/resolve", json={"action": "accept"}
        )
        assert again.status_code == 409
        assert again.json()["error"] == "already_resolved"
        unknown = await ctx.client.post(
            f"/v1/sessions/{sid}/elicitations/elicit_nope/resolve", json={"action": "accept"}
        )
        assert unknown.status_code == 404

        # A turn parks on a second approval; the runner goes away.
        await runner.emit(
            sid,
            {
                "type": "response.elicitation_request",
                "elicitation_id": "elicit_r2",
                "params": params,
            },
        )
        await sse.wait_until(lambda: sse.has("response.elicitation_request", 2))
        await runner.disconnect()
        with trio.fail_after(10):
            while (await ctx.snapshot(sid))["runner_online"]:
                await trio.sleep(0.02)
        answer = await ctx.client.post(
            f"/v1/sessions/{sid}/elicitations/elicit_r2/resolve", json={"action": "decline"}
        )
        assert answer.status_code == 202
        assert answer.json()["queued"] is True
        queued = await ctx.message(sid, "and then this")
        assert queued.status_code == 202
        assert queued.json()["queued"] is True
        interrupt = await ctx.client.post(
            f"/v1/sessions/{sid}/events", json={"type": "interrupt", "data": {}}
        )
        assert interrupt.status_code == 503
        assert interrupt.json()["error"] == "runner_offline"
    # The control plane restarts while the turn is parked; then the runner comes back.
    async with running(state, settings) as ctx:
        runner = await ctx.runner()
        await runner.wait_until(lambda: len(runner.events_for(sid)) >= 2)
        inits = [r.body for r in runner.seen("POST", "/v1/sessions")]
        assert [b["session_id"] for b in inits] == [sid]
        # A message is about to be forwarded: no recovery turn from the history.
        assert inits[0]["session_init"]["suppress_recovery_turn"] is True
        got = runner.events_for(sid)
        assert got[0] == {
            "type": "approval",
            "data": {"elicitation_id": "elicit_r2", "action": "decline"},
        }
        assert got[1]["type"] == "message"
        assert got[1]["content"][0]["text"] == "and then this"
        stream_at = runner.seen("GET", f"/v1/sessions/{sid}/stream")[0].at
        assert all(r.at > stream_at for r in runner.seen("POST", f"/v1/sessions/{sid}/events"))
        # Delivered once each: the next event the runner gets is the interrupt.
        answer = await ctx.client.post(
            f"/v1/sessions/{sid}/events", json={"type": "interrupt", "data": {}}
        )
        assert answer.status_code == 202
        assert answer.json()["queued"] is False
        assert runner.events_for(sid)[2:] == [{"type": "interrupt"}]


async def test_reconnect_reinits_and_reopens_streams(tmp_path: Path, agents_dir: Path) -> None:
    async with running(tmp_path / "state", make_settings(agents_dir)) as ctx:
        runner = await ctx.runner()
        a = (await ctx.create())["id"]
        b = (await ctx.create("beta"))["id"]
        await bound(runner, a)
        await bound(runner, b)
        sse, _ = await open_sse(ctx, a)

        # The runner ends a stream: the server re-inits the session and opens a new one.
        await runner.end_stream(a)
        await runner.wait_until(lambda: len(runner.seen("GET", f"/v1/sessions/{a}/stream")) == 2)
        await bound(runner, a)
        assert (
            len([r for r in runner.seen("POST", "/v1/sessions") if r.body["session_id"] == a]) == 2
        )
        await runner.emit(a, {"type": "custom.event", "n": 1})
        await sse.wait_until(lambda: sse.has("custom.event"))

        # A new tunnel: every bound session is initialised again, one after the other.
        await runner.disconnect()
        again = await ctx.runner()
        await bound(again, a)
        await bound(again, b)
        inits = [r.body["session_id"] for r in again.seen("POST", "/v1/sessions")]
        assert sorted(inits) == sorted([a, b])
        first_init_answered = again.seen("GET", f"/v1/sessions/{inits[0]}/stream")[0].at
        assert again.seen("POST", "/v1/sessions")[1].at >= first_init_answered
        await again.emit(a, {"type": "custom.event", "n": 2})
        await sse.wait_until(lambda: sse.has("custom.event", 2))

        # A 5xx answer is retried (with backoff) until the runner takes the message.
        again.next_statuses = [503, 500]
        answer = await ctx.message(a, "third time lucky")
        assert answer.status_code == 202
        assert answer.json()["queued"] is True
        await sse.wait_until(lambda: sse.has("session.input.consumed"))
        tries = [e for e in again.events_for(a) if e["type"] == "message"]
        assert [t["persisted_item_id"] for t in tries] == [answer.json()["item_id"]] * 3
        # ... but not for ever: after max_delivery_attempts the client is told.
        again.next_statuses = [503] * FAST.max_delivery_attempts
        answer = await ctx.message(a, "never taken")
        failed = await sse.wait_until(
            lambda: [e for _, k, e in sse.events if k == "session.delivery_failed"]
        )
        assert failed[0]["item_id"] == answer.json()["item_id"]
        assert failed[0]["status"] == 503

        # The runner refuses a message (4xx): not retried; told on the stream.
        again.message_status = 409
        answer = await ctx.message(a, "no harness")
        assert answer.status_code == 202
        failed = await sse.wait_until(
            lambda: [e for _, k, e in sse.events if k == "session.delivery_failed"][1:]
        )
        assert (failed[0]["item_id"], failed[0]["status"]) == (answer.json()["item_id"], 409)
        assert len([e for e in again.events_for(a) if e["type"] == "message"]) == 3 + 5 + 1


async def test_restart_keeps_sessions_items_events_and_port(
    tmp_path: Path, agents_dir: Path
) -> None:
    state = tmp_path / "state"
    settings = make_settings(agents_dir)
    async with running(state, settings) as ctx:
        runner = await ctx.runner()
        sid = (await ctx.create())["id"]
        await bound(runner, sid)
        await ctx.message(sid, "remember me")
        sse, _ = await open_sse(ctx, sid)
        await runner.emit(sid, *turn(["kept"]))
        # The message's delivery outcome is stored when the runner's answer to its POST is
        # read, which may come after the turn's events.
        await sse.wait_until(
            lambda: sse.has("session.status", 2) and sse.has("session.input.consumed")
        )
        before_items = await ctx.items(sid)
        before_events = [(i, k) for i, k, _ in sse.events]
        port, url, token = ctx.plane.info.port, ctx.url, ctx.token  # type: ignore[union-attr]
    async with running(state, settings) as ctx:
        assert ctx.plane.info is not None
        assert (ctx.plane.info.port, ctx.url, ctx.token) == (port, url, token)
        # One control plane per state dir: a second one refuses to start.
        with pytest.raises(StateDirBusy, match=r"another control plane \(pid \d+\)"):
            await serve(state, settings, options=FAST)
        assert await ctx.items(sid) == before_items
        assert [i["role"] for i in before_items] == ["user", "assistant"]
        replay, _ = await open_sse(ctx, sid, params={"after": str(before_events[0][0] - 1)})
        await replay.wait_until(lambda: len(replay.events) >= len(before_events))
        assert [(i, k) for i, k, _ in replay.events] == before_events
        # New events continue the numbering.
        runner = await ctx.runner()
        await bound(runner, sid)
        await runner.emit(sid, {"type": "custom.event"})
        await replay.wait_until(lambda: replay.has("custom.event"))
        assert replay.events[-1][0] == before_events[-1][0] + 1


# --- bad input -------------------------------------------------------------------------------


async def test_bad_client_input_is_refused_and_nothing_is_stored(
    tmp_path: Path, agents_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = make_settings(agents_dir, max_body_bytes=4096)
    async with running(tmp_path / "state", settings) as ctx:
        runner = await ctx.runner()
        sid = (await ctx.create())["id"]
        await bound(runner, sid)

        async def state() -> tuple[Any, ...]:
            snap = await ctx.snapshot(sid)
            sessions = (await ctx.client.get("/v1/sessions")).json()["data"]
            return len(sessions), snap["items_count"], snap["last_event_id"]

        before = await state()

        async def refused(method: str, path: str, status: int, slug: str, **kw: Any) -> None:
            answer = await ctx.client.request(method, path, **kw)
            assert answer.status_code == status, (path, answer.text)
            body = answer.json()
            assert body["error"] == slug, body
            assert isinstance(body["detail"], str) and body["detail"]

        events = f"/v1/sessions/{sid}/events"
        await refused("POST", "/v1/sessions", 404, "unknown_agent", json={"agent": "nope"})
        await refused("POST", "/v1/sessions", 400, "invalid_json", content=b"{not json")
        await refused("POST", "/v1/sessions", 422, "invalid_request", json={"agent": 5})
        await refused("POST", "/v1/sessions", 422, "invalid_request", json={"title": "x"})
        await refused(
            "POST", "/v1/sessions", 422, "invalid_request", json={"agent": "alpha", "title": 3}
        )
        await refused("POST", "/v1/sessions", 422, "invalid_request", json=["alpha"])
        big = {"agent": "alpha", "title": "x" * 5000}
        await refused("POST", "/v1/sessions", 413, "payload_too_large", json=big)
        huge = json.dumps({"type": "message", "data": {"content": "y" * 200_000}}).encode()
        await refused("POST", events, 413, "payload_too_large", content=huge)
        await refused("POST", events, 400, "invalid_json", content=b"")
        await refused("POST", events, 422, "invalid_request", json={"data": {}})
        await refused("POST", events, 422, "unknown_event_type", json={"type": "dance"})
        await refused(
            "POST", events, 422, "invalid_request", json={"type": "message", "data": {"content": 5}}
        )
        await refused("POST", events, 422, "invalid_request", json={"type": "message", "data": {}})
        await refused(
            "POST",
            events,
            422,
            "invalid_request",
            json={"type": "message", "data": {"content": ""}},
        )
        await refused(
            "POST",
            events,
            422,
            "invalid_request",
            json={"type": "message", "data": {"content": []}},
        )
        await refused(
            "POST",
            events,
            422,
            "invalid_request",
            json={"type": "message", "data": {"content": [{"text": "no type"}]}},
        )
        await refused(
            "POST",
            events,
            422,
            "invalid_request",
            json={"type": "approval", "data": {"elicitation_id": "e", "action": "maybe"}},
        )
        await refused(
            "POST", "/v1/sessions/nope/events", 404, "not_found", json={"type": "message"}
        )
        resolve = f"/v1/sessions/{sid}/elicitations/e1/resolve"
        await refused("POST", resolve, 422, "invalid_request", json={"action": "yes"})
        await refused("POST", resolve, 404, "unknown_elicitation", json={"action": "accept"})
        await refused("GET", "/v1/sessions/nope", 404, "not_found")
        await refused("GET", "/v1/nothing", 404, "not_found")
        await refused("DELETE", "/v1/agents", 405, "method_not_allowed")
        assert await state() == before
        assert runner.events_for(sid) == []

        # An internal failure: logged with its cause, answered without it.
        async def broken(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("secret internals")

        ctx.plane.store.list_items = broken  # type: ignore[method-assign]
        with caplog.at_level(logging.ERROR, logger="corral.server.http"):
            answer = await ctx.client.get(f"/v1/sessions/{sid}/items")
        assert answer.status_code == 500
        assert answer.json()["error"] == "internal_error"
        assert "secret" not in answer.text
        assert "secret internals" in caplog.text
        # A good request still works afterwards.
        assert (await ctx.message(sid, "fine")).status_code == 202


# --- the real process ------------------------------------------------------------------------


def test_subprocess_server_json_and_port_reuse(tmp_path: Path, agents_dir: Path) -> None:
    state = tmp_path / "state"
    config = tmp_path / "corral.toml"
    config.write_text(f'[server]\nagents_dirs = ["{agents_dir}"]\n')
    info_path = state / "server" / "server.json"
    log = open(tmp_path / "server.log", "ab")  # noqa: SIM115 - closed below

    def start() -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
        started = time.time()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "corral.server",
                "--state-dir",
                str(state),
                "--config",
                str(config),
            ],
            stdout=log,
            stderr=log,
        )

        def fresh() -> dict[str, Any] | None:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()
            try:
                info = json.loads(info_path.read_text())
            except (FileNotFoundError, ValueError):
                return None
            return info if info["pid"] == proc.pid and info["started_at"] >= started else None

        return proc, wait_until(fresh, 20, "server.json")

    def stop(proc: subprocess.Popen[bytes]) -> None:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0, (tmp_path / "server.log").read_text()

    proc, info = start()
    try:
        assert info["url"] == f"http://127.0.0.1:{info['port']}"
        assert info["runner_id"].startswith("runner_token_")
        assert stat.S_IMODE(os.stat(info_path).st_mode) == 0o600
        token_path = state / "server" / "runner_token"
        assert stat.S_IMODE(os.stat(token_path).st_mode) == 0o600
        assert token_path.read_text().strip() == info["runner_token"]
        assert (state / "server" / "control.db").exists()
        client_token_path = state / "server" / "client_token"
        assert stat.S_IMODE(os.stat(client_token_path).st_mode) == 0o600
        bearer = {"authorization": f"Bearer {client_token(state)}"}
        with httpx.Client(base_url=info["url"], headers=bearer, timeout=10) as client:
            agents = [a["name"] for a in client.get("/v1/agents").json()["agents"]]
            assert {"alpha", "beta"} <= set(agents)
            session = client.post("/v1/sessions", json={"agent": "beta"}).json()
            answer = client.post(
                f"/v1/sessions/{session['id']}/events",
                json={"type": "message", "data": {"content": "kept across restarts"}},
            )
            assert answer.status_code == 202
            assert answer.json()["queued"] is True  # no runner
    finally:
        stop(proc)
    proc, again = start()
    try:
        assert again["port"] == info["port"]
        assert again["runner_token"] == info["runner_token"]
        assert again["runner_id"] == info["runner_id"]
        assert again["pid"] != info["pid"]
        with httpx.Client(base_url=again["url"], headers=bearer, timeout=10) as client:
            snap = client.get(f"/v1/sessions/{session['id']}").json()
            assert snap["agent"] == "beta"
            assert snap["items_count"] == 1
            items = client.get(f"/v1/sessions/{session['id']}/items").json()["data"]
            assert items[0]["content"][0]["text"] == "kept across restarts"
    finally:
        stop(proc)
    # A configured port that is taken is a clear error (exit 2), not a different port.
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "corral.server",
                "--state-dir",
                str(state),
                "--port",
                str(taken),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    log.close()
    assert result.returncode == 2, result.stderr
    assert f"cannot listen on 127.0.0.1:{taken}" in result.stderr
