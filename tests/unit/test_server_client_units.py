"""Units of the runner → server client: headers, held evaluations, error text."""

from __future__ import annotations

import json

import httpx
import pytest

from corral import __version__
from corral._server_answers import detail as _detail
from corral.server_client import ServerClient


async def test_every_call_says_it_is_corral_and_held_evaluations_wait_a_day() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"result": "POLICY_ACTION_ALLOW"})

    client = ServerClient("http://server", token="t", transport=httpx.MockTransport(answer))
    async with client:
        event = {"event": {"type": "PHASE_LLM_REQUEST", "data": {}}}
        await client.evaluate_policy("s1", event, held=True)
        await client.evaluate_policy("s1", event)
    assert [r.headers["user-agent"] for r in seen] == [f"corral-runner/{__version__}"] * 2
    assert [r.extensions["timeout"]["read"] for r in seen] == [86400.0, 30.0]
    assert json.loads(seen[0].content) == event


@pytest.mark.parametrize(
    ("body", "text"),
    [
        (b'{"error": {"code": "invalid_input", "message": "no tool name"}}', "no tool name"),
        (b'{"error": {"code": "not_found"}}', "not_found"),
        (b'{"error": "not_found", "detail": "no route GET /x"}', "no route GET /x"),
        (b'{"error": "busy"}', "busy"),
        (b'{"detail": "Not Found"}', "Not Found"),
        (b'{"detail": [{"loc": ["body"], "msg": "bad"}]}', '[{"loc":["body"],"msg":"bad"}]'),
        (b"", "(empty body)"),
        (b"upstream   down", "upstream down"),
    ],
)
def test_error_text_is_read_from_both_error_shapes(body: bytes, text: str) -> None:
    assert _detail(body) == text


async def test_a_session_s_file_is_read_from_the_0_19_route() -> None:
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        return httpx.Response(200, content=b"hi", headers={"content-type": "text/plain"})

    async with ServerClient("http://server", transport=httpx.MockTransport(answer)) as client:
        assert await client.file_content("f1", session_id="s1") == (b"hi", "text/plain")
        assert await client.file_content("f1") == (b"hi", "text/plain")
    assert seen == ["/v1/sessions/s1/resources/files/f1/content", "/v1/files/f1/content"]
