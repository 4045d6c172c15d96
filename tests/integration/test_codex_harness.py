"""The ``codex`` kind through a real host: the real Codex CLI (``codex app-server``, from
``cli_bin``) against a fake Responses API on 127.0.0.1 (H-04, H-12, H-13, S-08). Its crashes
are in ``test_codex_crashes.py``."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from corral.harnesses import availability
from corral.harnesses.protocol import Approval, InputAccepted, Interrupt, ToolResult
from tests.conftest import HostProcess
from tests.fake_openai import FakeOpenAI, Reply, error, responses_events
from tests.integration._codex import (
    KEY,
    MODEL,
    agent_spec,
    answer_command,
    answer_hanging,
    answer_text,
    answering,
    codex_on_path,  # noqa: F401 - a fixture (autouse)
    codex_pid,
    descendants,
    eventually,
    fake_llm,  # noqa: F401 - a fixture (llm)
    gone,
    input_texts,
    items_of,
    text_of,
    worker_pid,
)
from tests.integration._dispatch import FakeDispatch, fake_dispatch

#: The tests share one host (tests/conftest.py); each runs its own session ids.
SHARE_HOST = True
#: The harness actor alone: a stand-in dispatch (``fake_dispatch``) drives it.
HOST_ACTORS = frozenset({"harness"})


async def test_h04_a_plain_turn_streams_codex_reasoning_and_text_with_usage_and_runtime_model(
    host: HostProcess, llm: FakeOpenAI
) -> None:
    thought = ["thinking ", "hard"]
    llm.queue(Reply(frames=responses_events(MODEL, ["Hel", "lo"], added=True, reasoning=thought)))
    async with fake_dispatch(host.endpoint) as d, answering(d, "s-cx-plain"):
        turn = await d.start_turn("s-cx-plain", agent_spec(llm), "say hello")
        end = await d.terminal(turn, timeout=30)

    assert end.__struct_config__.tag == "response.completed", end
    types = d.types(turn)
    # H-04's shape: created first, completed last, text deltas between.
    assert (types[0], types[-1]) == ("response.created", "response.completed")
    assert "response.output_text.delta" in types
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
    assert (request.path, request.json["model"]) == ("/v1/responses", MODEL)
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert "Be terse." in json.dumps(request.json["input"])
    assert input_texts(request)[-1] == "say hello"


async def test_h12_each_session_has_a_codex_home_under_the_state_dir_with_corrals_config(
    host: HostProcess, llm: FakeOpenAI
) -> None:
    """H-12: the CLI's home is the session's own, under the host's state dir (a test's host
    has its own), with corral's config: the fake provider, offline, no key in the file."""
    llm.queue(answer_text(["ok"]))
    async with fake_dispatch(host.endpoint) as d, answering(d, "s-cx-home"):
        turn = await d.start_turn("s-cx-home", agent_spec(llm))
        assert (await d.terminal(turn, timeout=30)).__struct_config__.tag == "response.completed"
    (config,) = host.state_dir.glob("**/s-cx-home/.codex/config.toml")
    text = config.read_text()
    assert 'model_provider = "corral"' in text
    assert f'base_url = "{llm.base_url}"' in text
    assert "[analytics]\nenabled = false" in text and "[features]\nplugins = false" in text
    assert KEY not in text
    assert oct(config.parent.stat().st_mode & 0o777) == "0o700"
    assert (config.parent / "corral-thread.json").exists()


async def _command_turn(
    host: HostProcess,
    llm: FakeOpenAI,
    session_id: str,
    cmd: str,
    **answers: str,
) -> tuple[FakeDispatch, str, list[Any]]:
    """A turn whose model runs ``cmd`` then says "done", answered as ``answers`` say."""
    llm.queue(answer_command(cmd), answer_text(["done"]))
    async with fake_dispatch(host.endpoint) as d, answering(d, session_id, **answers) as asked:
        turn = await d.start_turn(session_id, agent_spec(llm), "write the file")
        end = await d.terminal(turn, timeout=30)
    assert end.__struct_config__.tag == "response.completed", end
    return d, turn, asked


