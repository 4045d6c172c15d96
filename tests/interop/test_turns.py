"""A user's turns through the real omnigent server, with corral as the runner (#13).

Each test drives a session through the server's client API and checks what a user of the
server sees — the client stream, the saved transcript — and, through the fake LLM's log, what
corral gave the model. The ``client`` fixture fails a test whose client stream broke or whose
server logged a problem caused by corral.
"""

from __future__ import annotations

import json
from pathlib import Path

import trio

from ._stack import Client, Stream, is_status


def _user_texts(body: dict) -> list[str]:
    texts = []
    for item in body.get("input") or []:
        if isinstance(item, dict) and item.get("role") == "user":
            content = item.get("content")
            if isinstance(content, str):
                texts.append(content)
            else:
                texts.extend(p.get("text", "") for p in content or [] if isinstance(p, dict))
    return texts


async def test_a_plain_turn_streams_to_the_client_and_is_saved_once(client: Client) -> None:
    """The client's stream carries the whole turn (deltas, completed, idle) — corral-only
    event types such as ``runtime_model`` used to cut it after ``response.in_progress`` —
    and the server saves the answer as one assistant item, with the agent's name."""
    session = await client.session("plain")
    stream = await client.open_stream(session)
    start, end = await client.turn(stream, "hello there")
    types = stream.types(start, end + 1)
    assert "response.in_progress" in types
    assert stream.text(start, end) == "w0 w1 w2 w3 w4"
    assert "response.completed" in types
    items = await client.items(session)
    assert [(i["type"], i.get("role")) for i in items] == [
        ("message", "user"),
        ("message", "assistant"),
    ]
    assert items[1]["content"][0]["text"] == "w0 w1 w2 w3 w4"
    assert items[1]["model"] == "plain"
    assert stream.statuses(start) == ["running", "idle"]


async def test_a_retried_model_call_reaches_the_client_as_response_retry(client: Client) -> None:
    """The provider answers 429 once: corral's worker retries and says so with
    ``response.retry``, which the real server validates (its RetryEvent) and relays to the
    client without cutting its stream; the turn then completes."""
    session = await client.session("flaky")
    stream = await client.open_stream(session)
    start, end = await client.turn(stream, "try me")
    [retry] = [e for e in stream.events[start:end] if e.get("type") == "response.retry"]
    assert (retry["source"], retry["attempt"], retry["max_attempts"]) == ("llm", 2, 5)
    assert retry["delay_seconds"] == 0.2
    assert retry["error"]["message"].endswith("returned HTTP 429: slow down")
    assert stream.text(start, end) == "w0 w1 w2 w3 w4"
    assert stream.statuses(start) == ["running", "idle"]


async def test_the_second_turn_is_given_the_first(client: Client, stack) -> None:
    session = await client.session("history")
    stream = await client.open_stream(session)
    await client.turn(stream, "first")
    start, end = await client.turn(stream, "second")
    assert stream.text(start, end) == "users=2 first | second"
    items = await client.items(session)
    assert [i.get("role") for i in items] == ["user", "assistant", "user", "assistant"]


async def test_usage_reaches_the_server_as_the_session_model(client: Client) -> None:
    """``response.completed.usage.model`` makes the server publish ``session.model``
    (PROTOCOL_0_19.md §D.3)."""
    session = await client.session("plain")
    stream = await client.open_stream(session)
    start, _ = await client.turn(stream, "usage please")
    _, model = await stream.wait(lambda e: e.get("type") == "session.model", after=start)
    assert model["model"] == "plain"


async def test_a_message_mid_turn_is_its_own_turn(client: Client, stack) -> None:
    """§E.3: the second message is saved as its own reply, after the first turn's; the
    session goes running → running → idle, and the second LLM call sees the first answer."""
    session = await client.session("slow")
    stream = await client.open_stream(session)
    start = len(stream.events)
    await client.say(session, "one")
    await stream.wait(lambda e: e.get("type") == "response.output_text.delta", after=start)
    await client.say(session, "two")
    first, _ = await stream.wait(is_status("running"), after=start)
    await stream.wait(is_status("idle", "failed"), after=first + 1, timeout=60)
    assert stream.statuses(start) == ["running", "running", "idle"]
    items = await client.items(session)
    assert [(i.get("role"), _text(i)[:2]) for i in items] == [
        ("user", "on"),
        ("user", "tw"),
        ("assistant", "s0"),
        ("assistant", "s0"),
    ]
    calls = [b for b in stack.llm.requests("slow") if _user_texts(b)[-1:] == ["two"]]
    assert calls, "the second message reached the model"
    roles = [i.get("role") for i in calls[-1]["input"] if isinstance(i, dict)]
    assert roles[-3:] == ["user", "assistant", "user"]


