"""What a turn leaves behind survives ``kill -9`` of dispatch, and an interrupt leaves nothing
parked: checked end to end (``corral up`` with its embedded control plane, scripted workers),
by what the next turn's harness is given and by what the host still holds.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from corral.cli._client import ControlPlane, StreamEvent, TurnFollower, run_turn
from tests.conftest import HostProcess, wait_until
from tests.integration.test_e2e import _config, _start, _stop

FIRST_ANSWER = "one two three four five six seven eight "
AGENTS = {
    # Turn 1 parks on the harness's own approval; turn 2 says what history it was given.
    "asks.yaml": """
        name: asks
        executor:
          harness: scripted
          script:
            turns:
              - - {text: "asking. "}
                - {elicit: {message: "May I?"}}
                - {text: "allowed.", on_decline: "refused."}
              - - {echo_history: true}
        """,
    # Turn 1 streams for about 5 s; turn 2 says what history it was given.
    "talks.yaml": f"""
        name: talks
        executor:
          harness: scripted
          script:
            turns:
              - - {{text: "{FIRST_ANSWER}", chunk: 4, delay_ms: 500}}
              - - {{echo_history: true}}
        """,
    # Text, a tool call that takes a while, text; turn 2 says what history it was given.
    "tools.yaml": """
        name: tools
        executor:
          harness: scripted
          script:
            turns:
              - - {text: "Let me look. "}
                - {tool: sys_os_shell, arguments: {command: "sleep 1; echo looked"}}
                - {text: "Done."}
              - - {echo_history: true}
        """,
}

#: What turn 2 of ``tools`` is given, as ``[role, text]``: the tool call and its output are
#: items without a role, between the assistant's two messages (as the server saves them).
TOOLS_HISTORY = [
    ["user", "first"],
    ["assistant", "Let me look. "],
    ["None", ""],
    ["None", ""],
    ["assistant", "Done."],
    ["user", "second"],
]


@pytest.fixture
def asks_host(tmp_path: Path) -> Iterator[Callable[[], HostProcess]]:
    hosts: list[HostProcess] = []

    def make() -> HostProcess:
        agents = tmp_path / "agents"
        agents.mkdir(exist_ok=True)
        for name, text in AGENTS.items():
            (agents / name).write_text(textwrap.dedent(text))
        hosts.append(HostProcess(tmp_path / "state", _config(agents)))
        return _start(hosts[-1])

    yield make
    for host in hosts:
        _stop(host)


async def _kill9(host: HostProcess, name: str) -> None:
    before = host.actor(name)
    os.kill(before["pid"], signal.SIGKILL)
    await trio.to_thread.run_sync(host.restarted, name, before)


async def _turn(
    api: ControlPlane, sid: str, text: str, decide: Any = None
) -> tuple[TurnFollower, list[StreamEvent]]:
    async def accept(_event: StreamEvent) -> str:
        return "accept"

    session = await api.session(sid)
    seen: list[StreamEvent] = []
    turn = await run_turn(
        api,
        sid,
        str(session["last_event_id"]),
        text,
        on_event=seen.append,
        decide=decide or accept,
        follower=TurnFollower(sid),
    )
    return turn, seen


def _parked(host: HostProcess) -> list[dict[str, Any]]:
    rows = host.ask("elicitations")["elicitations"]
    return [r for r in rows if r["state"] == "parked"]


def _terminal_edges(turn: TurnFollower) -> list[str]:
    return [
        e["status"]
        for e in turn.events
        if e["type"] == "session.status" and e["status"] in ("idle", "failed")
    ]


@pytest.mark.chaos
async def test_d23_kill9_dispatch_parked_on_a_harness_approval_keeps_the_history(
    asks_host,
) -> None:
    """Dispatch killed while the turn waits on its harness's approval: the turn completes
    once, and the next turn is given the whole conversation (user, answer, user)."""
    host = await trio.to_thread.run_sync(asks_host)
    killed: list[int] = []

    async def kill_dispatch_then_accept(_event: StreamEvent) -> str:
        killed.append(host.actor("dispatch")["pid"])
        await _kill9(host, "dispatch")
        return "accept"

    with trio.fail_after(90):
        async with ControlPlane(host.state_dir) as api:
            sid = (await api.create_session("asks"))["id"]
            first, _ = await _turn(api, sid, "first", kill_dispatch_then_accept)
            assert killed, "the turn never asked for the approval"
            assert (first.status, first.text) == ("idle", "asking. allowed.")
            assert _terminal_edges(first) == ["idle"]
            second, _ = await _turn(api, sid, "second")
    assert second.status == "idle"
    assert json.loads(second.text) == [
        ["user", "first"],
        ["assistant", "asking. allowed."],
        ["user", "second"],
    ]
    assert _parked(host) == []


@pytest.mark.chaos
async def test_e4_an_interrupt_at_a_harness_approval_cancels_the_parked_elicitation(
    asks_host,
) -> None:
    """Interrupted while its harness waits on an approval: the turn ends once, and the
    elicitation is cancelled in the broker at once, not left parked until a restart."""
    host = await trio.to_thread.run_sync(asks_host)
    asked: list[str] = []

    with trio.fail_after(90):
        async with ControlPlane(host.state_dir) as api:
            sid = (await api.create_session("asks"))["id"]

            async def interrupt(event: StreamEvent) -> None:
                asked.append(str(event.data["elicitation_id"]))
                await api.interrupt(sid)
                return None

            turn, _ = await _turn(api, sid, "first", interrupt)
    assert asked, "the turn never asked for the approval"
    assert turn.status == "idle"
    assert _terminal_edges(turn) == ["idle"]
    resolved = [e for e in turn.events if e["type"] == "response.elicitation_resolved"]
    assert [(e["elicitation_id"], e["action"]) for e in resolved] == [(asked[0], "cancel")]
    rows = host.ask("elicitations")["elicitations"]
    row = next(r for r in rows if r["elicitation_id"] == asked[0])
    assert row["state"] == "cancelled"
    assert _parked(host) == []


async def test_send_to_a_busy_session_prints_its_own_turn(asks_host) -> None:
    """``corral send --session S`` while S runs a turn: the message runs as its own turn after
    the running one (§E.3), and ``send`` prints that turn alone and ends on its edge."""
    host = await trio.to_thread.run_sync(asks_host)
    with trio.fail_after(90):
        async with ControlPlane(host.state_dir) as api, trio.open_nursery() as nursery:
            sid = (await api.create_session("talks"))["id"]
            streaming = trio.Event()
            first: list[TurnFollower] = []

            async def first_turn() -> None:
                def on_event(event: StreamEvent) -> None:
                    if event.type == "response.output_text.delta":
                        streaming.set()

                session = await api.session(sid)
                first.append(
                    await run_turn(
                        api,
                        sid,
                        str(session["last_event_id"]),
                        "first",
                        on_event=on_event,
                        decide=None,  # type: ignore[arg-type]
                    )
                )

            nursery.start_soon(first_turn)
            await streaming.wait()
            send = await trio.run_process(
                [
                    *(sys.executable, "-m", "corral", "send", "--state-dir", str(host.state_dir)),
                    *("--session", sid, "--timeout", "30", "--json", "second"),
                ],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
    assert send.returncode == 0, send.stderr.decode()
    second = json.loads(send.stdout)
    assert second["status"] == "idle"
    assert json.loads(second["text"]) == [
        ["user", "first"],
        ["assistant", FIRST_ANSWER],
        ["user", "second"],
    ]
    deltas = [e for e in second["events"] if e["type"] == "response.output_text.delta"]
    assert "".join(e["delta"] for e in deltas) == second["text"], "only its own turn's text"
    statuses = [e["status"] for e in second["events"] if e["type"] == "session.status"]
    assert statuses[-1] == "idle" and statuses.count("idle") == 1
    assert first[0].text == FIRST_ANSWER


def _policy_in_flight(host: HostProcess) -> list[dict[str, Any]]:
    [box] = host.ask("mailboxes", actor="policy", peek=10)["mailboxes"]
    return [p for p in box.get("peek", []) if p["type"] == "policy.evaluate"]


@pytest.mark.chaos
async def test_e4_an_interrupt_cancels_an_llm_request_evaluation_the_server_holds(
    host_factory, server, tmp_path: Path
) -> None:
    """The server holds a turn's PHASE_LLM_REQUEST evaluation (an ASK nobody has answered):
    an interrupt ends the turn once, and the policy actor lets the evaluation go at once
    instead of holding it (in flight in its mailbox) until the server gives up."""
    from tests.integration._gateway import fake_gateway

    url = json.dumps(server.base_url)
    host = host_factory(
        "[liveness]\ninterval_s = 0.5\nliveness = 10\n"
        + f'[actors.dispatch.options]\nserver_url = {url}\nsubscribers = ["test-gateway"]\n'
        + f"[actors.policy.options]\nserver_url = {url}\n"
    ).start()
    server.fail("POST", r"/v1/sessions/.*/policies/evaluate", mode="hang")
    agent_id = server.add_agent(
        "name: held\nexecutor:\n  harness: openai-agents\n  model: gpt-x\n"
        "  auth: {type: api_key, api_key: k, base_url: 'http://127.0.0.1:9'}\n"
    )
    sid = server.add_session(agent_id)["id"]
    async with fake_gateway(host.endpoint) as gw:
        await gw.init(sid, agent_id)
        await gw.message(sid, "go")
        await trio.to_thread.run_sync(
            lambda: wait_until(lambda: _policy_in_flight(host), 30, "the held evaluation")
        )
        reply = await gw.request("POST", f"/v1/sessions/{sid}/events", {"type": "interrupt"})
        assert reply.status == 204
        assert await gw.until_status(sid, timeout=30) == ["running", "idle"]
        await trio.to_thread.run_sync(
            lambda: wait_until(lambda: not _policy_in_flight(host), 10, "the evaluation let go")
        )
        assert gw.statuses(sid) == ["running", "idle"]
    host.stop()


@pytest.mark.chaos
async def test_d23_the_history_after_a_tool_turn_is_the_same_with_or_without_a_restart(
    asks_host,
) -> None:
    """Warm (no restart), cold (dispatch killed between the turns), killed mid-tool and
    mid-stream: the next turn is given the same history each time, tool call and output
    included, as omnigent's runner gives it from the server's items."""
    host = await trio.to_thread.run_sync(asks_host)

    async def history_after(kill: str | None) -> list[list[str]]:
        async with ControlPlane(host.state_dir) as api:
            sid = (await api.create_session("tools"))["id"]
            killed = []

            async def on_item(event: StreamEvent) -> None:
                item = event.data.get("item") or {}
                mid_tool = kill == "mid-tool" and item.get("status") == "in_progress"
                mid_stream = kill == "mid-stream" and event.type == "response.output_text.delta"
                if (mid_tool or mid_stream) and not killed:
                    killed.append(event.id)
                    await _kill9(host, "dispatch")

            first = await _turn_with(api, sid, "first", on_item)
            assert (first.status, first.text) == ("idle", "Let me look. Done.")
            assert _terminal_edges(first) == ["idle"]
            outputs = [
                e["item"]["output"]
                for e in first.events
                if e["type"] == "response.output_item.done"
                and e["item"]["type"] == "function_call_output"
            ]
            assert len(outputs) == 1 and "looked" in outputs[0], "the tool ran once"
            if kill == "between":
                await _kill9(host, "dispatch")
            assert bool(killed) == (kill in ("mid-tool", "mid-stream"))
            second, _ = await _turn(api, sid, "second")
            assert second.status == "idle"
            return json.loads(second.text)

    with trio.fail_after(150):
        assert await history_after(None) == TOOLS_HISTORY
        assert await history_after("between") == TOOLS_HISTORY
        assert await history_after("mid-tool") == TOOLS_HISTORY
        assert await history_after("mid-stream") == TOOLS_HISTORY
    assert _parked(host) == []


async def _turn_with(api: ControlPlane, sid: str, text: str, on_event: Any) -> TurnFollower:
    """A turn whose events go to an async ``on_event`` as they arrive."""
    session = await api.session(sid)

    async def accept(_event: StreamEvent) -> str:
        return "accept"

    turn = TurnFollower(sid)
    async with trio.open_nursery() as nursery:
        await run_turn(
            api,
            sid,
            str(session["last_event_id"]),
            text,
            on_event=lambda e: nursery.start_soon(on_event, e),
            decide=accept,
            follower=turn,
        )
    return turn
