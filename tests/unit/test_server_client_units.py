"""Units of the runner → server client: headers, held evaluations, error text."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from corral import __version__
from corral._server_answers import detail as _detail
from corral.server_client import ServerClient


def test_the_actors_zygote_builds_the_tls_context_every_server_client_uses(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """#20: loading the CA bundle costs ~17 ms of CPU and ~1.5 MB a client; the host's
    zygote builds the context once (a preload item every actor shares) and the server clients
    of dispatch, policy and tools build none. An environment naming other CA files gets its
    own."""
    from corral import _tls
    from corral._zygote._template import preload
    from corral.actors._actor_specs import actor_preload
    from corral.config import parse_config

    item = "corral._tls:DEFAULT_CONTEXT"
    assert item in actor_preload(parse_config({}))
    real, built = httpx.create_ssl_context, []
    monkeypatch.setattr(httpx, "create_ssl_context", lambda: built.append(1) or real())
    monkeypatch.setattr(_tls, "_contexts", {})
    for name in ("SSL_CERT_FILE", "SSL_CERT_DIR"):
        monkeypatch.delenv(name, raising=False)

    preload(item)  # in the zygote, before any actor is forked
    assert len(built) == 1
    clients = [ServerClient("https://omnigent.example", token="t") for _ in range(3)]
    assert len(built) == 1
    # Each client's connection pool holds the one context (httpx keeps it there).
    contexts = {id(client._http._transport._pool._ssl_context) for client in clients}
    assert contexts == {id(_tls.default_context())}

    monkeypatch.setenv("SSL_CERT_DIR", str(tmp_path))
    ServerClient("https://omnigent.example", token="t")
    assert len(built) == 2


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
