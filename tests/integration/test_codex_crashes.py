"""The ``codex`` kind through a real host when things die: the CLI killed mid-turn, the
worker killed between turns or while Codex waits for a person, a CLI that stops talking. Each
test kills processes of its host, so each has a host of its own (``chaos``)."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest
import trio

from tests.conftest import HostProcess
from tests.fake_openai import FakeOpenAI
from tests.integration._codex import (
    agent_spec,
    answer_command,
    answer_hanging,
    answer_text,
    answering,
    codex_on_path,  # noqa: F401 - a fixture (autouse)
    codex_pid,
    eventually,
    fake_llm,  # noqa: F401 - a fixture (llm)
    gone,
    input_texts,
    items_of,
    text_of,
    worker_pid,
)
from tests.integration._dispatch import fake_dispatch

#: The tests share one host (tests/conftest.py); each runs its own session ids.
SHARE_HOST = True
#: The harness actor alone: a stand-in dispatch (``fake_dispatch``) drives it.
HOST_ACTORS = frozenset({"harness"})


@pytest.mark.chaos
async def test_kill_9_of_the_cli_mid_turn_fails_it_harness_crashed_and_the_next_turn_resumes(
    host: HostProcess, llm: FakeOpenAI
) -> None:
    llm.queue(answer_hanging(["thinking"]), answer_text(["back"]))
    session = "s-cx-kill"
    async with fake_dispatch(host.endpoint) as d, answering(d, session):
        turn = await d.start_turn(session, agent_spec(llm), "first question")
        await d.wait_type("response.output_text.delta", turn_id=turn, timeout=30)
        worker = worker_pid(host, session)
        os.kill(await codex_pid(host, session), signal.SIGKILL)
        with trio.fail_after(5):  # the CLI's end is seen at once, not at a liveness window
            end = await d.terminal(turn)
        assert end.__struct_config__.tag == "response.failed"
        assert end.error["code"] == "harness_crashed"
        assert "SIGKILL" in end.error["message"]

        again = await d.start_turn(session, agent_spec(llm), "second question")
        end = await d.terminal(again, timeout=30)
    assert end.__struct_config__.tag == "response.completed", end
    assert text_of(d, again) == "back"
    # The same worker started another CLI, which resumed the thread.
    assert worker_pid(host, session) == worker
    texts = input_texts(llm.requests[-1])
    assert texts.index("first question") < texts.index("second question")


@pytest.mark.chaos
async def test_history_goes_on_across_turns_a_worker_restart_and_a_lost_home(
    host: HostProcess, llm: FakeOpenAI
) -> None:
    """Codex's thread holds the conversation: the second turn's model call carries the first
    turn; a new worker (the old one killed) resumes the thread from the session's home; a
    home that was lost is seeded from the history the turn's message carries."""
    llm.queue(
        answer_text(["Hi Bob"]),
        answer_text(["Bob, yes"]),
        answer_text(["still Bob"]),
        answer_text(["seeded"]),
    )
    session = "s-cx-history"
    spec = agent_spec(llm)
    async with fake_dispatch(host.endpoint) as d, answering(d, session):
        first = await d.start_turn(session, spec, "my name is Bob")
        await d.terminal(first, timeout=30)
        second = await d.start_turn(session, spec, "what is my name?")
        await d.terminal(second, timeout=30)
        assert input_texts(llm.requests[1])[-3:] == [
            "my name is Bob",
            "Hi Bob",
            "what is my name?",
        ]
        worker = worker_pid(host, session)
        os.kill(worker, signal.SIGKILL)
        await eventually(lambda: gone(worker), "the worker gone")
        third = await d.start_turn(session, spec, "and now?")
        end = await d.terminal(third, timeout=30)
        assert end.__struct_config__.tag == "response.completed", end
        assert worker_pid(host, session) != worker
        assert input_texts(llm.requests[2])[-5:] == [
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
        worker = worker_pid(host, session)
        os.kill(worker, signal.SIGKILL)
        await eventually(lambda: gone(worker), "the worker gone")
        fourth = await d.start_turn(session, spec, "who am I?", history=history)
        end = await d.terminal(fourth, timeout=30)
    assert end.__struct_config__.tag == "response.completed", end
    assert input_texts(llm.requests[3])[-3:] == ["I am Ann", "Hi Ann", "who am I?"]
    assert "my name is Bob" not in input_texts(llm.requests[3])


@pytest.mark.chaos
async def test_a_cli_that_stops_talking_fails_the_turn_timeout_and_the_next_turn_works(
    host: HostProcess, llm: FakeOpenAI
) -> None:
    llm.queue(answer_hanging(["a"]), answer_text(["awake"]))
    session = "s-cx-silent"
    spec = agent_spec(llm, idle_timeout_s=1)
    async with fake_dispatch(host.endpoint) as d, answering(d, session):
        turn = await d.start_turn(session, spec, "hello")
        await d.wait_type("response.output_text.delta", turn_id=turn, timeout=30)
        codex = await codex_pid(host, session)
        os.kill(codex, signal.SIGSTOP)
        end = await d.terminal(turn, timeout=15)
        assert end.__struct_config__.tag == "response.failed"
        assert end.error == {
            "code": "timeout",
            "message": "the codex CLI said nothing for 1s (idle_timeout_s)",
        }
        assert gone(codex)
        again = await d.start_turn(session, spec, "wake up")
        end = await d.terminal(again, timeout=30)
    assert end.__struct_config__.tag == "response.completed", end
    assert text_of(d, again) == "awake"


@pytest.mark.chaos
async def test_kill_9_of_the_worker_while_codex_waits_for_a_person_ends_all_of_it(
    host: HostProcess, llm: FakeOpenAI
) -> None:
    """The worker dies with an approval parked: the question is resolved and the turn fails
    ``harness_restarted`` (docs/harnesses.md, *Parked elicitations*), the CLI died with its
    worker (PDEATHSIG) so the command never runs, and the session's next turn resumes the
    thread in a new worker."""
    llm.queue(answer_command("echo late > parked.txt"), answer_text(["resumed"]))
    session = "s-cx-kill-parked"
    async with fake_dispatch(host.endpoint) as d, answering(d, session, person=""):
        turn = await d.start_turn(session, agent_spec(llm), "write it")
        asked = await d.wait_type("response.elicitation_request", turn_id=turn, timeout=30)
        codex = await codex_pid(host, session)
        os.kill(worker_pid(host, session), signal.SIGKILL)
        end = await d.terminal(turn, timeout=15)
        assert end.__struct_config__.tag == "response.failed"
        assert end.error["code"] == "harness_restarted"
        await eventually(lambda: gone(codex), "the CLI gone with its worker")
        rows = host.ask("elicitations")["elicitations"]
        (row,) = [r for r in rows if r["elicitation_id"] == asked.elicitation_id]
        assert row["state"] != "parked"
        again = await d.start_turn(session, agent_spec(llm), "go on")
        end = await d.terminal(again, timeout=30)
    assert end.__struct_config__.tag == "response.completed", end
    workdir = Path(json.loads(items_of(d, turn)[0]["arguments"])["cwd"])
    assert not (workdir / "parked.txt").exists()
    assert input_texts(llm.requests[-1])[-2:] == ["write it", "go on"]
