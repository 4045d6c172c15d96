"""The fakes of the fast suite agree with the real server (#13): they were written from a
0.11 capture and passed what 0.19.1 rejects. This module asks the installed server itself."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import trio

from corral.actors.gateway import SERVER_STREAM_TYPES
from tests import fake_tunnel_server

#: Prints the ``type`` tags of the server's client-stream union (server/schemas.py).
_STREAM_TAGS = """
import json, typing
from omnigent.server.schemas import ServerStreamEvent
union = typing.get_args(ServerStreamEvent)[0]
tags = set()
for model in typing.get_args(union):
    for tag in typing.get_args(model.model_fields["type"].annotation):
        tags.add(tag)
print(json.dumps(sorted(tags)))
"""

#: Prints, for each sample item, whether the server would persist it (the relay's parser).
_ITEMS = """
import json, sys
from omnigent.server.routes._sessions.helpers import _extract_persistent_item_from_sse
out = []
for item in json.load(sys.stdin):
    event = {"type": "response.output_item.done", "item": item}
    out.append(_extract_persistent_item_from_sse(event, "resp_1") is not None)
print(json.dumps(out))
"""

SAMPLE_ITEMS = [
    {
        "type": "function_call",
        "status": "completed",
        "name": "t",
        "arguments": "{}",
        "call_id": "c1",
        "agent": "a",
    },
    {
        "type": "function_call",
        "status": "completed",
        "name": "t",
        "arguments": "{}",
        "call_id": "c1",
    },
    {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "x"}],
        "agent": "a",
    },
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "x"}]},
    {"type": "function_call_output", "call_id": "c1", "output": "o"},
    {"type": "function_call_output", "output": "o"},
]


def _ask(venv: Path, program: str, stdin: str = "") -> object:
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", program],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_stream_vocabulary_is_the_server_s(omnigent_venv: Path) -> None:
    real = set(_ask(omnigent_venv, _STREAM_TAGS))
    assert len(real) >= 50
    assert set(SERVER_STREAM_TYPES) == real, "corral's gateway filter"
    assert set(fake_tunnel_server.ACCEPTED_STREAM_TYPES) == real, "the fake tunnel server"


def test_the_fake_persists_the_items_the_server_persists(omnigent_venv: Path) -> None:
    real = _ask(omnigent_venv, _ITEMS, json.dumps(SAMPLE_ITEMS))
    assert real == [True, False, True, False, True, False], "the samples still discriminate"
    fake = [fake_tunnel_server.item_violation(item) is None for item in SAMPLE_ITEMS]
    assert fake == real


EVALUATE_SAMPLES = [
    {"event": {"type": "PHASE_TOOL_CALL", "data": {"name": "sys_os_shell", "arguments": {}}}},
    {"event": {"type": "PHASE_TOOL_CALL", "data": {"arguments": {}}}},
    {"event": {"type": "PHASE_TOOL_RESULT", "data": {"name": "t", "output": "o"}}},
    {
        "event": {
            "type": "PHASE_TOOL_RESULT",
            "request_data": {"name": "t", "arguments": {}},
            "data": {"result": "o"},
        }
    },
    {"event": {"type": "PHASE_TOOL_RESULT", "target": "t", "data": {"result": "o"}}},
    {"event": {"type": "PHASE_LLM_REQUEST", "data": {"model": "m", "messages_count": 1}}},
    {"event": {"type": "PHASE_LLM_REQUEST", "data": "text"}},
    {"event": {"type": "PHASE_REQUEST", "data": "hello"}},
    {"event": {"type": "PHASE_NOPE", "data": {}}},
    {"nothing": 1},
]


async def test_the_fake_refuses_the_evaluate_bodies_the_server_refuses(stack) -> None:
    """The fake server's ``/policies/evaluate`` answers 400 exactly where the real one does
    (corral's PHASE_TOOL_RESULT body passed the fake and got 400 from the server)."""

    from tests.fake_server import evaluate_problem

    from ._stack import open_client

    async with open_client(stack.server.url, stack.runner_id) as client:
        session = await client.session("plain")
        real = []
        for body in EVALUATE_SAMPLES:
            r = await client.http.post(
                f"/v1/sessions/{session}/policies/evaluate", json=body, timeout=30
            )
            assert r.status_code in (200, 400), r.text
            real.append(r.status_code == 200)
    assert real[0] and not real[1], "the samples still discriminate"
    fake = [evaluate_problem(body) is None for body in EVALUATE_SAMPLES]
    assert fake == real


def _note(source_id: str) -> dict:
    return {
        "type": "external_conversation_item",
        "data": {
            "item_type": "message",
            "item_data": {"role": "user", "content": [{"type": "input_text", "text": "n"}]},
            "response_id": "cancel_" + "0" * 32,
            "source_id": source_id,
        },
    }


async def test_a_note_posted_twice_with_one_source_id_is_saved_once(stack) -> None:
    """The real server makes an ``external_conversation_item`` append idempotent by its
    ``source_id`` (dispatch relies on it to retry its interrupt note); so does the fake."""
    from tests.fake_server import FakeOmnigentServer

    from ._stack import open_client

    async with open_client(stack.server.url, stack.runner_id) as client:
        session = await client.session("plain", bind=False)
        for _ in range(2):
            r = await client.post(session, _note("note-1"))
            assert r.status_code == 202, r.text
        real = len(await client.items(session))
    fake = FakeOmnigentServer()
    fake.add_session("agent", session_id="s1")
    async with trio.open_nursery() as nursery:
        await fake.start(nursery)
        async with httpx.AsyncClient(base_url=fake.base_url) as http:
            for _ in range(2):
                r = await http.post("/v1/sessions/s1/events", json=_note("n1"))
                assert r.status_code == 202, r.text
        nursery.cancel_scope.cancel()
    assert real == len(fake.items["s1"]) == 1
