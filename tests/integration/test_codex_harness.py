"""The ``codex`` kind through a real host: the real Codex CLI (``codex app-server``, from
``cli_bin``) against a fake Responses API on 127.0.0.1 (H-04, H-12, H-13, S-08)."""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from corral.harnesses import availability
from corral.harnesses.protocol import Approval, InputAccepted, Interrupt, PolicyVerdict, ToolResult
from tests.conftest import HostProcess, wait_for
from tests.fake_openai import FakeOpenAI, Reply, error, responses_events
from tests.integration._dispatch import FakeDispatch, fake_dispatch

#: The tests share one host; each runs its own session ids.
SHARE_HOST = True
#: The harness actor alone: a stand-in dispatch (``fake_dispatch``) drives it.
HOST_ACTORS = frozenset({"harness"})

MODEL = "gpt-fake"
KEY = "sk-test-codex-key"


@pytest.fixture(scope="module", autouse=True)
def _codex_installed(cli_bin: Path) -> Iterator[None]:
    """The module's hosts find the pinned ``codex`` (``CORRAL_CLI_PATH`` reaches workers)."""
    before = os.environ.get("CORRAL_CLI_PATH")
    os.environ["CORRAL_CLI_PATH"] = str(cli_bin)
    yield
    if before is None:
        os.environ.pop("CORRAL_CLI_PATH", None)
    else:
        os.environ["CORRAL_CLI_PATH"] = before


@pytest.fixture
async def llm(nursery: trio.Nursery) -> FakeOpenAI:
    """The fake Responses API the test's agents call, on 127.0.0.1 for the test's length."""
    server = FakeOpenAI()
    await server.start(nursery)
    return server


def _spec(llm: FakeOpenAI, **executor: Any) -> dict[str, Any]:
    auth = {"type": "api_key", "api_key": KEY, "base_url": llm.base_url}
    return {
        "name": "coder",
        "prompt": "Be terse.",
        "executor": {"harness": "codex", "model": MODEL, "auth": auth, **executor},
    }


def _text(frames: list[str]) -> Reply:
    return Reply(frames=responses_events(MODEL, frames, added=True))


def _command(cmd: str, call_id: str = "call_1") -> Reply:
    return Reply(
        frames=responses_events(MODEL, calls=[(call_id, "exec_command", json.dumps({"cmd": cmd}))])
    )


@asynccontextmanager
async def answering(
    d: FakeDispatch, session_id: str, *, tool_call: str = "ALLOW", person: str = "accept"
) -> AsyncIterator[list[Any]]:
    """Stand in for dispatch's policy actor and for the person: every ``PHASE_LLM_REQUEST``
    is allowed, every ``PHASE_TOOL_CALL`` answered ``tool_call``, every elicitation
    ``person`` (``""``: left unanswered). Yields the requests answered, in order."""
    answered: list[Any] = []

    async def loop() -> None:
        seen = 0
        while True:
            await d.wait_for(lambda _, known=seen: len(d.events) > known, timeout=3600)
            fresh, seen = d.events[seen:], len(d.events)
            for event in fresh:
                if event.__struct_config__.tag == "policy_evaluation.requested":
                    tool = event.phase == "PHASE_TOOL_CALL"
                    action = f"POLICY_ACTION_{tool_call if tool else 'ALLOW'}"
                    verdict = PolicyVerdict(
                        session_id=session_id,
                        evaluation_id=event.evaluation_id,
                        action=action,
                        reason="no shell here" if action.endswith("DENY") else None,
                    )
                    answered.append(event)
                    assert await d.send(verdict) == InputAccepted(status=204)
                elif event.__struct_config__.tag == "response.elicitation_request" and person:
                    answered.append(event)
                    approval = Approval(
                        session_id=session_id, elicitation_id=event.elicitation_id, action=person
                    )
                    assert await d.send(approval, durable=True) == InputAccepted(status=204)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(loop)
        yield answered
        nursery.cancel_scope.cancel()


def _items(d: FakeDispatch, turn: str) -> list[dict[str, Any]]:
    return [e.item for e in d.of_turn(turn) if e.__struct_config__.tag.endswith("item.done")]


def _text_of(d: FakeDispatch, turn: str) -> str:
    deltas = [e for e in d.of_turn(turn) if e.__struct_config__.tag == "response.output_text.delta"]
    return "".join(e.delta for e in deltas)