async def test_an_accepted_command_asks_a_person_then_runs_in_the_session_workdir(
    host: HostProcess, llm: FakeOpenAI
) -> None:
    d, turn, asked = await _command_turn(
        host,
        llm,
        "s-cx-accept",
        "echo made-by-codex > out.txt; env > env.txt; cat /proc/*/environ > proc.txt",
    )
    # Policy first (the model call, then the command), then the person.
    assert [getattr(a, "phase", "elicitation") for a in asked] == [
        "PHASE_LLM_REQUEST",
        "PHASE_TOOL_CALL",
        "elicitation",
    ]
    params = asked[-1].params
    assert params["tool"]["name"] == "exec_command"
    assert "echo made-by-codex > out.txt;" in params["tool"]["arguments"]["command"]
    items = items_of(d, turn)
    calls = [i for i in items if i["type"] == "function_call"]
    assert [c["status"] for c in calls] == ["in_progress", "completed"]
    assert calls[1]["agent"] == "coder" and calls[1]["name"] == "exec_command"
    (output,) = [i for i in items if i["type"] == "function_call_output"]
    assert output["call_id"] == calls[0]["call_id"] == "call_1"
    workdir = Path(json.loads(calls[0]["arguments"])["cwd"])
    assert (workdir / "out.txt").read_text() == "made-by-codex\n"
    # The provider's key is the CLI's alone: a command sees neither it nor corral's variables,
    env = (workdir / "env.txt").read_text()
    assert KEY not in env and "HARNESS_" not in env and "CORRAL_" not in env
    assert f"HOME={host.state_dir}" in env
    # Nor can it read it from the CLI's own environment: the sandbox shows it its own
    # processes only.
    seen = (workdir / "proc.txt").read_bytes()
    assert b"CODEX_HOME=" in seen or b"CODEX_SESSION_ID=" in seen
    assert KEY.encode() not in seen and b"CODEX_PROVIDER_API_KEY" not in seen
    # The command's output went back to the model, which said its last word.
    sent = llm.requests[1].json["input"]
    assert any(i.get("type") == "function_call_output" and i["call_id"] == "call_1" for i in sent)
    assert text_of(d, turn) == "done"


async def test_a_declined_command_does_not_run_and_the_model_is_told(
    host: HostProcess, llm: FakeOpenAI
) -> None:
    d, turn, asked = await _command_turn(
        host, llm, "s-cx-decline", "echo nope > declined.txt", person="decline"
    )
    assert asked[-1].__struct_config__.tag == "response.elicitation_request"
    calls = [i for i in items_of(d, turn) if i["type"] == "function_call"]
    workdir = Path(json.loads(calls[0]["arguments"])["cwd"])
    assert not (workdir / "declined.txt").exists()
    (output,) = [i for i in items_of(d, turn) if i["type"] == "function_call_output"]
    assert output["output"].startswith("declined")
    (told,) = [
        i
        for i in llm.requests[1].json["input"]
        if i.get("call_id") == "call_1" and i["type"] == "function_call_output"
    ]
    assert "reject" in json.dumps(told).lower()


async def test_a_policy_deny_refuses_a_command_without_asking_anyone(
    host: HostProcess, llm: FakeOpenAI
) -> None:
    d, turn, asked = await _command_turn(
        host, llm, "s-cx-deny", "echo nope > denied.txt", tool_call="DENY"
    )
    assert [a.__struct_config__.tag for a in asked] == ["policy_evaluation.requested"] * 2
    (denied,) = [e for e in d.of_turn(turn) if e.__struct_config__.tag == "response.policy_denied"]
    assert (denied.phase, denied.reason) == ("tool_call", "no shell here")
    calls = [i for i in items_of(d, turn) if i["type"] == "function_call"]
    workdir = Path(json.loads(calls[0]["arguments"])["cwd"])
    assert not (workdir / "denied.txt").exists()


