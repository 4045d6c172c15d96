"""Tool calls through the real omnigent server: transcripts, approvals, tool policies (#13)."""

from __future__ import annotations

import json

from ._stack import Client, is_status


def _types(items: list[dict]) -> list[str]:
    return [f"{i['type']}:{i.get('role') or i.get('name') or ''}" for i in items]


async def test_a_tool_call_and_its_output_are_both_in_the_transcript(client: Client) -> None:
    """The ``function_call`` item carries ``agent`` (the server drops it otherwise and keeps
    only the output, PROTOCOL_0_19.md §E.1)."""
    session = await client.session("tool")
    stream = await client.open_stream(session)
    start, end = await client.turn(stream, "run it")
    assert "hello-from-tool" in stream.text(start, end)
    items = await client.wait_items(session, 4)
    assert _types(items) == [
        "message:user",
        "function_call:sys_os_shell",
        "function_call_output:",
        "message:assistant",
    ]
    call, output = items[1], items[2]
    assert call["model"] == "tool"
    assert json.loads(call["arguments"]) == {"command": "echo hello-from-tool"}
    assert call["call_id"] == output["call_id"]
    shell = json.loads(output["output"])
    assert shell["stdout"] == "hello-from-tool\n" and shell["exit_code"] == 0


async def test_sys_os_read_answers_in_omnigent_s_shape(client: Client, stack) -> None:
    """§G.6: ``{path (absolute), content, encoding, offset, limit, returned_lines,
    total_lines, truncated}``."""
    session = await client.session("toolread")
    stream = await client.open_stream(session)
    await client.turn(stream, "read it")
    items = await client.wait_items(session, 4)
    output = json.loads(items[2]["output"])
    assert output["path"] == str(stack.workspace / "hello.txt")
    assert output["content"].startswith("hello from the workspace file")
    assert output["encoding"] == "utf-8"
    assert (output["offset"], output["total_lines"], output["returned_lines"]) == (1, 1, 1)
    assert output["truncated"] is False and output["limit"] >= 1


async def test_a_tool_result_policy_on_the_server_is_evaluated(client: Client, stack) -> None:
    """PHASE_TOOL_RESULT reaches the server in the shape it validates (§F.2): its DENY
    withholds the output from the model. The server rejected corral's body with 400 before,
    and corral allowed the result."""
    session = await client.session("resultguard")
    stream = await client.open_stream(session)
    start, end = await client.turn(stream, "run it")
    second = [b for b in stack.llm.requests("tool") if _has_output(b)][-1]
    outputs = [i["output"] for i in second["input"] if i.get("type") == "function_call_output"]
    assert outputs and all("hello-from-tool" not in o for o in outputs)
    assert "hello-from-tool" not in stream.text(start, end)


def _has_output(body: dict) -> bool:
    return any(
        isinstance(i, dict) and i.get("type") == "function_call_output"
        for i in body.get("input") or []
    )


async def _approval(client: Client, action: str) -> tuple[str, list[dict], str]:
    session = await client.session("ask")
    stream = await client.open_stream(session)
    start = len(stream.events)
    await client.say(session, "run it")
    _, ask = await stream.wait(
        lambda e: e.get("type") == "response.elicitation_request", after=start
    )
    r = await client.resolve(session, ask["elicitation_id"], action)
    assert r.status_code < 300, r.text
    end, _ = await stream.wait(is_status("idle", "failed"), after=start, timeout=60)
    return session, await client.items(session), stream.text(start, end)


async def test_an_approved_tool_runs(client: Client) -> None:
    """The server's own ASK gate (the agent's top-level ``policies:``) parks the call and
    forwards ``cost_approval_popup``, which corral answers 204 as omnigent's runner does
    for a non-native harness (§C.3; it answered 422 before)."""
    _, items, text = await _approval(client, "accept")
    outputs = [i for i in items if i["type"] == "function_call_output"]
    assert outputs and "hello-from-tool" in outputs[0]["output"]
    assert "tool said:" in text


async def test_a_declined_tool_does_not_run(client: Client) -> None:
    _, items, text = await _approval(client, "decline")
    assert not any(
        "hello-from-tool\\n" in i.get("output", "")
        for i in items
        if i["type"] == "function_call_output"
    )
    assert "hello-from-tool" not in text