def _input_texts(request: Any) -> list[str]:
    """The texts of the user and assistant messages a model request carries."""
    return [
        part.get("text", "")
        for item in request.json["input"]
        if item.get("type") == "message" and item.get("role") in ("user", "assistant")
        for part in item["content"]
    ]


def _worker_pid(host: HostProcess, session_id: str) -> int:
    state = host.ask("inspect", actor="harness")["state"]
    (w,) = [w for w in state["workers"] if w["session_id"] == session_id]
    return int(w["pid"])


def _children(pid: int) -> list[tuple[int, str]]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name, rest = stat.split("(", 1)[1].rsplit(")", 1)
        if int(rest.split()[1]) == pid and rest.split()[0] != "Z":
            found.append((int(entry.name), name))
    return found


def _descendants(pid: int) -> list[tuple[int, str]]:
    found, frontier = [], [pid]
    while frontier:
        for child in _children(frontier.pop()):
            found.append(child)
            frontier.append(child[0])
    return found


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


async def _eventually(probe: Callable[[], Any], what: str) -> Any:
    """:func:`wait_for` of a plain ``probe`` (the test's trio loop answers meanwhile)."""

    async def asked() -> Any:
        return probe()

    return await wait_for(asked, what, timeout=15)


async def _codex_pid(host: HostProcess, session_id: str) -> int:
    worker = _worker_pid(host, session_id)
    return await _eventually(
        lambda: next((p for p, name in _children(worker) if name == "codex"), None),
        "the worker's codex app-server",
    )


async def test_h04_a_plain_turn_streams_codex_reasoning_and_text_with_usage_and_runtime_model(
    host: HostProcess, llm: FakeOpenAI
) -> None:
    thought = ["thinking ", "hard"]
    llm.queue(Reply(frames=responses_events(MODEL, ["Hel", "lo"], added=True, reasoning=thought)))
    async with fake_dispatch(host.endpoint) as d, answering(d, "s-cx-plain"):
        turn = await d.start_turn("s-cx-plain", _spec(llm), "say hello")
        end = await d.terminal(turn, timeout=30)

    assert end.__struct_config__.tag == "response.completed", end
    types = d.types(turn)
    # H-04's shape: created first, completed last, text deltas between.
    assert (types[0], types[-1]) == ("response.created", "response.completed")
    assert "response.output_text.delta" in types
    assert types.index("runtime_model") < types.index("response.output_text.delta")
    assert _text_of(d, turn) == "Hello"
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
    (message,) = [i for i in _items(d, turn) if i["type"] == "message"]
    assert (message["agent"], message["content"][0]["text"]) == ("coder", "Hello")
    (request,) = llm.requests
    assert (request.path, request.json["model"]) == ("/v1/responses", MODEL)
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert "Be terse." in json.dumps(request.json["input"])
    assert _input_texts(request)[-1] == "say hello"


async def test_h12_each_session_has_a_codex_home_under_the_state_dir_with_corrals_config(
    host: HostProcess, llm: FakeOpenAI
) -> None:
    """H-12: the CLI's home is the session's own, under the host's state dir (a test's host
    has its own), with corral's config: the fake provider, offline, no key in the file."""
    llm.queue(_text(["ok"]))
    async with fake_dispatch(host.endpoint) as d, answering(d, "s-cx-home"):
        turn = await d.start_turn("s-cx-home", _spec(llm))
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
    llm.queue(_command(cmd), _text(["done"]))
    async with fake_dispatch(host.endpoint) as d, answering(d, session_id, **answers) as asked:
        turn = await d.start_turn(session_id, _spec(llm), "write the file")
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
    items = _items(d, turn)
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
    assert _text_of(d, turn) == "done"


async def test_a_declined_command_does_not_run_and_the_model_is_told(
    host: HostProcess, llm: FakeOpenAI
) -> None:
    d, turn, asked = await _command_turn(
        host, llm, "s-cx-decline", "echo nope > declined.txt", person="decline"
    )
    assert asked[-1].__struct_config__.tag == "response.elicitation_request"
    calls = [i for i in _items(d, turn) if i["type"] == "function_call"]
    workdir = Path(json.loads(calls[0]["arguments"])["cwd"])
    assert not (workdir / "declined.txt").exists()
    (output,) = [i for i in _items(d, turn) if i["type"] == "function_call_output"]
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
    calls = [i for i in _items(d, turn) if i["type"] == "function_call"]
    workdir = Path(json.loads(calls[0]["arguments"])["cwd"])
    assert not (workdir / "denied.txt").exists()


