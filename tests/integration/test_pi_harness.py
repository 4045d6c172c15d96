"""The ``pi`` kind through a real host: the real pi CLI (``pi --mode rpc``, from ``cli_bin``,
on the Node 22 beside it) against a fake Chat Completions API on 127.0.0.1 (H-04, H-12,
S-08). Its crashes are in ``test_pi_crashes.py``."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from corral.harnesses import availability
from corral.harnesses.protocol import InputAccepted, Interrupt, ToolResult
from tests.conftest import HostProcess
from tests.fake_anthropic import FakeAnthropic, message_events
from tests.fake_openai import FakeOpenAI, Reply, chat_events, error
from tests.integration._codex import (
    answering,
    children,
    codex_on_path,  # noqa: F401 - a fixture (autouse): the pinned CLIs on the hosts' path
    descendants,
    eventually,
    fake_llm,  # noqa: F401 - a fixture (llm)
    gone,
    items_of,
    text_of,
)
from tests.integration._dispatch import FakeDispatch, fake_dispatch

#: The tests share one host (tests/conftest.py); each runs its own session ids.
SHARE_HOST = True
#: The harness actor alone: a stand-in dispatch (``fake_dispatch``) drives it.
HOST_ACTORS = frozenset({"harness"})

MODEL = "pi-fake"
KEY = "sk-test-pi-key"


def agent_spec(llm: FakeOpenAI, **executor: Any) -> dict[str, Any]:
    auth = {"type": "api_key", "api_key": KEY, "base_url": llm.base_url}
    return {
        "name": "coder",
        "prompt": "Be terse.",
        "executor": {"harness": "pi", "model": MODEL, "auth": auth, **executor},
    }


def answer_text(deltas: list[str], model: str = MODEL) -> Reply:
    return Reply(frames=chat_events(model, deltas))


def answer_command(command: str, call_id: str = "call_1") -> Reply:
    args = json.dumps({"command": command})
    return Reply(frames=chat_events(MODEL, calls=[(call_id, "bash", args)]))


def answer_hanging(deltas: list[str]) -> Reply:
    """A model answer that streams ``deltas`` and then says nothing until the client goes."""
    return Reply(frames=chat_events(MODEL, deltas), hang_after=1 + len(deltas))


def said(request: Any) -> list[str]:
    """The texts of the user and assistant messages a Chat Completions request carries."""
    texts = []
    for message in request.json["messages"]:
        if message["role"] not in ("user", "assistant"):
            continue
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
        else:
            texts += [p.get("text", "") for p in content or [] if p.get("type") == "text"]
    return texts


async def pi_pid(host: HostProcess, session_id: str) -> int:
    """The session's worker's pi CLI (Node names its process after the script: ``pi`` or
    ``node``), once the worker and the CLI are there."""

    def found() -> int | None:
        state = host.ask("inspect", actor="harness")["state"]
        workers = [w for w in state["workers"] if w["session_id"] == session_id and w["pid"]]
        if not workers:
            return None
        kids = children(int(workers[0]["pid"]))
        return next((p for p, name in kids if name in ("pi", "node")), None)

    return await eventually(found, "the worker's pi CLI")


async def test_h04_a_plain_turn_streams_pi_reasoning_and_text_with_usage_and_runtime_model(
    host: HostProcess, llm: FakeOpenAI
) -> None:
    thought = ["thinking ", "hard"]
    llm.queue(Reply(frames=chat_events(MODEL, ["Hel", "lo"], reasoning=thought)))
    async with fake_dispatch(host.endpoint) as d, answering(d, "s-pi-plain"):
        turn = await d.start_turn("s-pi-plain", agent_spec(llm), "say hello")
        end = await d.terminal(turn, timeout=60)

    assert end.__struct_config__.tag == "response.completed", end
    types = d.types(turn)
    # H-04's shape: created first, completed last, text deltas between.
    assert (types[0], types[-1]) == ("response.created", "response.completed")
    assert types.count("response.output_text.delta") == 2
    assert types.index("runtime_model") < types.index("response.output_text.delta")
    assert text_of(d, turn) == "Hello"
    reasoned = [
        e.delta for e in d.of_turn(turn) if e.__struct_config__.tag.endswith("ing_text.delta")
    ]
    assert reasoned == thought
    assert types.index("response.reasoning_text.delta") < types.index("response.output_text.delta")
    observed = next(e for e in d.of_turn(turn) if e.__struct_config__.tag == "runtime_model")
    assert (observed.model, observed.provider) == (MODEL, "127.0.0.1")
    assert end.response["usage"] == {
        "input_tokens": 10,
        "output_tokens": 5,
        "total_tokens": 15,
        "context_tokens": 15,
        "model": MODEL,
    }
    (message,) = [i for i in items_of(d, turn) if i["type"] == "message"]
    assert (message["agent"], message["content"][0]["text"]) == ("coder", "Hello")
    (request,) = llm.requests
    assert (request.path, request.json["model"]) == ("/v1/chat/completions", MODEL)
    assert request.headers["authorization"] == f"Bearer {KEY}"
    system = request.json["messages"][0]
    assert system["role"] == "system" and "Be terse." in system["content"]
    assert said(request)[-1] == "say hello"


async def test_pi_speaks_the_anthropic_messages_api_to_an_endpoint_that_does(
    host: HostProcess, nursery: trio.Nursery
) -> None:
    """``api: anthropic-messages``: pi calls ``/v1/messages`` under the ``base_url`` (given
    without ``/v1``) with the key; thinking and text are relayed as from any provider."""
    claude = FakeAnthropic()
    await claude.start(nursery)
    claude.queue(Reply(frames=message_events(["Hi ", "there"], thinking=["hmm"], model=MODEL)))
    auth = {"type": "api_key", "api_key": KEY, "base_url": claude.base_url}
    spec = {"name": "coder", "executor": {"harness": "pi", "model": MODEL, "auth": auth}}
    spec["executor"]["api"] = "anthropic-messages"
    async with fake_dispatch(host.endpoint) as d, answering(d, "s-pi-anthropic"):
        turn = await d.start_turn("s-pi-anthropic", spec, "hello")
        end = await d.terminal(turn, timeout=60)
    assert end.__struct_config__.tag == "response.completed", end
    assert text_of(d, turn) == "Hi there"
    reasoned = [
        e.delta for e in d.of_turn(turn) if e.__struct_config__.tag.endswith("ing_text.delta")
    ]
    assert reasoned == ["hmm"]
    (request,) = claude.requests
    assert request.path.split("?")[0] == "/v1/messages"
    assert request.headers["x-api-key"] == KEY
    assert end.response["usage"]["input_tokens"] == 10


async def test_h12_each_session_has_its_own_pi_dir_under_the_state_dir_with_corrals_files(
    host: HostProcess, llm: FakeOpenAI
) -> None:
    """H-12: the CLI's home is the session's own, under the host's state dir, with corral's
    provider (the key in the 0600 file only), its gate extension and the instructions."""
    llm.queue(answer_text(["ok"]))
    async with fake_dispatch(host.endpoint) as d, answering(d, "s-pi-home"):
        turn = await d.start_turn("s-pi-home", agent_spec(llm))
        assert (await d.terminal(turn, timeout=60)).__struct_config__.tag == "response.completed"
    (models,) = host.state_dir.glob("**/s-pi-home/.pi/agent/models.json")
    provider = json.loads(models.read_text())["providers"]["corral"]
    assert provider == {
        "baseUrl": llm.base_url,
        "api": "openai-completions",
        "apiKey": KEY,
        "models": [{"id": MODEL, "name": MODEL}],
    }
    assert oct(models.stat().st_mode & 0o777) == "0o600"
    assert oct(models.parent.stat().st_mode & 0o777) == "0o700"
    assert "ctx.ui.confirm" in (models.parent / "corral-gate.ts").read_text()
    assert (models.parent / "corral-instructions.md").read_text() == "Be terse."


async def _command_turn(
    host: HostProcess, llm: FakeOpenAI, session_id: str, command: str, **answers: str
) -> tuple[FakeDispatch, str, list[Any]]:
    """A turn whose model runs ``command`` then says "done", answered as ``answers`` say."""
    llm.queue(answer_command(command), answer_text(["done"]))
    async with fake_dispatch(host.endpoint) as d, answering(d, session_id, **answers) as asked:
        turn = await d.start_turn(session_id, agent_spec(llm), "write the file")
        end = await d.terminal(turn, timeout=60)
    assert end.__struct_config__.tag == "response.completed", end
    assert text_of(d, turn) == "done"
    return d, turn, asked


async def test_an_accepted_command_asks_a_person_then_runs_in_the_session_workdir(
    host: HostProcess, llm: FakeOpenAI
) -> None:
    d, turn, asked = await _command_turn(
        host, llm, "s-pi-accept", "echo made-by-pi > out.txt; env > env.txt; pwd"
    )
    # Policy first (the model call, then the command), then the person.
    assert [getattr(a, "phase", "elicitation") for a in asked] == [
        "PHASE_LLM_REQUEST",
        "PHASE_TOOL_CALL",
        "elicitation",
    ]
    params = asked[-1].params
    assert (params["tool"]["name"], params["tool"]["call_id"]) == ("bash", "call_1")
    assert params["tool"]["arguments"]["command"].startswith("echo made-by-pi > out.txt;")
    items = items_of(d, turn)
    calls = [i for i in items if i["type"] == "function_call"]
    assert [(c["name"], c["status"]) for c in calls] == [
        ("bash", "in_progress"),
        ("bash", "completed"),
    ]
    assert calls[1]["agent"] == "coder" and calls[1]["call_id"] == "call_1"
    (output,) = [i for i in items if i["type"] == "function_call_output"]
    assert output["call_id"] == "call_1"
    workdir = Path(output["output"].strip())
    assert (workdir / "out.txt").read_text() == "made-by-pi\n"
    assert workdir.is_relative_to(host.state_dir)  # the session's own working directory
    # The provider's key is in pi's models.json only: a command sees neither it nor
    # corral's variables in its environment.
    env = (workdir / "env.txt").read_text()
    assert KEY not in env and "HARNESS_" not in env and "CORRAL_" not in env
    assert "PI_OFFLINE=1" in env
    # The command's output went back to the model, which said its last word.
    sent = llm.requests[1].json["messages"]
    assert any(m["role"] == "tool" and m.get("tool_call_id") == "call_1" for m in sent)


async def test_a_declined_command_does_not_run_and_the_model_is_told(
    host: HostProcess, llm: FakeOpenAI
) -> None:
    d, turn, asked = await _command_turn(
        host, llm, "s-pi-decline", "echo nope > declined.txt", person="decline"
    )
    assert asked[-1].__struct_config__.tag == "response.elicitation_request"
    (output,) = [i for i in items_of(d, turn) if i["type"] == "function_call_output"]
    assert "did not allow this tool call" in output["output"]
    assert not list(host.state_dir.glob("**/declined.txt"))
    (told,) = [m for m in llm.requests[1].json["messages"] if m["role"] == "tool"]
    assert "did not allow" in json.dumps(told)


async def test_a_policy_deny_refuses_a_command_without_asking_anyone(
    host: HostProcess, llm: FakeOpenAI
) -> None:
    d, turn, asked = await _command_turn(
        host, llm, "s-pi-deny", "echo nope > denied.txt", tool_call="DENY"
    )
    assert [a.__struct_config__.tag for a in asked] == ["policy_evaluation.requested"] * 2
    (denied,) = [e for e in d.of_turn(turn) if e.__struct_config__.tag == "response.policy_denied"]
    assert (denied.phase, denied.reason) == ("tool_call", "no shell here")
    assert not list(host.state_dir.glob("**/denied.txt"))


async def test_a_read_only_tool_call_is_put_to_policy_but_no_person_is_asked(
    host: HostProcess, llm: FakeOpenAI
) -> None:
    args = json.dumps({"path": "/etc/hostname"})
    llm.queue(
        Reply(frames=chat_events(MODEL, calls=[("call_r", "read", args)])), answer_text(["read"])
    )
    session = "s-pi-read"
    async with fake_dispatch(host.endpoint) as d, answering(d, session) as asked:
        turn = await d.start_turn(session, agent_spec(llm), "which host?")
        end = await d.terminal(turn, timeout=60)
    assert end.__struct_config__.tag == "response.completed", end
    assert [a.phase for a in asked] == ["PHASE_LLM_REQUEST", "PHASE_TOOL_CALL"]
    assert asked[1].data["name"] == "read" and asked[1].data["call_id"] == "call_r"
    (output,) = [i for i in items_of(d, turn) if i["type"] == "function_call_output"]
    assert Path("/etc/hostname").read_text().strip() in output["output"]


async def test_an_interrupt_stops_pi_and_the_command_it_runs_and_the_cli_lives_on(
    host: HostProcess, llm: FakeOpenAI
) -> None:
    """The interrupted turn ends ``response.cancelled``; pi's ``abort`` ends the command it
    was running, and the same CLI takes the next turn."""
    llm.queue(answer_command("sleep 60; echo late > late.txt"), answer_text(["after"]))
    session = "s-pi-interrupt"
    async with fake_dispatch(host.endpoint) as d, answering(d, session):
        turn = await d.start_turn(session, agent_spec(llm), "run it")
        pi = await pi_pid(host, session)
        command = await eventually(
            lambda: [p for p, name in descendants(pi) if name == "sleep"], "the command running"
        )
        assert await d.send(Interrupt(session_id=session)) == InputAccepted(status=204)
        end = await d.terminal(turn, timeout=30)
        assert end.__struct_config__.tag == "response.cancelled"
        await eventually(lambda: all(map(gone, command)), "the command ended")
        assert await pi_pid(host, session) == pi
        again = await d.start_turn(session, agent_spec(llm), "go on")
        assert (await d.terminal(again, timeout=60)).__struct_config__.tag == "response.completed"
    assert text_of(d, again) == "after"
    assert not list(host.state_dir.glob("**/late.txt"))


async def test_an_interrupt_while_pi_waits_for_a_person_ends_the_turn_and_its_question(
    host: HostProcess, llm: FakeOpenAI
) -> None:
    """pi settles nothing while a dialog is open: the interrupt dismisses the question, so
    the abort goes through and the call never runs."""
    llm.queue(answer_command("echo never > never.txt"), answer_text(["next"]))
    session = "s-pi-interrupt-asking"
    async with fake_dispatch(host.endpoint) as d, answering(d, session, person=""):
        turn = await d.start_turn(session, agent_spec(llm), "run it")
        asked = await d.wait_type("response.elicitation_request", turn_id=turn, timeout=60)
        assert await d.send(Interrupt(session_id=session)) == InputAccepted(status=204)
        end = await d.terminal(turn, timeout=30)
        assert end.__struct_config__.tag == "response.cancelled"
        rows = host.ask("elicitations")["elicitations"]
        (row,) = [r for r in rows if r["elicitation_id"] == asked.elicitation_id]
        assert row["state"] != "parked"
        again = await d.start_turn(session, agent_spec(llm), "go on")
        end = await d.terminal(again, timeout=60)
        assert end.__struct_config__.tag == "response.completed", end
    assert text_of(d, again) == "next"
    assert not list(host.state_dir.glob("**/never.txt"))


async def test_a_provider_error_fails_the_turn_with_what_pi_reports(
    host: HostProcess, llm: FakeOpenAI
) -> None:
    llm.queue(error(400, "model pi-fake does not exist"))
    async with fake_dispatch(host.endpoint) as d, answering(d, "s-pi-400"):
        turn = await d.start_turn("s-pi-400", agent_spec(llm))
        end = await d.terminal(turn, timeout=60)
    assert end.__struct_config__.tag == "response.failed"
    assert end.error["code"] == "provider_error"
    assert "model pi-fake does not exist" in end.error["message"]


async def test_d11_a_model_override_reaches_pi_and_the_conversation_goes_on(
    host: HostProcess, llm: FakeOpenAI
) -> None:
    """A model override starts a CLI for that model, which is given the history."""
    llm.queue(answer_text(["one"]), answer_text(["two"], model="pi-other"))
    session = "s-pi-override"
    history = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "one"}],
        },
    ]
    async with fake_dispatch(host.endpoint) as d, answering(d, session):
        first = await d.start_turn(session, agent_spec(llm), "hi")
        await d.terminal(first, timeout=60)
        second = await d.start_turn(
            session, agent_spec(llm), "again", history=history, model_override="pi-other"
        )
        end = await d.terminal(second, timeout=60)
    assert end.__struct_config__.tag == "response.completed", end
    assert [r.json["model"] for r in llm.requests] == [MODEL, "pi-other"]
    observed = [e.model for e in d.of_turn(second) if e.__struct_config__.tag == "runtime_model"]
    assert observed == ["pi-other"] and end.response["usage"]["model"] == "pi-other"
    assert "User: hi\n\nAssistant: one" in said(llm.requests[1])[-1]


SHELL_TOOL = {
    "type": "function",
    "function": {
        "name": "sys_os_shell",
        "description": "Run a shell command in the session's environment.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
    },
}


async def test_the_runners_tools_are_offered_to_pi_and_run_by_the_runner(
    host: HostProcess, llm: FakeOpenAI
) -> None:
    """The turn's ``tools`` are tools of corral's extension: the model sees them beside pi's
    own, and a call of one is the runner's (``action_required``, answered by dispatch; its
    policy, not the gate's person), its output going back to the model."""
    call = ("call_rt", "sys_os_shell", json.dumps({"command": "uname"}))
    llm.queue(
        Reply(frames=chat_events(MODEL, calls=[call])), answer_text(["the runner says Linux"])
    )
    session = "s-pi-runner-tools"
    async with fake_dispatch(host.endpoint) as d, answering(d, session) as asked:
        turn = await d.start_turn(session, agent_spec(llm), "which OS?", tools=[SHELL_TOOL])
        wanted = await d.wait_for(
            lambda e: getattr(e, "item", {}).get("status") == "action_required", timeout=60
        )
        assert (wanted.item["name"], json.loads(wanted.item["arguments"])) == (
            "sys_os_shell",
            {"command": "uname"},
        )
        result = ToolResult(session_id=session, call_id=wanted.item["call_id"], output="Linux")
        assert await d.send(result) == InputAccepted(status=204)
        end = await d.terminal(turn, timeout=60)
    assert end.__struct_config__.tag == "response.completed", end
    first, second = llm.requests
    offered = {t["function"]["name"]: t["function"] for t in first.json["tools"]}
    assert {"sys_os_shell", "bash", "read"} <= set(offered)
    assert offered["sys_os_shell"]["parameters"]["properties"] == {"command": {"type": "string"}}
    (told,) = [m for m in second.json["messages"] if m["role"] == "tool"]
    assert told["tool_call_id"] == "call_rt" and "Linux" in json.dumps(told)
    # The runner's call is shown once, as every kind shows it (no pi item on top), and no
    # person was asked: the model call's policy question counted the tool.
    calls = [i for i in items_of(d, turn) if i["type"] == "function_call"]
    assert [c["status"] for c in calls] == ["in_progress", "action_required", "completed"]
    assert [(a.phase, a.data["tools_count"]) for a in asked] == [("PHASE_LLM_REQUEST", 1)]
    assert text_of(d, turn) == "the runner says Linux"


