"""The ``claude-sdk`` kind through a real host: the real Claude Code CLI (``cli_bin``), offline
against the fake Anthropic Messages API on 127.0.0.1 (tests/fake_anthropic.py), driven by a
stand-in dispatch. H-04 (the stream's shape), E-01/E-02 (its permission requests as
elicitations), S-08 (a missing CLI), and the crash, interrupt and resume paths of
docs/harnesses.md, *claude-sdk*."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from corral.harnesses import availability
from corral.harnesses.protocol import Approval, InputAccepted, Interrupt, PolicyVerdict, ToolResult
from tests.conftest import HostProcess, wait_for
from tests.fake_anthropic import FakeAnthropic, Reply, error, message_events, text_reply
from tests.integration._dispatch import FakeDispatch, fake_dispatch

SHARE_HOST = True
#: The harness actor alone: a stand-in dispatch (``fake_dispatch``) drives it.
HOST_ACTORS = frozenset({"harness"})
KEY = "sk-ant-test-key"


@pytest.fixture(scope="module", autouse=True)
def _clis_reach_the_host(cli_bin: Path) -> Iterator[None]:
    """The module's host finds the pinned CLIs (CORRAL_CLI_PATH reaches its workers)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CORRAL_CLI_PATH", str(cli_bin))
        # A secret of the host's, which no worker or CLI may see.
        patch.setenv("HOST_SECRET_FOR_TEST", "s3cret-of-the-host")
        yield


def _spec(fake: FakeAnthropic, workdir: Path, **executor: Any) -> dict[str, Any]:
    auth = {"type": "api_key", "api_key": KEY, "base_url": f"{fake.base_url}/v1"}
    return {
        "name": "coder",
        "prompt": "Answer tersely.",
        "os_env": {"type": "caller_process", "cwd": str(workdir)},
        "executor": {"harness": "claude-sdk", "model": "claude-test", "auth": auth, **executor},
    }


def _tag(event: Any) -> str:
    return event.__struct_config__.tag


async def _answer_policies(d: FakeDispatch, session_id: str, tool_call: str = "ALLOW") -> None:
    """Stand in for the policy actor: ALLOW each model call, ``tool_call`` each tool call."""
    answered: set[str] = set()
    while True:
        event = await d.wait_for(
            lambda e: _tag(e) == "policy_evaluation.requested" and e.evaluation_id not in answered,
            timeout=600,
        )
        answered.add(event.evaluation_id)
        action = tool_call if event.phase == "PHASE_TOOL_CALL" else "ALLOW"
        verdict = PolicyVerdict(
            session_id=session_id,
            evaluation_id=event.evaluation_id,
            action=f"POLICY_ACTION_{action}",
            reason="no shells here" if action == "DENY" else None,
        )
        assert await d.send(verdict) == InputAccepted(status=204)


def _worker_pid(host: HostProcess, session_id: str) -> int:
    state = host.ask("inspect", actor="harness")["state"]
    (w,) = [w for w in state["workers"] if w["session_id"] == session_id]
    return int(w["pid"])


def _cli_pid(worker: int) -> int | None:
    """The worker's Claude Code (its one child)."""
    children: list[str] = []
    for task in Path(f"/proc/{worker}/task").iterdir():
        children += (task / "children").read_text().split()
    return int(children[0]) if children else None


async def _cli_of(host: HostProcess, session_id: str) -> int:
    worker = _worker_pid(host, session_id)
    pid: int = await wait_for(lambda: trio.to_thread.run_sync(_cli_pid, worker), "Claude Code")
    return pid


def _bash(command: str) -> Reply:
    call = ("toolu_1", "Bash", {"command": command, "description": "run it"})
    return Reply(frames=message_events(["On it. "], calls=[call]))


def _texts(request: Any) -> list[str]:
    """The text of each message a model request carried."""
    out = []
    for message in request.json["messages"]:
        content = message["content"]
        blocks = [{"text": content}] if isinstance(content, str) else content
        out.append(" ".join(str(b.get("text") or b.get("content") or "") for b in blocks))
    return out


