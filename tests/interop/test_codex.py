"""A ``harness: codex`` agent through the real omnigent server, corral as its runner: the
Codex CLI itself (the pinned CLI, ``cli_bin``, driven through ``codex app-server``) against the
fake provider's Responses API (#18). Its corral host finds the CLI, so it has a stack of its
own."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from ._stack import Client, is_status
from .conftest import Stack, running_stack


@pytest.fixture(scope="module")
def stack(
    omnigent_venv: Path, cli_bin: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CORRAL_CLI_PATH", str(cli_bin))
        with running_stack(omnigent_venv, tmp_path_factory.mktemp("codex")) as s:
            yield s


async def test_the_runners_hello_offers_codex(client: Client, stack: Stack) -> None:
    """§L: the server routes a ``codex`` session only to a runner whose hello has it. (The
    module's stack starts with this test: its cost is not the next one's.)"""
    runners = (await client.http.get("/v1/runners")).json()
    rows = runners.get("data", runners) if isinstance(runners, dict) else runners
    (runner,) = [r for r in rows if r["runner_id"] == stack.runner_id]
    assert "codex" in runner["harnesses"]


async def test_codexs_command_is_approved_through_the_server_and_transcribed(
    client: Client, stack: Stack
) -> None:
    """Codex's command approval reaches the client as the server's elicitation, the client's
    accept runs the command in the workspace, and the server's transcript holds Codex's
    ``exec_command`` call and its output (§E.1)."""
    session = await client.session("codexcmd")
    stream = await client.open_stream(session)
    start = len(stream.events)
    await client.say(session, "write the file")
    _, ask = await stream.wait(
        lambda e: e.get("type") == "response.elicitation_request", after=start, timeout=60
    )
    assert not (stack.workspace / "codex.txt").exists()
    r = await client.resolve(session, ask["elicitation_id"], "accept")
    assert r.status_code < 300, r.text
    end, _ = await stream.wait(is_status("idle", "failed"), after=start, timeout=60)
    assert stream.events[end]["status"] == "idle", stream.events[end]
    assert "codex said:" in stream.text(start, end)
    assert (stack.workspace / "codex.txt").read_text() == "hello-from-codex\n"
    items = await client.wait_items(session, 4)
    kinds = [f"{i['type']}:{i.get('role') or i.get('name') or ''}" for i in items]
    assert kinds[:2] == ["message:user", "function_call:exec_command"], kinds
    call = items[1]
    assert call["model"] == "codexcmd"
    arguments = json.loads(call["arguments"])
    assert "echo hello-from-codex > codex.txt" in arguments["command"]
    assert arguments["cwd"] == str(stack.workspace)
    (output,) = [i for i in items if i["type"] == "function_call_output"]
    assert output["call_id"] == call["call_id"]
    assert kinds[-1] == "message:assistant" and "codex said:" in json.dumps(items[-1])