async def test_h13_an_interrupt_stops_codex_and_the_command_it_left_running(
    host: HostProcess, llm: FakeOpenAI
) -> None:
    """H-13: codex is a scaffold harness, so its interrupted turn ends ``response.cancelled``
    (what S-51 delivers to a parent). Nothing of the turn keeps running: Codex itself leaves
    a command it has put in the background (here after 250 ms) running when its turn is
    interrupted."""
    background = json.dumps({"cmd": "sleep 60; echo late > late.txt", "yield_time_ms": 250})
    llm.queue(
        Reply(frames=responses_events(MODEL, calls=[("call_1", "exec_command", background)])),
        answer_hanging(["waiting for it"]),  # the model's next call, with the command running
        answer_text(["after"]),
    )
    session = "s-cx-interrupt"
    async with fake_dispatch(host.endpoint) as d, answering(d, session):
        turn = await d.start_turn(session, agent_spec(llm), "run it")
        await d.wait_type("response.output_text.delta", turn_id=turn, timeout=30)
        codex = await codex_pid(host, session)
        # Through Codex's sandbox helper and bwrap, in sessions of their own.
        command = await eventually(
            lambda: [p for p, name in descendants(codex) if name in ("bash", "sleep")],
            "the command running",
        )
        assert await d.send(Interrupt(session_id=session)) == InputAccepted(status=204)
        end = await d.terminal(turn, timeout=15)
        assert end.__struct_config__.tag == "response.cancelled"
        await eventually(lambda: all(map(gone, command)), "the command ended")
        # The CLI lives on for the next turn.
        assert await codex_pid(host, session) == codex
        again = await d.start_turn(session, agent_spec(llm), "go on")
        assert (await d.terminal(again, timeout=30)).__struct_config__.tag == "response.completed"
    assert text_of(d, again) == "after"


async def test_s08_without_the_codex_cli_a_turn_fails_at_once_naming_the_npm_package(
    host_factory: Callable[..., HostProcess],
    monkeypatch: pytest.MonkeyPatch,
    llm: FakeOpenAI,
) -> None:
    """S-08's shape: the CLI, and how to install it; the kind is not offered (§L)."""
    monkeypatch.delenv("CORRAL_CLI_PATH")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert "'codex' CLI" in (availability(["codex"])["codex"] or "")
    host = host_factory().start()
    async with fake_dispatch(host.endpoint) as d:
        turn = await d.start_turn("s-cx-missing", agent_spec(llm))
        end = await d.terminal(turn, timeout=10)
    assert end.__struct_config__.tag == "response.failed"
    assert end.error["code"] == "harness_unavailable"
    assert "needs the 'codex' CLI on PATH" in end.error["message"]
    assert "npm install -g @openai/codex@" in end.error["message"]
    assert llm.requests == []


async def test_a_provider_error_fails_the_turn_with_what_codex_reports(
    host: HostProcess, llm: FakeOpenAI
) -> None:
    llm.queue(error(400, "model gpt-fake does not exist"))
    async with fake_dispatch(host.endpoint) as d, answering(d, "s-cx-400"):
        turn = await d.start_turn("s-cx-400", agent_spec(llm))
        end = await d.terminal(turn, timeout=30)
    assert end.__struct_config__.tag == "response.failed"
    assert end.error["code"] == "provider_error"
    assert end.error["message"] == "codex: model gpt-fake does not exist (other)"