async def test_h04_a_turn_streams_reasoning_and_text_then_completes_with_usage(
    host: HostProcess, nursery: trio.Nursery, tmp_path: Path
) -> None:
    fake = FakeAnthropic()
    await fake.start(nursery)
    fake.queue(
        Reply(frames=message_events(["Hel", "lo"], thinking=["let me ", "see"], usage=(30, 7))),
        text_reply("Again.", usage=(50, 3)),
    )
    spec = _spec(fake, tmp_path)
    async with fake_dispatch(host.endpoint) as d:
        nursery.start_soon(_answer_policies, d, "s-plain")
        turn = await d.start_turn("s-plain", spec, "say hello")
        end = await d.terminal(turn, timeout=60)
        assert _tag(end) == "response.completed", end
        types = d.types(turn)
        assert types[:2] == ["response.created", "response.in_progress"]
        assert types[-1] == "response.completed"
        assert types.index("runtime_model") < types.index("response.reasoning_text.delta")
        assert types.index("response.reasoning_text.delta") < types.index(
            "response.output_text.delta"
        )
        events = d.of_turn(turn)
        assert "".join(e.delta for e in events if _tag(e) == "response.output_text.delta") == (
            "Hello"
        )
        assert "".join(e.delta for e in events if _tag(e) == "response.reasoning_text.delta") == (
            "let me see"
        )
        (observed,) = [e for e in events if _tag(e) == "runtime_model"]
        assert (observed.model, observed.provider) == ("claude-fake-1", "127.0.0.1")
        assert end.response["usage"] == {
            "input_tokens": 30,
            "output_tokens": 7,
            "total_tokens": 37,
            "context_tokens": 37,
            "model": "claude-fake-1",
        }
        assert end.response["model"] == "coder"
        cli = await _cli_of(host, "s-plain")

        # The next turn goes to the same Claude Code, which holds the conversation.
        turn2 = await d.start_turn("s-plain", spec, "again")
        assert _tag(await d.terminal(turn2, timeout=60)) == "response.completed"
        assert await _cli_of(host, "s-plain") == cli

    first, second = fake.requests
    assert first.path == "/v1/messages?beta=true"
    assert first.headers["x-api-key"] == KEY
    assert first.json["model"] == "claude-test"
    assert "Answer tersely." in json.dumps(first.json["system"])
    assert "Hello" in _texts(second)[-2] and _texts(second)[-1].endswith("again")
    # Its environment: the session's own home, the key, offline; nothing else of the worker's.
    environ = dict(
        line.split("=", 1)
        for line in Path(f"/proc/{cli}/environ").read_text().split("\0")
        if "=" in line
    )
    assert environ["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert environ["ANTHROPIC_API_KEY"] == KEY
    assert environ["HOME"].startswith(str(host.state_dir))
    assert not [k for k in environ if k.startswith(("HARNESS_", "CORRAL_"))]
    assert "s3cret-of-the-host" not in Path(f"/proc/{cli}/environ").read_text()
    assert Path(f"/proc/{cli}/cwd").resolve() == tmp_path.resolve()


async def _bash_turn(
    host: HostProcess,
    nursery: trio.Nursery,
    workdir: Path,
    session_id: str,
    *,
    answer: str | None,
    tool_call: str = "ALLOW",
) -> tuple[FakeDispatch, str, FakeAnthropic]:
    """A turn whose model runs ``echo hi > out.txt`` in Claude Code's Bash; the person
    ``answer``s the permission elicitation (None: none may be asked), the policy actor
    answers ``tool_call``. The command has not run before the answer."""
    fake = FakeAnthropic()
    await fake.start(nursery)
    fake.queue(_bash("echo hi > out.txt"), text_reply("Done."))
    async with fake_dispatch(host.endpoint) as d:
        nursery.start_soon(_answer_policies, d, session_id, tool_call)
        turn = await d.start_turn(session_id, _spec(fake, workdir), "write it")
        if answer is not None:
            asked = await d.wait_type("response.elicitation_request", timeout=60)
            tool = asked.params["tool"]
            assert (tool["name"], tool["arguments"]["command"]) == ("Bash", "echo hi > out.txt")
            assert not (workdir / "out.txt").exists()
            rows = await trio.to_thread.run_sync(host.elicitations, asked.elicitation_id)
            mine = [r["state"] for r in rows if r["elicitation_id"] == asked.elicitation_id]
            assert mine == ["parked"]
            verdict = Approval(
                session_id=session_id, elicitation_id=asked.elicitation_id, action=answer
            )
            assert await d.send(verdict, durable=True) == InputAccepted(status=204)
        end = await d.terminal(turn, timeout=60)
        assert _tag(end) == "response.completed", end
    return d, turn, fake


async def test_e01_a_shell_command_is_asked_and_runs_once_accepted(
    host: HostProcess, nursery: trio.Nursery, tmp_path: Path
) -> None:
    d, turn, _ = await _bash_turn(host, nursery, tmp_path, "s-accept", answer="accept")
    assert (tmp_path / "out.txt").read_text() == "hi\n"
    items = [e.item for e in d.of_turn(turn) if _tag(e) == "response.output_item.done"]
    calls = [(i["type"], i.get("status"), i.get("agent")) for i in items if i["type"] != "message"]
    assert calls == [
        ("function_call", "in_progress", None),
        ("function_call", "completed", "coder"),
        ("function_call_output", None, None),
    ]
    assert items[1]["call_id"] == "toolu_1" and items[1]["name"] == "Bash"
    assert json.loads(items[1]["arguments"])["command"] == "echo hi > out.txt"
    assert "Done." in "".join(getattr(e, "delta", "") for e in d.of_turn(turn))


async def test_e02_a_declined_command_does_not_run_and_the_model_is_told(
    host: HostProcess, nursery: trio.Nursery, tmp_path: Path
) -> None:
    _, _, fake = await _bash_turn(host, nursery, tmp_path, "s-decline", answer="decline")
    assert not (tmp_path / "out.txt").exists()
    result = fake.requests[-1].json["messages"][-1]["content"][0]
    assert (result["type"], result["is_error"]) == ("tool_result", True)
    assert "declined" in json.dumps(result["content"])


async def test_a_policy_deny_refuses_the_command_without_asking(
    host: HostProcess, nursery: trio.Nursery, tmp_path: Path
) -> None:
    d, turn, fake = await _bash_turn(
        host, nursery, tmp_path, "s-deny", answer=None, tool_call="DENY"
    )
    assert "response.elicitation_request" not in d.types(turn)
    (denied,) = [e for e in d.of_turn(turn) if _tag(e) == "response.policy_denied"]
    assert (denied.reason, denied.phase) == ("no shells here", "tool_call")
    assert not (tmp_path / "out.txt").exists()
    result = fake.requests[-1].json["messages"][-1]["content"][0]
    assert result["is_error"] is True and "no shells here" in json.dumps(result["content"])


async def test_runner_tools_reach_claude_code_over_mcp_and_run_through_the_runner(
    host: HostProcess, nursery: trio.Nursery, tmp_path: Path
) -> None:
    fake = FakeAnthropic()
    await fake.start(nursery)
    call = ("toolu_9", "mcp__corral__sys_os_read", {"path": "notes.txt"})
    fake.queue(Reply(frames=message_events(calls=[call])), text_reply("Read it."))
    async with fake_dispatch(host.endpoint) as d:
        nursery.start_soon(_answer_policies, d, "s-mcp")
        spec = _spec(fake, tmp_path)
        tools = [
            {
                "type": "function",
                "name": "sys_os_read",
                "description": "Read a file.",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
            }
        ]
        turn = await d.start_turn("s-mcp", spec, "read notes", tools=tools)
        asked = await d.wait_for(
            lambda e: getattr(e, "item", {}).get("status") == "action_required", timeout=60
        )
        assert asked.item["name"] == "sys_os_read"
        assert json.loads(asked.item["arguments"]) == {"path": "notes.txt"}
        result = ToolResult(session_id="s-mcp", call_id=asked.item["call_id"], output="the notes")
        assert await d.send(result) == InputAccepted(status=204)
        end = await d.terminal(turn, timeout=60)
        assert _tag(end) == "response.completed", end
    offered = [t["name"] for t in fake.requests[0].json["tools"]]
    assert "mcp__corral__sys_os_read" in offered
    answer = fake.requests[-1].json["messages"][-1]["content"][0]
    assert answer["tool_use_id"] == "toolu_9" and "the notes" in json.dumps(answer["content"])


@pytest.mark.chaos
async def test_kill9_of_claude_code_mid_turn_fails_it_and_the_next_turn_resumes(
    host: HostProcess, nursery: trio.Nursery, tmp_path: Path
) -> None:
    fake = FakeAnthropic()
    await fake.start(nursery)
    fake.queue(text_reply("First."), Reply(frames=message_events(["par", "tial"]), hang_after=3))
    fake.queue(text_reply("Back."))
    spec = _spec(fake, tmp_path)
    async with fake_dispatch(host.endpoint) as d:
        nursery.start_soon(_answer_policies, d, "s-kill")
        assert _tag(await d.terminal(await d.start_turn("s-kill", spec, "one"), 60)) == (
            "response.completed"
        )
        turn = await d.start_turn("s-kill", spec, "two")
        await d.wait_for(
            lambda e: e.turn_id == turn and _tag(e) == "response.output_text.delta", 60
        )
        cli = await _cli_of(host, "s-kill")
        os.kill(cli, signal.SIGKILL)
        with trio.fail_after(5):
            end = await d.terminal(turn)
        assert _tag(end) == "response.failed"
        assert end.error["code"] == "harness_crashed"
        assert "killed by signal 9" in end.error["message"]
        turn3 = await d.start_turn("s-kill", spec, "three")
        assert _tag(await d.terminal(turn3, 60)) == "response.completed"
        assert await _cli_of(host, "s-kill") != cli
    # The new Claude Code resumed the session: the first turn's answer is in its history.
    assert "First." in " ".join(_texts(fake.requests[-1]))


async def test_an_interrupt_ends_claude_codes_turn_and_the_next_turn_goes_on(
    host: HostProcess, nursery: trio.Nursery, tmp_path: Path
) -> None:
    fake = FakeAnthropic()
    await fake.start(nursery)
    fake.queue(Reply(frames=message_events(["stop ", "me"]), hang_after=3), text_reply("Next."))
    spec = _spec(fake, tmp_path)
    async with fake_dispatch(host.endpoint) as d:
        nursery.start_soon(_answer_policies, d, "s-int")
        turn = await d.start_turn("s-int", spec, "one")
        await d.wait_type("response.output_text.delta", 60)
        cli = await _cli_of(host, "s-int")
        assert await d.send(Interrupt(session_id="s-int")) == InputAccepted(status=204)
        end = await d.terminal(turn)
        assert _tag(end) == "response.cancelled"
        with trio.fail_after(10):
            await fake.requests[0].closed.wait()  # Claude Code let go of the model call
        turn2 = await d.start_turn("s-int", spec, "two")
        assert _tag(await d.terminal(turn2, 60)) == "response.completed"
        assert await _cli_of(host, "s-int") == cli  # the same process took the next turn


@pytest.mark.chaos
async def test_history_survives_a_worker_restart(
    host: HostProcess, nursery: trio.Nursery, tmp_path: Path
) -> None:
    fake = FakeAnthropic()
    await fake.start(nursery)
    fake.queue(text_reply("Remembered: blue."), text_reply("It was blue."))
    spec = _spec(fake, tmp_path)
    async with fake_dispatch(host.endpoint) as d:
        nursery.start_soon(_answer_policies, d, "s-restart")
        turn = await d.start_turn("s-restart", spec, "my colour is blue")
        assert _tag(await d.terminal(turn, 60)) == "response.completed"
        worker = _worker_pid(host, "s-restart")
        os.kill(worker, signal.SIGKILL)
        await wait_for(
            lambda: trio.to_thread.run_sync(lambda: not Path(f"/proc/{worker}").exists()),
            "the worker gone",
        )
        # The history the turn carries says nothing of the first turn: only the CLI's own
        # session, resumed from the session's home, can know it.
        turn2 = await d.start_turn("s-restart", spec, "what colour?")
        assert _tag(await d.terminal(turn2, 60)) == "response.completed"
        assert _worker_pid(host, "s-restart") != worker
    texts = _texts(fake.requests[-1])
    assert "my colour is blue" in " ".join(texts) and "Remembered: blue." in " ".join(texts)


async def test_a_fresh_home_is_seeded_with_the_turns_history(
    host: HostProcess, nursery: trio.Nursery, tmp_path: Path
) -> None:
    fake = FakeAnthropic()
    await fake.start(nursery)
    fake.queue(text_reply("Green, you said."))
    history = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "green"}]},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Noted: green."}],
        },
    ]
    async with fake_dispatch(host.endpoint) as d:
        nursery.start_soon(_answer_policies, d, "s-seed")
        turn = await d.start_turn("s-seed", _spec(fake, tmp_path), "which?", history=history)
        assert _tag(await d.terminal(turn, 60)) == "response.completed"
    sent = " ".join(_texts(fake.requests[0]))
    assert "User: green" in sent and "Assistant: Noted: green." in sent and "which?" in sent