async def test_s08_without_the_pi_cli_a_turn_fails_at_once_naming_the_npm_package(
    host_factory: Callable[..., HostProcess],
    monkeypatch: pytest.MonkeyPatch,
    llm: FakeOpenAI,
) -> None:
    """S-08's shape: the CLI, and how to install it; the kind is not offered (§L)."""
    monkeypatch.delenv("CORRAL_CLI_PATH")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert "'pi' CLI" in (availability(["pi"])["pi"] or "")
    host = host_factory().start()
    async with fake_dispatch(host.endpoint) as d:
        turn = await d.start_turn("s-pi-missing", agent_spec(llm))
        end = await d.terminal(turn, timeout=10)
    assert end.__struct_config__.tag == "response.failed"
    assert end.error["code"] == "harness_unavailable"
    assert "needs the 'pi' CLI on PATH" in end.error["message"]
    assert "npm install -g @earendil-works/pi-coding-agent@1.6.0" in end.error["message"]
    assert llm.requests == []


async def test_a_pi_that_cannot_start_fails_the_turn_at_once_harness_unavailable(
    host_factory: Callable[..., HostProcess],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    llm: FakeOpenAI,
) -> None:
    """A CLI that exits before answering anything (here a stand-in for pi on a Node too
    old for it) fails the turn ``harness_unavailable`` with its exit, never a hang."""
    broken = tmp_path / "bin" / "pi"
    broken.parent.mkdir()
    broken.write_text("#!/bin/sh\necho 'pi needs Node.js >= 22.19' >&2\nexit 3\n")
    broken.chmod(0o755)
    monkeypatch.setenv("CORRAL_CLI_PATH", str(broken.parent))
    host = host_factory().start()
    async with fake_dispatch(host.endpoint) as d, answering(d, "s-pi-broken"):
        turn = await d.start_turn("s-pi-broken", agent_spec(llm))
        end = await d.terminal(turn, timeout=30)
    assert end.__struct_config__.tag == "response.failed"
    assert end.error["code"] == "harness_unavailable"
    # Its input or its output is found closed first, whichever the worker touches first.
    message = end.error["message"]
    assert message.startswith("the pi CLI ended: pi "), message
    assert message.endswith("(exit code 3): pi needs Node.js >= 22.19"), message
    assert llm.requests == []


def test_pi_is_offered_where_its_cli_is_found() -> None:
    assert os.environ.get("CORRAL_CLI_PATH")
    assert availability(["pi"]) == {"pi": None}