def _hanging(deltas: list[str]) -> Reply:
    """A model answer that streams ``deltas`` and then says nothing until the client goes."""
    return Reply(frames=responses_events(MODEL, deltas, added=True), hang_after=2 + len(deltas))


@pytest.mark.chaos
async def test_kill_9_of_the_cli_mid_turn_fails_it_harness_crashed_and_the_next_turn_resumes(
    host: HostProcess, llm: FakeOpenAI
) -> None:
    llm.queue(_hanging(["thinking"]), _text(["back"]))
    session = "s-cx-kill"
    async with fake_dispatch(host.endpoint) as d, answering(d, session):
        turn = await d.start_turn(session, _spec(llm), "first question")
        await d.wait_type("response.output_text.delta", turn_id=turn, timeout=30)
        worker = _worker_pid(host, session)
        os.kill(await _codex_pid(host, session), signal.SIGKILL)
        with trio.fail_after(5):  # the CLI's end is seen at once, not at a liveness window
            end = await d.terminal(turn)
        assert end.__struct_config__.tag == "response.failed"
        assert end.error["code"] == "harness_crashed"
        assert "SIGKILL" in end.error["message"]

        again = await d.start_turn(session, _spec(llm), "second question")
        end = await d.terminal(again, timeout=30)
    assert end.__struct_config__.tag == "response.completed", end
    assert _text_of(d, again) == "back"
    # The same worker started another CLI, which resumed the thread.
    assert _worker_pid(host, session) == worker
    texts = _input_texts(llm.requests[-1])
    assert texts.index("first question") < texts.index("second question")


@pytest.mark.chaos
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
        _hanging(["waiting for it"]),  # the model's next call, with the command running
        _text(["after"]),
    )
    session = "s-cx-interrupt"
    async with fake_dispatch(host.endpoint) as d, answering(d, session):
        turn = await d.start_turn(session, _spec(llm), "run it")
        await d.wait_type("response.output_text.delta", turn_id=turn, timeout=30)
        codex = await _codex_pid(host, session)
        # Through Codex's sandbox helper and bwrap, in sessions of their own.
        command = await _eventually(
            lambda: [p for p, name in _descendants(codex) if name in ("bash", "sleep")],
            "the command running",
        )
        assert await d.send(Interrupt(session_id=session)) == InputAccepted(status=204)
        end = await d.terminal(turn, timeout=15)
        assert end.__struct_config__.tag == "response.cancelled"
        await _eventually(lambda: all(map(_gone, command)), "the command ended")
        # The CLI lives on for the next turn.
        assert await _codex_pid(host, session) == codex
        again = await d.start_turn(session, _spec(llm), "go on")
        assert (await d.terminal(again, timeout=30)).__struct_config__.tag == "response.completed"
    assert _text_of(d, again) == "after"


