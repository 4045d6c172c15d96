"""A ``harness: pi`` agent through the real omnigent server, corral as its runner: the pi
coding agent itself (the pinned CLI, ``cli_bin``, on the Node 22 beside it, in its RPC mode)
against the fake provider's Chat Completions API (#18). Its corral host finds the CLI, so it
has a stack of its own."""

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
        with running_stack(omnigent_venv, tmp_path_factory.mktemp("pi")) as s:
            yield s


async def test_pis_command_is_approved_through_the_server_and_transcribed(
    client: Client, stack: Stack
) -> None:
    """The runner's hello offers ``pi`` (§L); pi's tool call, put to corral by its gate
    extension, reaches the client as the server's elicitation, the client's accept runs the
    command in the workspace, and the server's transcript holds pi's own ``bash`` call and
    its output (§E.1)."""
    runners = (await client.http.get("/v1/runners")).json()
    rows = runners.get("data", runners) if isinstance(runners, dict) else runners
    (runner,) = [r for r in rows if r["runner_id"] == stack.runner_id]
    assert "pi" in runner["harnesses"]
    session = await client.session("picmd")
    stream = await client.open_stream(session)
    start = len(stream.events)
    await client.say(session, "write the file")
    _, ask = await stream.wait(
        lambda e: e.get("type") == "response.elicitation_request", after=start, timeout=60
    )
    assert not (stack.workspace / "pi.txt").exists()
    r = await client.resolve(session, ask["elicitation_id"], "accept")
    assert r.status_code < 300, r.text
    end, _ = await stream.wait(is_status("idle", "failed"), after=start, timeout=60)
    assert stream.events[end]["status"] == "idle", stream.events[end]
    assert "pi said:" in stream.text(start, end)
    assert (stack.workspace / "pi.txt").read_text() == "hello-from-pi\n"
    items = await client.wait_items(session, 4)
    kinds = [f"{i['type']}:{i.get('role') or i.get('name') or ''}" for i in items]
    assert kinds[:2] == ["message:user", "function_call:bash"], kinds
    call = items[1]
    assert call["model"] == "picmd"
    assert json.loads(call["arguments"]) == {"command": "echo hello-from-pi > pi.txt"}
    (output,) = [i for i in items if i["type"] == "function_call_output"]
    assert output["call_id"] == call["call_id"]
    assert kinds[-1] == "message:assistant" and "pi said:" in json.dumps(items[-1])
