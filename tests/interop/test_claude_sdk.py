"""A ``harness: claude-sdk`` agent through the real omnigent server, corral as its runner:
Claude Code itself (the pinned CLI, ``cli_bin``) against the fake provider's Messages API
(#18). Its corral host finds the CLI, so it has a stack of its own."""

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
        with running_stack(omnigent_venv, tmp_path_factory.mktemp("claude-sdk")) as s:
            yield s


async def test_claude_codes_shell_command_is_approved_through_the_server_and_transcribed(
    client: Client, stack: Stack
) -> None:
    """The runner's hello offers ``claude-sdk`` (§L: the server routes a session only to a
    runner whose hello has the agent's canonical harness); Claude Code's permission request
    reaches the client as the server's elicitation, the client's accept runs the command,
    and the server's transcript holds Claude Code's own ``Bash`` call and its output (§E.1)."""
    runners = (await client.http.get("/v1/runners")).json()
    rows = runners.get("data", runners) if isinstance(runners, dict) else runners
    (runner,) = [r for r in rows if r["runner_id"] == stack.runner_id]
    assert "claude-sdk" in runner["harnesses"]
    session = await client.session("claudecode")
    stream = await client.open_stream(session)
    start = len(stream.events)
    await client.say(session, "write the file")
    _, ask = await stream.wait(
        lambda e: e.get("type") == "response.elicitation_request", after=start, timeout=60
    )
    assert not (stack.workspace / "claude.txt").exists()
    r = await client.resolve(session, ask["elicitation_id"], "accept")
    assert r.status_code < 300, r.text
    end, _ = await stream.wait(is_status("idle", "failed"), after=start, timeout=60)
    assert stream.events[end]["status"] == "idle", stream.events[end]
    assert "claude said:" in stream.text(start, end)
    assert (stack.workspace / "claude.txt").read_text() == "hello-from-claude\n"
    items = await client.wait_items(session, 4)
    kinds = [f"{i['type']}:{i.get('role') or i.get('name') or ''}" for i in items]
    assert kinds[:3] == ["message:user", "message:assistant", "function_call:Bash"], kinds
    call = items[2]
    assert call["model"] == "claudecode"
    assert json.loads(call["arguments"])["command"] == "echo hello-from-claude > claude.txt"
    (output,) = [i for i in items if i["type"] == "function_call_output"]
    assert output["call_id"] == call["call_id"]
    assert kinds[-1] == "message:assistant" and "claude said:" in json.dumps(items[-1])


async def test_an_agent_naming_claude_by_its_alias_runs_on_claude_code(client: Client) -> None:
    """``harness: claude`` is omnigent's alias of ``claude-sdk`` (§L): the server routes it to
    this runner and sends the spec as written; corral runs it as ``claude-sdk`` (it failed
    ``unknown_harness`` before)."""
    session = await client.session("claudealias")
    stream = await client.open_stream(session)
    start, end = await client.turn(stream, "hi")
    assert stream.events[end]["status"] == "idle", stream.events[end]
    assert stream.text(start, end) == "w0 w1 w2 w3 w4"