@pytest.mark.chaos
async def test_history_goes_on_across_turns_a_worker_restart_and_a_lost_home(
    host: HostProcess, llm: FakeOpenAI
) -> None:
    """Codex's thread holds the conversation: the second turn's model call carries the first
    turn; a new worker (the old one killed) resumes the thread from the session's home; a
    home that was lost is seeded from the history the turn's message carries."""
    llm.queue(_text(["Hi Bob"]), _text(["Bob, yes"]), _text(["still Bob"]), _text(["seeded"]))
    session = "s-cx-history"
    spec = _spec(llm)
    async with fake_dispatch(host.endpoint) as d, answering(d, session):
        first = await d.start_turn(session, spec, "my name is Bob")
        await d.terminal(first, timeout=30)
        second = await d.start_turn(session, spec, "what is my name?")
        await d.terminal(second, timeout=30)
        assert _input_texts(llm.requests[1])[-3:] == [
            "my name is Bob",
            "Hi Bob",
            "what is my name?",
        ]
        worker = _worker_pid(host, session)
        os.kill(worker, signal.SIGKILL)
        await _eventually(lambda: _gone(worker), "the worker gone")
        third = await d.start_turn(session, spec, "and now?")
        end = await d.terminal(third, timeout=30)
        assert end.__struct_config__.tag == "response.completed", end
        assert _worker_pid(host, session) != worker
        assert _input_texts(llm.requests[2])[-5:] == [
            "my name is Bob",
            "Hi Bob",
            "what is my name?",
            "Bob, yes",
            "and now?",
        ]
        # The home is lost (a new host's state dir): the turn's history seeds a new thread.
        (home,) = host.state_dir.glob(f"**/{session}/.codex")
        shutil.rmtree(home)
        history = [
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "I am Ann"}],
            },
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Hi Ann"}],
            },
        ]
        worker = _worker_pid(host, session)
        os.kill(worker, signal.SIGKILL)
        await _eventually(lambda: _gone(worker), "the worker gone")
        fourth = await d.start_turn(session, spec, "who am I?", history=history)
        end = await d.terminal(fourth, timeout=30)
    assert end.__struct_config__.tag == "response.completed", end
    assert _input_texts(llm.requests[3])[-3:] == ["I am Ann", "Hi Ann", "who am I?"]
    assert "my name is Bob" not in _input_texts(llm.requests[3])


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
        turn = await d.start_turn("s-cx-missing", _spec(llm))
        end = await d.terminal(turn, timeout=10)
    assert end.__struct_config__.tag == "response.failed"
    assert end.error["code"] == "harness_unavailable"
    assert "needs the 'codex' CLI on PATH" in end.error["message"]
    assert "npm install -g @openai/codex@" in end.error["message"]
    assert llm.requests == []


@pytest.mark.chaos
async def test_a_cli_that_stops_talking_fails_the_turn_timeout_and_the_next_turn_works(
    host: HostProcess, llm: FakeOpenAI
) -> None:
    llm.queue(_hanging(["a"]), _text(["awake"]))
    session = "s-cx-silent"
    spec = _spec(llm, idle_timeout_s=1)
    async with fake_dispatch(host.endpoint) as d, answering(d, session):
        turn = await d.start_turn(session, spec, "hello")
        await d.wait_type("response.output_text.delta", turn_id=turn, timeout=30)
        codex = await _codex_pid(host, session)
        os.kill(codex, signal.SIGSTOP)
        end = await d.terminal(turn, timeout=15)
        assert end.__struct_config__.tag == "response.failed"
        assert end.error == {
            "code": "timeout",
            "message": "the codex CLI said nothing for 1s (idle_timeout_s)",
        }
        assert _gone(codex)
        again = await d.start_turn(session, spec, "wake up")
        end = await d.terminal(again, timeout=30)
    assert end.__struct_config__.tag == "response.completed", end
    assert _text_of(d, again) == "awake"


async def test_a_provider_error_fails_the_turn_with_what_codex_reports(
    host: HostProcess, llm: FakeOpenAI
) -> None:
    llm.queue(error(400, "model gpt-fake does not exist"))
    async with fake_dispatch(host.endpoint) as d, answering(d, "s-cx-400"):
        turn = await d.start_turn("s-cx-400", _spec(llm))
        end = await d.terminal(turn, timeout=30)
    assert end.__struct_config__.tag == "response.failed"
    assert end.error["code"] == "provider_error"
    assert end.error["message"] == "codex: model gpt-fake does not exist (other)"