async def test_an_interrupt_while_codex_waits_for_a_person_ends_the_turn_and_its_question(
    host: HostProcess, llm: FakeOpenAI
) -> None:
    llm.queue(answer_command("echo never > never.txt"), answer_text(["next"]))
    session = "s-cx-interrupt-asking"
    async with fake_dispatch(host.endpoint) as d, answering(d, session, person=""):
        turn = await d.start_turn(session, agent_spec(llm), "run it")
        asked = await d.wait_type("response.elicitation_request", turn_id=turn, timeout=30)
        assert await d.send(Interrupt(session_id=session)) == InputAccepted(status=204)
        end = await d.terminal(turn, timeout=15)
        assert end.__struct_config__.tag == "response.cancelled"
        rows = host.ask("elicitations")["elicitations"]
        (row,) = [r for r in rows if r["elicitation_id"] == asked.elicitation_id]
        assert row["state"] != "parked"
        again = await d.start_turn(session, agent_spec(llm), "go on")
        assert (await d.terminal(again, timeout=30)).__struct_config__.tag == "response.completed"
    calls = [i for i in items_of(d, turn) if i["type"] == "function_call"]
    workdir = Path(json.loads(calls[0]["arguments"])["cwd"])
    assert not (workdir / "never.txt").exists()
    assert text_of(d, again) == "next"


async def test_a_file_change_codex_asks_for_is_relayed_as_apply_patch_and_accepted(
    host: HostProcess, llm: FakeOpenAI
) -> None:
    """A model Codex knows to edit with ``apply_patch`` (a freeform tool): the patch is asked
    about, shown as an ``apply_patch`` call with its changes, and applied."""
    patch = "*** Begin Patch\n*** Add File: notes.txt\n+patched by codex\n*** End Patch\n"
    model = "gpt-5.5"
    llm.queue(
        Reply(frames=responses_events(model, custom=[("call_p", "apply_patch", patch)])),
        Reply(frames=responses_events(model, ["patched"], added=True)),
    )
    session = "s-cx-patch"
    async with fake_dispatch(host.endpoint) as d, answering(d, session) as asked:
        turn = await d.start_turn(session, agent_spec(llm, model=model), "add notes")
        end = await d.terminal(turn, timeout=30)
    assert end.__struct_config__.tag == "response.completed", end
    # Policy, then a person, as for a command.
    assert [getattr(a, "phase", "person") for a in asked] == [
        "PHASE_LLM_REQUEST",
        "PHASE_TOOL_CALL",
        "person",
    ]
    (change,) = asked[-1].params["tool"]["arguments"]["changes"]
    assert (change["kind"], change["diff"]) == ("add", "patched by codex\n")
    calls = [i for i in items_of(d, turn) if i["type"] == "function_call"]
    assert [(c["name"], c["status"]) for c in calls] == [
        ("apply_patch", "in_progress"),
        ("apply_patch", "completed"),
    ]
    assert json.loads(calls[1]["arguments"])["changes"] == [change]
    (output,) = [i for i in items_of(d, turn) if i["type"] == "function_call_output"]
    assert output["output"] == f"completed: {change['path']}"
    assert Path(change["path"]).read_text() == "patched by codex\n"


async def test_d11_a_model_override_reaches_codex_and_is_the_serving_model(
    host: HostProcess, llm: FakeOpenAI
) -> None:
    llm.queue(answer_text(["one"]), answer_text(["two"]))
    session = "s-cx-override"
    async with fake_dispatch(host.endpoint) as d, answering(d, session):
        first = await d.start_turn(session, agent_spec(llm), "hi")
        await d.terminal(first, timeout=30)
        second = await d.start_turn(session, agent_spec(llm), "again", model_override="gpt-other")
        end = await d.terminal(second, timeout=30)
    assert [r.json["model"] for r in llm.requests] == [MODEL, "gpt-other"]
    observed = [e.model for e in d.of_turn(second) if e.__struct_config__.tag == "runtime_model"]
    assert observed == ["gpt-other"] and end.response["usage"]["model"] == "gpt-other"


SHELL_TOOL = {
    "type": "function",
    "function": {
        "name": "sys_os_shell",
        "description": "Run a shell command in the session's environment.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
    },
}