async def test_a_provider_error_fails_the_turn_and_the_next_turn_goes_on(
    host: HostProcess, nursery: trio.Nursery, tmp_path: Path
) -> None:
    fake = FakeAnthropic()
    await fake.start(nursery)
    # Claude Code tries a call again even on a 401, max_retries times: none here.
    fake.queue(error(401, "invalid x-api-key"), text_reply("Fine now."))
    spec = _spec(fake, tmp_path, max_retries=0)
    async with fake_dispatch(host.endpoint) as d:
        nursery.start_soon(_answer_policies, d, "s-401")
        end = await d.terminal(await d.start_turn("s-401", spec, "one"), 60)
        assert _tag(end) == "response.failed"
        assert end.error["code"] == "provider_error"
        assert "Invalid API key" in end.error["message"]
        assert "(HTTP 401 from 127.0.0.1)" in end.error["message"]
        assert KEY not in end.error["message"]
        cli = await _cli_of(host, "s-401")
        turn2 = await d.start_turn("s-401", spec, "two")
        assert _tag(await d.terminal(turn2, 60)) == "response.completed"
        assert await _cli_of(host, "s-401") == cli  # a clean end: the CLI stays


async def test_a_silent_claude_code_fails_the_turn_at_its_idle_timeout(
    host: HostProcess, nursery: trio.Nursery, tmp_path: Path
) -> None:
    """The provider holds its answer: Claude Code writes nothing, and the turn fails
    ``timeout`` after ``idle_timeout_s`` instead of hanging; the next turn starts a new CLI,
    which resumes the session."""
    fake = FakeAnthropic()
    await fake.start(nursery)
    fake.queue(Reply(frames=message_events(["never"]), hang_after=0), text_reply("Awake."))
    spec = _spec(fake, tmp_path, idle_timeout_s=4)
    async with fake_dispatch(host.endpoint) as d:
        nursery.start_soon(_answer_policies, d, "s-idle")
        turn = await d.start_turn("s-idle", spec, "one")
        await wait_for(lambda: trio.to_thread.run_sync(lambda: bool(fake.requests)), "a call")
        cli = await _cli_of(host, "s-idle")
        with trio.fail_after(15):
            end = await d.terminal(turn)
        assert (end.error["code"], end.error["message"]) == (
            "timeout",
            "no output from Claude Code for 4s",
        )
        with trio.fail_after(10):
            await fake.requests[0].closed.wait()  # the CLI, ended, let go of the call
        turn2 = await d.start_turn("s-idle", spec, "two")
        assert _tag(await d.terminal(turn2, 60)) == "response.completed"
        assert await _cli_of(host, "s-idle") != cli