@pytest.mark.chaos
async def test_an_interrupt_while_codex_waits_for_a_person_ends_the_turn_and_its_question(
    host: HostProcess, llm: FakeOpenAI
) -> None:
    llm.queue(_command("echo never > never.txt"), _text(["next"]))
    session = "s-cx-interrupt-asking"
    async with fake_dispatch(host.endpoint) as d, answering(d, session, person=""):
        turn = await d.start_turn(session, _spec(llm), "run it")
        asked = await d.wait_type("response.elicitation_request", turn_id=turn, timeout=30)
        assert await d.send(Interrupt(session_id=session)) == InputAccepted(status=204)
        end = await d.terminal(turn, timeout=15)
        assert end.__struct_config__.tag == "response.cancelled"
        rows = host.ask("elicitations")["elicitations"]
        (row,) = [r for r in rows if r["elicitation_id"] == asked.elicitation_id]
        assert row["state"] != "parked"
        again = await d.start_turn(session, _spec(llm), "go on")
        assert (await d.terminal(again, timeout=30)).__struct_config__.tag == "response.completed"
    calls = [i for i in _items(d, turn) if i["type"] == "function_call"]
    workdir = Path(json.loads(calls[0]["arguments"])["cwd"])
    assert not (workdir / "never.txt").exists()
    assert _text_of(d, again) == "next"


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
        turn = await d.start_turn(session, _spec(llm, model=model), "add notes")
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
    calls = [i for i in _items(d, turn) if i["type"] == "function_call"]
    assert [(c["name"], c["status"]) for c in calls] == [
        ("apply_patch", "in_progress"),
        ("apply_patch", "completed"),
    ]
    assert json.loads(calls[1]["arguments"])["changes"] == [change]
    (output,) = [i for i in _items(d, turn) if i["type"] == "function_call_output"]
    assert output["output"] == f"completed: {change['path']}"
    assert Path(change["path"]).read_text() == "patched by codex\n"


async def test_d11_a_model_override_reaches_codex_and_is_the_serving_model(
    host: HostProcess, llm: FakeOpenAI
) -> None:
    llm.queue(_text(["one"]), _text(["two"]))
    session = "s-cx-override"
    async with fake_dispatch(host.endpoint) as d, answering(d, session):
        first = await d.start_turn(session, _spec(llm), "hi")
        await d.terminal(first, timeout=30)
        second = await d.start_turn(session, _spec(llm), "again", model_override="gpt-other")
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
        _text(["the runner says Linux"]),
        _text(["again"]),
    )
    session = "s-cx-runner-tools"
    async with fake_dispatch(host.endpoint) as d, answering(d, session) as asked:
        turn = await d.start_turn(session, _spec(llm), "which OS?", tools=[SHELL_TOOL])
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
        worker = _worker_pid(host, session)
        os.kill(worker, signal.SIGKILL)
        await _eventually(lambda: _gone(worker), "the worker gone")
        again = await d.start_turn(session, _spec(llm), "and now?", tools=[SHELL_TOOL])
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
    calls = [i for i in _items(d, turn) if i["type"] == "function_call"]
    assert [c["status"] for c in calls] == ["in_progress", "action_required", "completed"]
    assert [(a.phase, a.data["tools_count"]) for a in asked] == [("PHASE_LLM_REQUEST", 1)] * 2
    assert _text_of(d, turn) == "the runner says Linux"


@pytest.mark.chaos
async def test_kill_9_of_the_worker_while_codex_waits_for_a_person_ends_all_of_it(
    host: HostProcess, llm: FakeOpenAI
) -> None:
    """The worker dies with an approval parked: the question is resolved and the turn fails
    ``harness_restarted`` (docs/harnesses.md, *Parked elicitations*), the CLI died with its
    worker (PDEATHSIG) so the command never runs, and the session's next turn resumes the
    thread in a new worker."""
    llm.queue(_command("echo late > parked.txt"), _text(["resumed"]))
    session = "s-cx-kill-parked"
    async with fake_dispatch(host.endpoint) as d, answering(d, session, person=""):
        turn = await d.start_turn(session, _spec(llm), "write it")
        asked = await d.wait_type("response.elicitation_request", turn_id=turn, timeout=30)
        codex = await _codex_pid(host, session)
        os.kill(_worker_pid(host, session), signal.SIGKILL)
        end = await d.terminal(turn, timeout=15)
        assert end.__struct_config__.tag == "response.failed"
        assert end.error["code"] == "harness_restarted"
        await _eventually(lambda: _gone(codex), "the CLI gone with its worker")
        rows = host.ask("elicitations")["elicitations"]
        (row,) = [r for r in rows if r["elicitation_id"] == asked.elicitation_id]
        assert row["state"] != "parked"
        again = await d.start_turn(session, _spec(llm), "go on")
        end = await d.terminal(again, timeout=30)
    assert end.__struct_config__.tag == "response.completed", end
    workdir = Path(json.loads(_items(d, turn)[0]["arguments"])["cwd"])
    assert not (workdir / "parked.txt").exists()
    assert _input_texts(llm.requests[-1])[-2:] == ["write it", "go on"]