def _text(item: dict) -> str:
    return "".join(p.get("text", "") for p in item.get("content") or [] if isinstance(p, dict))


async def _interrupted(client: Client, stack, event_type: str) -> tuple[str, Stream]:
    session = await client.session("slow")
    stream = await client.open_stream(session)
    start = len(stream.events)
    await client.say(session, "go on")
    await stream.wait(lambda e: e.get("type") == "response.output_text.delta", after=start)
    r = await client.post(session, {"type": event_type})
    assert r.status_code == 202, r.text
    end, _ = await stream.wait(is_status("idle", "failed"), after=start)
    assert stream.events[end]["status"] == "idle"
    return session, stream


async def test_an_interrupt_is_recorded_as_omnigent_records_it(client: Client, stack) -> None:
    """§E.4: no partial answer is saved; an ``[System: interrupted]`` note is, and the next
    LLM call is given [user, note, user]."""
    session, stream = await _interrupted(client, stack, "interrupt")
    await client.wait_items(session, 2)
    items = await client.items(session)
    assert [i.get("role") for i in items] == ["user", "user"]
    assert _text(items[1]).startswith("[System: interrupted]")
    await client.turn(stream, "and now")
    last = stack.llm.requests("slow")[-1]
    texts = _user_texts(last)
    assert texts[0] == "go on" and texts[-1] == "and now"
    assert texts[1].startswith("[System: interrupted]")


async def test_stop_session_is_recorded_like_an_interrupt(client: Client, stack) -> None:
    session, _ = await _interrupted(client, stack, "stop_session")
    await client.wait_items(session, 2)
    items = await client.items(session)
    assert [i.get("role") for i in items] == ["user", "user"]
    assert _text(items[1]).startswith("[System: interrupted]")


async def test_an_llm_request_policy_on_the_server_can_stop_a_turn(
    client: Client, stack, server_log
) -> None:
    """§F.4: corral asks the server at PHASE_LLM_REQUEST before the model is called, so a
    server-side policy that denies the request stops the turn on corral too."""
    # The server logs the failed turn it relays (its ERROR record names the policy's code).
    server_log.allow(r"session turn failed .*code=policy_denied")
    session = await client.session("llmguard")
    stream = await client.open_stream(session)
    start, end = await client.turn(stream, "say something forbidden")
    assert not [b for b in stack.llm.requests("echo") if "forbidden" in str(_user_texts(b))]
    assert "echo:" not in stream.text(start, end)
    start, end = await client.turn(stream, "say something nice")
    assert "say something nice" in stream.text(start, end)


async def test_omnigent_s_own_client_sdk_streams_the_whole_turn(stack, server_log) -> None:
    """The official SDK's stream (``omnigent_client``) is what broke for users: it ended
    after ``response.in_progress`` and the next request failed."""
    done = await trio.run_process(
        [
            str(stack.server.venv / "bin" / "python"),
            str(Path(__file__).parent / "sdk_turn.py"),
            stack.server.url,
            stack.runner_id,
            "plain",
            "hi from the sdk",
        ],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    result = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert result["ended_early"] is None, result
    assert result["text"] == "w0 w1 w2 w3 w4"
    assert "response.completed" in result["types"]


async def test_a_directory_format_agent_runs_unchanged(client: Client, stack) -> None:
    """omnigent's directory bundle (``spec_version: 1``, ``executor.type: omnigent`` with the
    harness under ``executor.config``) runs on corral as the server hands it over."""
    session = await client.session("team")
    stream = await client.open_stream(session)
    start, end = await client.turn(stream, "hello team")
    assert stream.text(start, end) == "echo: hello team"
    body = stack.llm.requests("echo")[-1]
    assert body["instructions"].startswith("You lead a team.")