async def test_a_model_override_restarts_claude_code_on_the_same_conversation(
    host: HostProcess, nursery: trio.Nursery, tmp_path: Path
) -> None:
    fake = FakeAnthropic()
    await fake.start(nursery)
    fake.queue(text_reply("One."), text_reply("Two."))
    spec = _spec(fake, tmp_path)
    async with fake_dispatch(host.endpoint) as d:
        nursery.start_soon(_answer_policies, d, "s-model")
        assert _tag(await d.terminal(await d.start_turn("s-model", spec, "one"), 60)) == (
            "response.completed"
        )
        turn = await d.start_turn("s-model", spec, "two", model_override="claude-other")
        assert _tag(await d.terminal(turn, 60)) == "response.completed"
    first, second = fake.requests
    assert (first.json["model"], second.json["model"]) == ("claude-test", "claude-other")
    assert "One." in " ".join(_texts(second))


async def test_s08_a_missing_cli_fails_the_turn_at_once(
    host_factory: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("CORRAL_CLI_PATH")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    host = host_factory().start()
    fake = FakeAnthropic()
    async with fake_dispatch(host.endpoint) as d:
        turn = await d.start_turn("s-missing", _spec(fake, tmp_path), "hi")
        with trio.fail_after(15):
            end = await d.terminal(turn)
    assert end.error["code"] == "harness_unavailable"
    assert "'claude' CLI" in end.error["message"]
    assert "npm install -g @anthropic-ai/claude-code@" in end.error["message"]
    # Nor does the hello offer the kind (PROTOCOL_0_19 §L).
    assert "claude" in (availability(["claude-sdk"])["claude-sdk"] or "")
