"""The control plane's HTTP API answers bad input 4xx where it enters (issue #15, item 6).

The same rules as the runner's (``corral._input``): a body that is not UTF-8, holds a lone
surrogate escape or nests too deep is 400 ``invalid_json`` naming the reason; a session id in
a path that breaks :data:`~corral._input.SESSION_ID_RULE` is 400 ``invalid_session_id`` (not a
404 that says nothing of why); a message whose content is not text or a list of blocks is 422
(D-02). Each refusal is logged once (no traceback), nothing is stored or forwarded, and a good
message afterwards reaches the runner. The plane and its fake runner are those of
``test_control_plane.py``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from corral._input import MAX_JSON_DEPTH, SESSION_ID_RULE
from tests.integration.test_control_plane import ALPHA, bound, make_settings, running


@pytest.fixture
def agents_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "agents"
    directory.mkdir()
    (directory / "alpha.yaml").write_text(ALPHA)
    return directory


def message(content: bytes) -> bytes:
    return b'{"type": "message", "data": {"content": ' + content + b"}}"


async def test_d02_bad_bodies_and_session_ids_are_4xx_and_the_session_goes_on(
    tmp_path: Path, agents_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running(tmp_path / "state", make_settings(agents_dir)) as ctx:
        runner = await ctx.runner()
        sid = (await ctx.create())["id"]
        await bound(runner, sid)
        events = f"/v1/sessions/{sid}/events"

        async def refused(method: str, path: str, body: bytes | None = None) -> tuple[Any, ...]:
            answer = await ctx.client.request(method, path, content=body)
            payload = answer.json()
            return answer.status_code, payload["error"], payload["detail"]

        with caplog.at_level(logging.INFO, logger="corral.server.http"):
            nested = b"[" * 100_000 + b"]" * 100_000
            for path, body, why in [
                (events, message(nested), f"more than {MAX_JSON_DEPTH} levels deep"),
                ("/v1/sessions", b'{"agent": ' + nested + b"}", "levels deep"),
                (events, message(rb'"\ud800 alone"'), "lone UTF-16 surrogate"),
                (events, message(rb'[{"type": "input_text", "text": "\udfff"}]'), "surrogate"),
                (events, message(b'"\xff"'), "not valid UTF-8"),
            ]:
                status, slug, detail = await refused("POST", path, body)
                assert (status, slug) == (400, "invalid_json"), why
                assert why in detail
            for method, path in [
                ("GET", "/v1/sessions/a.b"),
                ("POST", "/v1/sessions/a.b/events"),
                ("GET", "/v1/sessions/%2e%2e/stream"),
                ("DELETE", "/v1/sessions/s%201"),
            ]:
                body = message(b'"hi"') if method == "POST" else None
                status, slug, detail = await refused(method, path, body)
                assert (status, slug) == (400, "invalid_session_id"), path
                assert SESSION_ID_RULE in detail
            status, slug, detail = await refused("POST", events, message(b"5"))
            assert (status, slug) == (422, "invalid_request")
            assert "content" in detail
        refusals = [r for r in caplog.records if "refused" in r.getMessage()]
        assert len(refusals) == 10, [r.getMessage() for r in refusals]
        assert all(r.levelno == logging.INFO and r.exc_info is None for r in refusals)
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]

        # Nothing of it was stored or forwarded; a good message goes through.
        assert runner.events_for(sid) == []
        assert (await ctx.snapshot(sid))["items_count"] == 0
        assert (await ctx.message(sid, "after")).status_code == 202
        [forwarded] = await runner.wait_until(lambda: runner.events_for(sid))
        assert forwarded["content"] == [{"type": "input_text", "text": "after"}]
