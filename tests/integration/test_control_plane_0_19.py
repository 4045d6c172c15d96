"""The embedded control plane speaks the 0.19 server's side where the runner changed.

Each test drives the control plane (in-process, real sockets) with the fake runner of
``tests/_fake_runner.py``, or with a raw tunnel where the fake has no say (hello fields,
``event.ready``, ``event.batch``), and checks the stored history against what the real
omnigent 0.19.1 server stores (``PROTOCOL_0_19.md``, section cited per test).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from trio_websocket import ConnectionClosed, open_websocket_url

from corral.server._mcp import error_detail
from tests.integration.test_control_plane import (
    HELLO,
    Ctx,
    Sse,
    agents_dir,
    bound,
    interrupted_note,
    make_settings,
    open_sse,
    running,
)

__all__ = ["agents_dir"]  # the fixture, re-used


def response(rid: str) -> dict[str, Any]:
    return {"id": rid, "object": "response", "model": "alpha", "status": "in_progress"}


def ended(rid: str, status: str = "completed") -> dict[str, Any]:
    return {"type": f"response.{status}", "response": {**response(rid), "status": status}}


def deltas(*parts: str) -> list[dict[str, Any]]:
    return [{"type": "response.output_text.delta", "delta": p} for p in parts]


def texts(items: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """``(role, text)`` of each message item, in order."""
    return [(i["role"], i["content"][0]["text"]) for i in items if i["type"] == "message"]


async def first_turn(ctx: Ctx, text: str, *events: dict[str, Any]) -> tuple[Any, str, Sse, Any]:
    """A bound session with a client stream whose first turn, asked by ``text``, went
    ``running`` and streamed ``events`` after its ``response.in_progress`` (``resp_1``):
    (the runner, the session id, the client stream, the message POST's answer)."""
    runner = await ctx.runner()
    sid = (await ctx.create())["id"]
    await bound(runner, sid)
    sse, _ = await open_sse(ctx, sid)
    answer = await ctx.message(sid, text)
    await runner.emit(
        sid,
        {"type": "session.status", "status": "running"},
        {"type": "response.in_progress", "response": response("resp_1")},
        *events,
    )
    return runner, sid, sse, answer


async def note_interrupted(ctx: Ctx, sid: str, hex_id: str) -> dict[str, Any]:
    """What the runner posts after an interrupted turn (§E.4), through its HTTP client."""
    async with ctx.runner_client() as client:
        return await client.post_event(sid, interrupted_note(f"cancel_{hex_id}"))


# --- §E.4: an interrupted turn --------------------------------------------------------------


async def test_e4_interrupt_note_stored_partial_text_dropped(
    tmp_path: Path, agents_dir: Path
) -> None:
    async with running(tmp_path / "state", make_settings(agents_dir)) as ctx:
        runner, sid, sse, _ = await first_turn(ctx, "count slowly", *deltas("s0 ", "s1 ", "s2"))
        await sse.wait_until(lambda: sse.has("response.output_text.delta", 3))
        answer = await ctx.client.post(
            f"/v1/sessions/{sid}/events", json={"type": "interrupt", "data": {}}
        )
        assert answer.status_code == 202
        assert runner.events_for(sid)[-1] == {"type": "interrupt"}
        # The 0.19 runner: idle twice, no terminal response event, then the note over HTTP.
        # Output it streams after taking the interrupt is fenced off, as by the real relay.
        idle = {"type": "session.status", "status": "idle"}
        await runner.emit(sid, *deltas("late"), idle, idle)
        await sse.wait_until(lambda: sse.has("session.status", 3))
        assert sse.types().count("response.output_text.delta") == 3
        accepted = await note_interrupted(ctx, sid, "ab" * 16)
        assert accepted == {"queued": False, "item_id": accepted["item_id"]}
        # Stored, never forwarded to the runner (it is the runner's own note).
        assert [e["type"] for e in runner.events_for(sid)] == ["message", "interrupt"]

        await ctx.message(sid, "again")
        await runner.emit(
            sid,
            {"type": "session.status", "status": "running"},
            {"type": "response.in_progress", "response": response("resp_2")},
            *deltas("fresh ", "answer"),
            ended("resp_2"),
            idle,
        )  # fmt: skip
        await sse.wait_until(lambda: sse.has("response.completed"))
        items = await ctx.items(sid)
        assert texts(items) == [
            ("user", "count slowly"),
            ("user", "[System: interrupted]"),
            ("user", "again"),
            ("assistant", "fresh answer"),
        ]
        assert items[1]["id"] == accepted["item_id"]
        assert items[1]["response_id"] == f"cancel_{'ab' * 16}"
        assert items[3]["response_id"] == "resp_2"
        assert (await ctx.snapshot(sid))["status"] == "idle"


async def test_e4_a_terminal_after_idle_still_flushes_the_text(
    tmp_path: Path, agents_dir: Path
) -> None:
    """The draft survives ``idle`` (the real relay clears it only at ``running``): a runner
    that ends the turn with ``response.cancelled`` after its ``idle`` keeps the text."""
    async with running(tmp_path / "state", make_settings(agents_dir)) as ctx:
        _, sid, sse, _ = await first_turn(
            ctx,
            "hi",
            *deltas("kept ", "text"),
            {"type": "session.status", "status": "idle"},
            ended("resp_1", "cancelled"),
        )
        await sse.wait_until(lambda: sse.has("response.cancelled"))
        items = await ctx.items(sid)
        assert texts(items) == [("user", "hi"), ("assistant", "kept text")]
        assert items[1]["model"] == "alpha"


async def test_e4_fence_ends_at_a_terminal_which_keeps_the_text_before_the_stop(
    tmp_path: Path, agents_dir: Path
) -> None:
    async with running(tmp_path / "state", make_settings(agents_dir)) as ctx:
        runner, sid, sse, _ = await first_turn(ctx, "go", *deltas("before ", "stop"))
        await sse.wait_until(lambda: sse.has("response.output_text.delta", 2))
        stop = {"type": "stop_session", "data": {}}
        assert (await ctx.client.post(f"/v1/sessions/{sid}/events", json=stop)).status_code == 202
        await runner.emit(
            sid,
            *deltas(" after"),
            {"type": "response.elicitation_resolved", "elicitation_id": "e1"},  # passes
            ended("resp_1", "cancelled"),
            {"type": "session.status", "status": "idle"},
            # The fence is gone: the next turn streams as usual.
            {"type": "session.status", "status": "running"},
            *deltas("next"),
        )
        await sse.wait_until(lambda: sse.has("response.output_text.delta", 3))
        assert [e["delta"] for _, k, e in sse.events if k.endswith("text.delta")] == [
            "before ",
            "stop",
            "next",
        ]
        assert sse.has("response.elicitation_resolved") and sse.has("response.cancelled")
        assert texts(await ctx.items(sid)) == [("user", "go"), ("assistant", "before stop")]


# --- §E.3: a second message mid-turn is its own turn ----------------------------------------


async def test_e3_second_message_mid_turn_is_its_own_reply(
    tmp_path: Path, agents_dir: Path
) -> None:
    async with running(tmp_path / "state", make_settings(agents_dir)) as ctx:
        runner, sid, sse, answer = await first_turn(ctx, "first", *deltas("one"))
        first = answer.json()
        await sse.wait_until(lambda: sse.has("response.output_text.delta"))
        second = await ctx.message(sid, "second")
        # As the real server (§C.1): stored, queued, answered at once.
        assert second.status_code == 202
        assert second.json() == {"queued": True, "item_id": second.json()["item_id"]}
        assert first["queued"] is True
        await runner.wait_until(lambda: len(runner.events_for(sid)) == 2)
        call = {"type": "function_call", "status": "completed", "name": "sys_os_shell",
                "arguments": "{}", "call_id": "call_9", "agent": "alpha-agent"}  # fmt: skip
        await runner.emit(
            sid,
            ended("resp_1"),
            # The next turn, with no idle between (the runner ran the buffered message).
            {"type": "session.status", "status": "running"},
            {"type": "response.in_progress", "response": response("resp_2")},
            {"type": "response.output_item.done", "item": call},
            {"type": "response.output_item.done",
             "item": {"type": "function_call_output", "call_id": "call_9", "output": "ok"}},
            *deltas("two"),
            ended("resp_2"),
            {"type": "session.status", "status": "idle"},
        )  # fmt: skip
        await sse.wait_until(lambda: sse.has("response.completed", 2))
        items = await ctx.items(sid)
        assert [(i["type"], i.get("role"), i["response_id"]) for i in items[2:]] == [
            ("message", "assistant", "resp_1"),
            ("function_call", None, "resp_2"),
            ("function_call_output", None, "resp_2"),
            ("message", "assistant", "resp_2"),
        ]
        assert texts(items) == [
            ("user", "first"),
            ("user", "second"),
            ("assistant", "one"),
            ("assistant", "two"),
        ]
        # The runner's ``agent`` is stored, and read back as ``model`` (§E.1).
        assert items[3]["model"] == "alpha-agent"
        assert items[5]["model"] == "alpha"
        statuses = [e["status"] for _, k, e in sse.events if k == "session.status"]
        assert statuses == ["running", "running", "idle"]


# --- §I.1: delete ---------------------------------------------------------------------------


async def test_i1_delete_removes_the_session_and_tells_the_runner(
    tmp_path: Path, agents_dir: Path
) -> None:
    async with running(tmp_path / "state", make_settings(agents_dir)) as ctx:
        runner = await ctx.runner()
        sid = (await ctx.create())["id"]
        keep = (await ctx.create())["id"]
        await bound(runner, sid)
        await bound(runner, keep)
        await ctx.message(sid, "soon gone")
        sse, _ = await open_sse(ctx, sid, params={"after": "0"})
        await sse.wait_until(lambda: sse.has("session.input.consumed"))

        answer = await ctx.client.delete(f"/v1/sessions/{sid}")
        assert answer.status_code == 200
        assert answer.json() == {"id": sid, "object": "conversation.deleted", "deleted": True}
        for path in (f"/v1/sessions/{sid}", f"/v1/sessions/{sid}/items"):
            gone = await ctx.client.get(path)
            assert gone.status_code == 404, path
        assert (await ctx.client.delete(f"/v1/sessions/{sid}")).status_code == 404
        listed = [s["id"] for s in (await ctx.client.get("/v1/sessions")).json()["data"]]
        assert listed == [keep]
        # The runner is told (its answer, a 404 from this fake, is ignored) and the session's
        # stream is given up (request.cancel); the other session's stays.
        await runner.wait_until(lambda: runner.seen("DELETE", f"/v1/sessions/{sid}"))
        await runner.wait_until(lambda: not runner.stream_open(sid))
        assert (await ctx.client.get(f"/v1/sessions/{sid}/stream")).status_code == 404
        assert runner.stream_open(keep)
        # A runner that reconnects is not asked to bind the deleted session again.
        await runner.disconnect()
        again = await ctx.runner()
        await bound(again, keep)
        assert [r.body["session_id"] for r in again.seen("POST", "/v1/sessions")] == [keep]


async def test_i1_client_stream_of_a_deleted_session_ends(tmp_path: Path, agents_dir: Path) -> None:
    async with running(tmp_path / "state", make_settings(agents_dir)) as ctx:
        sid = (await ctx.create())["id"]
        sse, ended = Sse(), trio.Event()

        async def follow(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            await sse.run(ctx.client, sid, task_status=task_status)
            ended.set()

        await ctx.nursery.start(follow)  # the stream's head has arrived
        assert sse.status == 200
        assert (await ctx.client.delete(f"/v1/sessions/{sid}")).status_code == 200
        with trio.fail_after(10):
            await ended.wait()


# --- §A.2/§A.3: hello fields, event.ready, event.batch --------------------------------------


@asynccontextmanager
async def raw_tunnel(ctx: Ctx, hello: dict[str, Any]) -> AsyncIterator[Any]:
    url = ctx.url.replace("http://", "ws://") + f"/v1/runners/{ctx.plane.runner_id}/tunnel"
    headers = [
        (b"Origin", b"omnigent://internal"),
        (b"X-Omnigent-Runner-Tunnel-Token", ctx.token.encode()),
    ]
    async with open_websocket_url(url, extra_headers=headers) as ws:
        await ws.send_message(json.dumps(hello))
        yield ws


async def next_frame(ws: Any, *skip: str) -> dict[str, Any]:
    with trio.fail_after(10):
        while True:
            frame = json.loads(await ws.get_message())
            if frame["kind"] not in ("ping", *skip):
                return frame


HELLO_0_19 = {
    **HELLO,
    "runner_version": "0.19.1",
    "capabilities": ["filesystem_attachments", "mcp_registry", "session-event-ingest-v1"],
    "connection_id": "6436b7545c1243cbac83a855a1c50ee5",
}


async def test_a3_event_ready_first_then_event_batches_are_acked(
    tmp_path: Path, agents_dir: Path
) -> None:
    async with running(tmp_path / "state", make_settings(agents_dir)) as ctx:
        sid = (await ctx.create())["id"]  # a bind is due as soon as the runner connects
        async with raw_tunnel(ctx, HELLO_0_19) as ws:
            assert await next_frame(ws) == {"kind": "event.ready"}
            request = await next_frame(ws)
            assert (request["kind"], request["method"], request["path"]) == (
                "request",
                "POST",
                "/v1/sessions",
            )
            health = (await ctx.client.get("/healthz")).json()
            assert health["runner"]["hello"]["connection_id"] == HELLO_0_19["connection_id"]

            def item(source: str | None, text: str) -> dict[str, Any]:
                data: dict[str, Any] = {
                    "item_type": "message",
                    "item_data": {
                        "role": "user",
                        "content": [{"type": "input_text", "text": text}],
                    },
                    "response_id": "cancel_x",
                }
                if source is not None:
                    data["source_id"] = source
                return {"type": "external_conversation_item", "data": data}

            async def batch(bid: str, *events: dict[str, Any], session: str = sid) -> Any:
                frame = {"kind": "event.batch", "id": bid, "session_id": session,
                         "events": list(events)}  # fmt: skip
                await ws.send_message(json.dumps(frame))
                return await next_frame(ws, "request", "request.cancel")

            ack = await batch("b1", item("src-1", "note one"), item("src-2", "note two"))
            assert ack == {"kind": "event.ack", "id": "b1", "applied": 2, "error": None,
                           "retryable": False}  # fmt: skip
            # A replayed batch (the runner did not see the ack) is stored once.
            assert (await batch("b1", item("src-1", "note one")))["applied"] == 1
            bad_type = await batch("b2", item("src-3", "three"), {"type": "message"})
            assert (bad_type["applied"], bad_type["error"]) == (
                1,
                "event type is not allowed on runner tunnel",
            )
            no_source = await batch("b3", item(None, "four"))
            assert (no_source["applied"], no_source["error"]) == (
                0,
                "source_id required for tunnel replay",
            )
            delta = await batch("b4", {"type": "external_output_text_delta", "data": {}})
            assert delta["applied"] == 0 and "not supported" in delta["error"]
            too_many = await batch("b5", *[item(f"s{i}", "x") for i in range(33)])
            assert too_many["error"] == "event batch exceeds count or size limit"
            unknown = await batch("b6", item("src-9", "x"), session="nope")
            assert unknown["applied"] == 0
            assert [t for _, t in texts(await ctx.items(sid))] == ["note one", "note two", "three"]


async def test_a2_hello_without_ingest_gets_no_event_ready(
    tmp_path: Path, agents_dir: Path
) -> None:
    async with running(tmp_path / "state", make_settings(agents_dir)) as ctx:
        await ctx.create()
        async with raw_tunnel(ctx, {**HELLO_0_19, "capabilities": ["mcp_registry"]}) as ws:
            first = await next_frame(ws)
            assert (first["kind"], first["path"]) == ("request", "/v1/sessions")
        bad = {**HELLO_0_19, "capabilities": "session-event-ingest-v1"}
        async with raw_tunnel(ctx, bad) as ws:
            with pytest.raises(ConnectionClosed) as closed:
                await next_frame(ws)
        assert (closed.value.reason.code, closed.value.reason.reason) == (
            4001,
            "expected hello frame",
        )


# --- §H.2: the runner's error bodies ------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ({"error": {"code": "busy", "message": "not now"}}, "not now"),
        ({"error": "busy", "detail": "not now (old shape)"}, "not now (old shape)"),
        ({"error": "busy"}, "busy"),
    ],
)
def test_h2_both_error_shapes_of_the_runner_are_read(body: Any, detail: str) -> None:
    assert error_detail(body, json.dumps(body).encode()) == detail


async def test_h2_a_refusal_in_the_0_19_shape_reaches_the_client(
    tmp_path: Path, agents_dir: Path
) -> None:
    async with running(tmp_path / "state", make_settings(agents_dir)) as ctx:
        runner = await ctx.runner()
        sid = (await ctx.create())["id"]
        await bound(runner, sid)
        sse, _ = await open_sse(ctx, sid)

        async def refuse_0_19(session_id: str, body: Any) -> None:
            runner.message_status = 409

        runner.on_event = refuse_0_19
        original = runner._respond

        async def respond(rid: str, status: int, body: Any = None) -> None:
            if status == 409:
                body = {"error": {"code": "conflict", "message": "no harness for this agent"}}
            await original(rid, status, body)

        runner._respond = respond  # type: ignore[method-assign]
        await ctx.message(sid, "hello")
        [failed] = await sse.wait_until(
            lambda: [e for _, k, e in sse.events if k == "session.delivery_failed"]
        )
        assert (failed["status"], failed["detail"]) == (409, "no harness for this agent")
