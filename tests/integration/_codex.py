"""What the ``codex`` kind's tests through a real host share: the pinned CLI on the hosts'
path, a fake Responses API, the agent spec pointing at it, a stand-in for dispatch's policy
actor and for the person, and looks at the worker's and the CLI's processes in ``/proc``.

A test module imports the two fixtures, ``codex_on_path`` (autouse, module-scoped: before the
module's shared host starts) and ``fake_llm`` (as ``llm``)."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from corral.harnesses.protocol import Approval, InputAccepted, PolicyVerdict
from tests.conftest import HostProcess, wait_for
from tests.fake_openai import FakeOpenAI, Reply, responses_events
from tests.integration._dispatch import FakeDispatch

MODEL = "gpt-fake"


KEY = "sk-test-codex-key"


@pytest.fixture(scope="module", autouse=True)
def codex_on_path(cli_bin: Path) -> Iterator[None]:
    """The module's hosts find the pinned ``codex`` (``CORRAL_CLI_PATH`` reaches workers)."""
    before = os.environ.get("CORRAL_CLI_PATH")
    os.environ["CORRAL_CLI_PATH"] = str(cli_bin)
    yield
    if before is None:
        os.environ.pop("CORRAL_CLI_PATH", None)
    else:
        os.environ["CORRAL_CLI_PATH"] = before


@pytest.fixture(name="llm")
async def fake_llm(nursery: trio.Nursery) -> FakeOpenAI:
    """The fake Responses API the test's agents call, on 127.0.0.1 for the test's length."""
    server = FakeOpenAI()
    await server.start(nursery)
    return server


def agent_spec(llm: FakeOpenAI, **executor: Any) -> dict[str, Any]:
    auth = {"type": "api_key", "api_key": KEY, "base_url": llm.base_url}
    return {
        "name": "coder",
        "prompt": "Be terse.",
        "executor": {"harness": "codex", "model": MODEL, "auth": auth, **executor},
    }


def answer_text(frames: list[str]) -> Reply:
    return Reply(frames=responses_events(MODEL, frames, added=True))


def answer_command(cmd: str, call_id: str = "call_1") -> Reply:
    return Reply(
        frames=responses_events(MODEL, calls=[(call_id, "exec_command", json.dumps({"cmd": cmd}))])
    )


def answer_hanging(deltas: list[str]) -> Reply:
    """A model answer that streams ``deltas`` and then says nothing until the client goes."""
    return Reply(frames=responses_events(MODEL, deltas, added=True), hang_after=2 + len(deltas))


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


def items_of(d: FakeDispatch, turn: str) -> list[dict[str, Any]]:
    return [e.item for e in d.of_turn(turn) if e.__struct_config__.tag.endswith("item.done")]


def text_of(d: FakeDispatch, turn: str) -> str:
    deltas = [e for e in d.of_turn(turn) if e.__struct_config__.tag == "response.output_text.delta"]
    return "".join(e.delta for e in deltas)


def input_texts(request: Any) -> list[str]:
    """The texts of the user and assistant messages a model request carries."""
    return [
        part.get("text", "")
        for item in request.json["input"]
        if item.get("type") == "message" and item.get("role") in ("user", "assistant")
        for part in item["content"]
    ]


def worker_pid(host: HostProcess, session_id: str) -> int:
    state = host.ask("inspect", actor="harness")["state"]
    (w,) = [w for w in state["workers"] if w["session_id"] == session_id]
    return int(w["pid"])


def children(pid: int) -> list[tuple[int, str]]:
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


def descendants(pid: int) -> list[tuple[int, str]]:
    found, frontier = [], [pid]
    while frontier:
        for child in children(frontier.pop()):
            found.append(child)
            frontier.append(child[0])
    return found


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


async def eventually(probe: Callable[[], Any], what: str) -> Any:
    """:func:`wait_for` of a plain ``probe`` (the test's trio loop answers meanwhile)."""

    async def asked() -> Any:
        return probe()

    return await wait_for(asked, what, timeout=15)


async def codex_pid(host: HostProcess, session_id: str) -> int:
    worker = worker_pid(host, session_id)
    return await eventually(
        lambda: next((p for p, name in children(worker) if name == "codex"), None),
        "the worker's codex app-server",
    )