async def test_the_runners_tools_are_offered_to_codex_and_run_by_the_runner(
    host: HostProcess, llm: FakeOpenAI
) -> None:
    """The turn's ``tools`` are Codex's dynamic tools: the model sees them beside Codex's own,
    and a call of one is the runner's (``action_required``, answered by dispatch), its output
    going back to the model — and offered again to a resumed thread."""
    call = ("call_rt", "sys_os_shell", json.dumps({"command": "uname"}))
    llm.queue(
        Reply(frames=responses_events(MODEL, calls=[call])),
        answer_text(["the runner says Linux"]),
        answer_text(["again"]),
    )
    session = "s-cx-runner-tools"
    async with fake_dispatch(host.endpoint) as d, answering(d, session) as asked:
        turn = await d.start_turn(session, agent_spec(llm), "which OS?", tools=[SHELL_TOOL])
        wanted = await d.wait_for(
            lambda e: getattr(e, "item", {}).get("status") == "action_required", timeout=30
        )
        assert (wanted.item["name"], json.loads(wanted.item["arguments"])) == (
            "sys_os_shell",
            {"command": "uname"},
        )
        result = ToolResult(session_id=session, call_id=wanted.item["call_id"], output="Linux")
        assert await d.send(result) == InputAccepted(status=204)
        end = await d.terminal(turn, timeout=30)
        assert end.__struct_config__.tag == "response.completed", end
        # A new worker, the thread resumed: the runner's tools are still the model's.
        worker = worker_pid(host, session)
        os.kill(worker, signal.SIGKILL)
        await eventually(lambda: gone(worker), "the worker gone")
        again = await d.start_turn(session, agent_spec(llm), "and now?", tools=[SHELL_TOOL])
        assert (await d.terminal(again, timeout=30)).__struct_config__.tag == "response.completed"
    first, second, third = llm.requests
    offered = [t.get("name") for t in first.json["tools"]]
    assert "sys_os_shell" in offered and "exec_command" in offered
    assert "sys_os_shell" in [t.get("name") for t in third.json["tools"]]
    sent = [i for i in second.json["input"] if i.get("call_id") == "call_rt"]
    assert [i["type"] for i in sent] == ["function_call", "function_call_output"]
    assert sent[1]["output"] == "Linux"
    # The runner's call is shown once, as every kind shows it (no Codex item on top), and
    # the model call's policy question counted the tool; no person was asked.
    calls = [i for i in items_of(d, turn) if i["type"] == "function_call"]
    assert [c["status"] for c in calls] == ["in_progress", "action_required", "completed"]
    assert [(a.phase, a.data["tools_count"]) for a in asked] == [("PHASE_LLM_REQUEST", 1)] * 2
    assert text_of(d, turn) == "the runner says Linux"


async def test_a_person_may_take_longer_than_the_idle_timeout_to_answer(
    host: HostProcess, llm: FakeOpenAI
) -> None:
    """``idle_timeout_s`` counts Codex's silence, not a person's: while an approval is out,
    the CLI waits on corral and the turn does not time out."""
    llm.queue(answer_command("echo slow > slow.txt"), answer_text(["done"]))
    session = "s-cx-slow-person"
    async with fake_dispatch(host.endpoint) as d, answering(d, session, person=""):
        turn = await d.start_turn(session, agent_spec(llm, idle_timeout_s=1), "write it")
        asked = await d.wait_type("response.elicitation_request", turn_id=turn, timeout=30)
        await trio.sleep(2.5)  # the scenario: a person slower than idle_timeout_s
        approval = Approval(
            session_id=session, elicitation_id=asked.elicitation_id, action="accept"
        )
        assert await d.send(approval, durable=True) == InputAccepted(status=204)
        end = await d.terminal(turn, timeout=30)
    assert end.__struct_config__.tag == "response.completed", end
    assert text_of(d, turn) == "done"
