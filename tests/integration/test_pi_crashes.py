"""The ``pi`` kind through a real host when things die: the CLI killed mid-turn, the worker
killed between turns or while pi waits for a person, a CLI that stops talking; and the
conversation going on across all of it (pi's ``--no-session`` keeps it in the CLI only, so
a new CLI is given the history the turn's message carries)."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest
import trio

from tests.conftest import HostProcess
from tests.fake_openai import FakeOpenAI
from tests.integration._codex import (
    answering,
    codex_on_path,  # noqa: F401 - a fixture (autouse): the pinned CLIs on the hosts' path
    eventually,
    fake_llm,  # noqa: F401 - a fixture (llm)
    gone,
    text_of,
    worker_pid,
)
from tests.integration._dispatch import fake_dispatch
from tests.integration.test_pi_harness import (
    agent_spec,
    answer_command,
    answer_hanging,
    answer_text,
    pi_pid,
    said,
)

#: The tests share one host (tests/conftest.py); each runs its own session ids.
SHARE_HOST = True
#: The harness actor alone: a stand-in dispatch (``fake_dispatch``) drives it.
HOST_ACTORS = frozenset({"harness"})


def message(role: str, text: str) -> dict[str, Any]:
    part = "input_text" if role == "user" else "output_text"
    return {"type": "message", "role": role, "content": [{"type": part, "text": text}]}


@pytest.mark.chaos
async def test_kill_9_of_the_cli_mid_turn_fails_it_harness_crashed_and_the_next_turn_works(
    host: HostProcess, llm: FakeOpenAI
) -> None:
    """The CLI's end is seen at once (its output ends), not at a liveness window; the same
    worker starts another CLI, which is given the history."""
    llm.queue(answer_hanging(["thinking"]), answer_text(["back"]))
    session = "s-pi-kill"
    async with fake_dispatch(host.endpoint) as d, answering(d, session):
        turn = await d.start_turn(session, agent_spec(llm), "first question")
        await d.wait_type("response.output_text.delta", turn_id=turn, timeout=60)
        worker = worker_pid(host, session)
        os.kill(await pi_pid(host, session), signal.SIGKILL)
        with trio.fail_after(5):
            end = await d.terminal(turn)
        assert end.__struct_config__.tag == "response.failed"
        assert end.error["code"] == "harness_crashed"
        assert "SIGKILL" in end.error["message"]

        history = [message("user", "first question")]
        again = await d.start_turn(session, agent_spec(llm), "second question", history=history)
        end = await d.terminal(again, timeout=60)
    assert end.__struct_config__.tag == "response.completed", end
    assert text_of(d, again) == "back"
    assert worker_pid(host, session) == worker
    (prompt,) = said(llm.requests[-1])
    assert prompt.index("User: first question") < prompt.index("second question")


@pytest.mark.chaos
async def test_history_goes_on_across_turns_and_a_worker_restart(
    host: HostProcess, llm: FakeOpenAI
) -> None:
    """The CLI holds the conversation between turns; a new worker's CLI (the old worker
    killed) is given it from the turn's history, once."""
    llm.queue(
        answer_text(["Hi Bob"]),
        answer_text(["Bob, yes"]),
        answer_text(["still Bob"]),
        answer_text(["and on"]),
    )
    session = "s-pi-history"
    spec = agent_spec(llm)
    async with fake_dispatch(host.endpoint) as d, answering(d, session):
        first = await d.start_turn(session, spec, "my name is Bob")
        await d.terminal(first, timeout=60)
        second = await d.start_turn(
            session, spec, "what is my name?", history=[message("user", "my name is Bob")]
        )
        await d.terminal(second, timeout=60)
        assert said(llm.requests[1]) == ["my name is Bob", "Hi Bob", "what is my name?"]

        worker = worker_pid(host, session)
        os.kill(worker, signal.SIGKILL)
        await eventually(lambda: gone(worker), "the worker gone")
        history = [
            message("user", "my name is Bob"),
            message("assistant", "Hi Bob"),
            message("user", "what is my name?"),
            message("assistant", "Bob, yes"),
        ]
        third = await d.start_turn(session, spec, "and now?", history=history)
        end = await d.terminal(third, timeout=60)
        assert end.__struct_config__.tag == "response.completed", end
        assert worker_pid(host, session) != worker
        (seeded,) = said(llm.requests[2])
        assert seeded.endswith("User: my name is Bob\n\nAssistant: Hi Bob\n\nUser: what is "
                               "my name?\n\nAssistant: Bob, yes\n\nThe user's new message:\n\n"
                               "and now?")  # fmt: skip
        fourth = await d.start_turn(session, spec, "go on", history=history)
        await d.terminal(fourth, timeout=60)
    # Seeded once: the new CLI holds it from then on.
    assert said(llm.requests[3]) == [seeded, "still Bob", "go on"]


@pytest.mark.chaos
async def test_a_cli_that_stops_talking_fails_the_turn_timeout_and_the_next_turn_works(
    host: HostProcess, llm: FakeOpenAI
) -> None:
    llm.queue(answer_hanging(["a"]), answer_text(["awake"]))
    session = "s-pi-silent"
    spec = agent_spec(llm, idle_timeout_s=1)
    async with fake_dispatch(host.endpoint) as d, answering(d, session):
        turn = await d.start_turn(session, spec, "hello")
        pi = await pi_pid(host, session)
        # pi took the prompt (its model call is out): its silence counts from then.
        await eventually(lambda: llm.requests, "pi's model call")
        os.kill(pi, signal.SIGSTOP)
        end = await d.terminal(turn, timeout=30)
        assert end.__struct_config__.tag == "response.failed"
        assert end.error == {
            "code": "timeout",
            "message": "the pi CLI said nothing for 1s (idle_timeout_s)",
        }
        assert gone(pi)
        again = await d.start_turn(session, spec, "wake up")
        end = await d.terminal(again, timeout=60)
    assert end.__struct_config__.tag == "response.completed", end
    assert text_of(d, again) == "awake"


@pytest.mark.chaos
async def test_kill_9_of_the_worker_while_pi_waits_for_a_person_ends_all_of_it(
    host: HostProcess, llm: FakeOpenAI
) -> None:
    """The worker dies with an approval parked: the question is resolved and the turn fails
    ``harness_restarted``, the CLI died with its worker (PDEATHSIG) so the command never
    runs, and the session's next turn works in a new worker."""
    llm.queue(answer_command("echo late > parked.txt"), answer_text(["resumed"]))
    session = "s-pi-kill-parked"
    async with fake_dispatch(host.endpoint) as d, answering(d, session, person=""):
        turn = await d.start_turn(session, agent_spec(llm), "write it")
        asked = await d.wait_type("response.elicitation_request", turn_id=turn, timeout=60)
        pi = await pi_pid(host, session)
        os.kill(worker_pid(host, session), signal.SIGKILL)
        end = await d.terminal(turn, timeout=30)
        assert end.__struct_config__.tag == "response.failed"
        assert end.error["code"] == "harness_restarted"
        await eventually(lambda: gone(pi), "the CLI gone with its worker")
        rows = host.ask("elicitations")["elicitations"]
        (row,) = [r for r in rows if r["elicitation_id"] == asked.elicitation_id]
        assert row["state"] != "parked"
        again = await d.start_turn(
            session, agent_spec(llm), "go on", history=[message("user", "write it")]
        )
        end = await d.terminal(again, timeout=60)
    assert end.__struct_config__.tag == "response.completed", end
    assert text_of(d, again) == "resumed"
    assert not list(host.state_dir.glob("**/parked.txt"))
