"""The whole product, end to end: ``corral up`` with its embedded control plane, the actors,
scripted harness workers, and the terminal client — all real processes on 127.0.0.1.

The chaos cases kill a process with ``kill -9`` in the middle of a turn and check what the
user sees: every event of the turn exactly once (stream ids unique and contiguous, the whole
text, the terminal edge), and a verdict given while the control plane was down still lands.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from corral.cli._client import ControlPlane, StreamEvent, TurnFollower, run_turn
from tests.conftest import (
    FAST_LIVENESS,
    HostProcess,
    corral,
    kill_host,
    processes_of,
    wait_until,
)

SLOW_FIRST = "abcdefghijklmnopqrstuvwxyz0123456789"
SLOW_SECOND = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
DEMO_GREETING = "Hello from corral! I am the demo agent. Let me run a command on this runner.\n"
DEMO_APPROVED = (
    "Approved: the turn is done. Every event you saw went through corral's durable mailboxes."
)
DEMO_DECLINED = "Declined: stopping here, nothing else was done."

AGENTS = {
    # ~60 deltas over ~4 s with a tool call between: long enough to kill something mid-turn.
    "slow.yaml": f"""
        name: slow
        executor:
          harness: scripted
          script:
            turns:
              - - {{text: "{SLOW_FIRST}", chunk: 1, delay_ms: 60}}
                - {{tool: sys_os_shell, arguments: {{command: "echo mid-turn"}}}}
                - {{text: "{SLOW_SECOND}", chunk: 1, delay_ms: 60}}
        """,
    "places.yaml": """
        name: places
        executor:
          harness: scripted
          script:
            turns:
              - - {tool: sys_os_shell, arguments: {command: "pwd"}}
                - {echo_places: true}
        """,
    "fails.yaml": """
        name: fails
        executor:
          harness: scripted
          script:
            turns:
              - - {text: "trying. "}
                - {fail: {code: demo_failure, message: "it did not work"}}
        """,
}


def _config(agents_dir: Path, extra: str = "") -> str:
    text = FAST_LIVENESS
    text += "[actors.gateway.options]\nbackoff_base_s = 0.05\nbackoff_cap_s = 0.2\n"
    text += f"[server]\nagents_dirs = [{json.dumps(str(agents_dir))}]\n" + extra
    return text + os.environ.get("CORRAL_TEST_EXTRA_CONFIG", "")


def _host(root: Path, extra: str = "") -> HostProcess:
    agents = root / "agents"
    agents.mkdir(parents=True, exist_ok=True)
    for name, text in AGENTS.items():
        (agents / name).write_text(textwrap.dedent(text))
    return HostProcess(root / "state", _config(agents, extra))


def _start(host: HostProcess) -> HostProcess:
    host.start()
    host.wait_for(lambda s: s["server"] and s["server"]["state"] == "running", 30, "control plane")
    wait_until(lambda: _tunnel_connected(host), 30, "the runner's tunnel")
    return host


def _stop(host: HostProcess) -> None:
    """Stop the host; whatever does not stop in time is killed, so no test leaves processes."""
    try:
        if host.proc is not None and host.proc.poll() is None:
            host.stop()
    finally:
        kill_host(host)


def _server(host: HostProcess) -> dict[str, Any] | None:
    return host.status()["server"]


def _tunnel_connected(host: HostProcess) -> bool:
    return any(t["state"] == "connected" for t in host.status()["tunnels"])


@pytest.fixture(scope="module")
def shared_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostProcess]:
    """One host for the tests that do not kill anything."""
    host = _host(tmp_path_factory.mktemp("e2e"))
    try:
        yield _start(host)
    finally:
        _stop(host)


@pytest.fixture
def fresh_host(tmp_path: Path) -> Iterator[Callable[[], HostProcess]]:
    """A host of its own, for tests that kill parts of it."""
    hosts: list[HostProcess] = []

    def make() -> HostProcess:
        hosts.append(_host(tmp_path))  # registered first: stopped even if it never comes up
        return _start(hosts[-1])

    yield make
    for host in hosts:
        _stop(host)


def _send(host: HostProcess, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return corral("send", "--state-dir", str(host.state_dir), *args, timeout=timeout)


def _check_stream(events: list[dict[str, Any]]) -> list[int]:
    """Every event once, nothing missing: stream ids unique and contiguous; ends at an edge."""
    ids = [e["event_id"] for e in events]
    assert ids == list(range(ids[0], ids[0] + len(ids))), ids
    assert events[-1]["type"] == "session.status"
    return ids


def _types(events: list[dict[str, Any]]) -> list[str]:
    """Event types, with the item type or status that tells them apart."""
    out = []
    for e in events:
        if e["type"] == "response.output_item.done":
            out.append(f"item:{e['item']['type']}")
        elif e["type"] == "session.status":
            out.append(f"status:{e['status']}")
        else:
            out.append(e["type"])
    return out


# --- the product, working --------------------------------------------------------------------


def test_status_shows_the_control_plane_and_agents_list_demo(shared_host: HostProcess) -> None:
    status = json.loads(
        corral("status", "--json", "--state-dir", str(shared_host.state_dir)).stdout
    )
    server = status["server"]
    assert server["state"] == "running" and server["url"].startswith("http://127.0.0.1:")
    assert isinstance(server["pid"], int) and server["pid"] != status["host"]["pid"]
    assert "server" not in [a["name"] for a in status["actors"]]
    # The control plane is a child of the host but not on the bus: it has no mailbox.
    mailboxes = json.loads(
        corral("mailboxes", "--json", "--state-dir", str(shared_host.state_dir)).stdout
    )
    assert "server" not in [m["actor"] for m in mailboxes["mailboxes"]]
    out = corral("agents", "--json", "--state-dir", str(shared_host.state_dir))
    assert out.returncode == 0, out.stderr
    agents = {a["name"]: a for a in json.loads(out.stdout)["agents"]}
    assert {"demo", "slow", "fails"} <= set(agents)
    assert (agents["demo"]["harness"], agents["demo"]["model"]) == ("scripted", "scripted")


def test_send_demo_full_turn_with_a_tool_call_and_an_approval(shared_host: HostProcess) -> None:
    out = _send(shared_host, "--agent", "demo", "--approve", "hi", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert (result["status"], result["error"]) == ("idle", None)
    assert result["text"] == DEMO_GREETING + DEMO_APPROVED
    events = result["events"]
    _check_stream(events)
    types = _types(events)
    assert types[0] == "status:running" and types[-1] == "status:idle"
    assert types.count("status:running") == 1 and types.count("status:idle") == 1
    call = types.index("item:function_call")
    output = types.index("item:function_call_output")
    request = types.index("response.elicitation_request")
    resolved = types.index("response.elicitation_resolved")
    completed = types.index("response.completed")
    assert call < output < request < resolved < completed < len(types) - 1
    assert events[call]["item"]["name"] == "sys_os_shell"
    assert json.loads(events[call]["item"]["arguments"]) == {"command": "echo hello from corral"}
    assert "hello from corral" in events[output]["item"]["output"]
    assert events[request]["params"]["message"] == "May I finish this demo turn?"
    assert events[resolved]["elicitation_id"] == events[request]["elicitation_id"]
    # The same session, a second turn: only its own events, declined by default.
    again = _send(shared_host, "--session", result["session_id"], "again", "--json")
    assert again.returncode == 0, again.stderr
    second = json.loads(again.stdout)
    assert second["text"] == DEMO_GREETING + DEMO_DECLINED
    assert second["events"][0]["event_id"] == events[-1]["event_id"] + 1


def test_a_worker_runs_where_its_sessions_tools_run_with_a_home_of_the_sessions_own(
    shared_host: HostProcess,
) -> None:
    """Where a coding-agent CLI harness would run (#18): in the session's tool working
    directory (what ``sys_os_shell`` says ``pwd`` is, so the file browser sees its work), with
    a home directory (0700, under the state dir) that stays the session's across turns and
    is no other session's."""

    def turn(*args: str) -> tuple[str, dict[str, str], str]:
        out = _send(shared_host, *(args or ("--agent", "places")), "go", "--json")
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout)
        (shell,) = [
            e["item"]["output"]
            for e in result["events"]
            if e.get("item", {}).get("type") == "function_call_output"
        ]
        return result["session_id"], json.loads(result["text"]), json.loads(shell)["stdout"]

    session, places, pwd = turn()
    assert places["workdir"] == pwd.strip()
    home = Path(places["cli_home"])
    assert shared_host.state_dir in home.parents
    assert home.is_dir() and home.stat().st_mode & 0o777 == 0o700
    _, again, _ = turn("--session", session)
    assert again == places
    other, elsewhere, other_pwd = turn()
    assert other != session
    assert elsewhere["cli_home"] != places["cli_home"]
    assert elsewhere["workdir"] == other_pwd.strip() != places["workdir"]


def test_p_ask_rule_of_the_control_plane_prompts_before_the_tool_runs(tmp_path: Path) -> None:
    """Issue #8 item 7: a ``[[server.policies]]`` ask rule drives the runner's gate, so the
    client is asked before the tool runs, and the approval runs it."""
    rule = (
        '[[server.policies]]\ntool = "sys_os_*"\naction = "ask"\n'
        'message = "The demo wants a shell. OK?"\n'
    )
    host = _host(tmp_path, rule)
    try:
        _start(host)
        out = _send(host, "--agent", "demo", "--approve", "hi", "--json")
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout)
        assert result["status"] == "idle", result
        events = result["events"]
        _check_stream(events)
        asks = [e for e in events if e["type"] == "response.elicitation_request"]
        assert [a["params"]["message"] for a in asks] == [
            "The demo wants a shell. OK?",
            "May I finish this demo turn?",
        ]
        types = _types(events)
        first_ask = types.index("response.elicitation_request")
        output = types.index("item:function_call_output")
        assert first_ask < types.index("response.elicitation_resolved") < output
        assert "hello from corral" in events[output]["item"]["output"]
        declined = _send(host, "--agent", "demo", "--decline", "hi", "--json")
        outputs = [
            e["item"]["output"]
            for e in json.loads(declined.stdout)["events"]
            if e["type"] == "response.output_item.done"
            and e["item"]["type"] == "function_call_output"
        ]
        assert "declined" in json.loads(outputs[0])["error"]
    finally:
        _stop(host)


def test_send_streams_text_without_json(shared_host: HostProcess) -> None:
    out = _send(shared_host, "hi")  # the default agent is demo
    assert out.returncode == 0, out.stderr
    assert out.stdout == DEMO_GREETING + DEMO_DECLINED + "\n"
    assert 'tool: sys_os_shell {"command": "echo hello from corral"}' in out.stderr
    assert "declined (--decline)" in out.stderr


def test_failing_agent_exits_1_with_its_error(shared_host: HostProcess) -> None:
    out = _send(shared_host, "--agent", "fails", "go", "--json")
    assert out.returncode == 1, out.stderr
    result = json.loads(out.stdout)
    assert result["status"] == "failed"
    assert result["error"]["code"] == "demo_failure"
    assert "it did not work" in result["error"]["message"]
    assert result["text"] == "trying. "
    assert _types(result["events"])[-1] == "status:failed"
    assert "demo_failure" in out.stderr


def test_bad_client_input(shared_host: HostProcess) -> None:
    out = _send(shared_host, "--agent", "no-such-agent", "hi", "--json")
    assert out.returncode == 1
    assert json.loads(out.stdout)["error"]["code"] == "not_found"  # the one document (#19)
    assert "unknown agent 'no-such-agent'" in out.stderr and "demo" in out.stderr
    out = _send(shared_host, "--session", "0123456789abcdef0123456789abcdef", "hi")
    assert out.returncode == 1
    assert "unknown session" in out.stderr
    out = _send(shared_host, "--agent", "demo", "--session", "x", "hi")
    assert out.returncode == 2


def test_chat_through_a_pipe(shared_host: HostProcess) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "corral", "chat", "--agent", "demo"],
        input="hi\ny\n",
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "CORRAL_STATE_DIR": str(shared_host.state_dir)},
    )
    assert proc.returncode == 0, proc.stderr
    assert 'tool: sys_os_shell {"command": "echo hello from corral"}' in proc.stdout
    assert "output: exit 0: hello from corral" in proc.stdout
    assert "approval requested: May I finish this demo turn?" in proc.stdout
    assert "approve? [y/N] " + DEMO_APPROVED in proc.stdout


# --- chaos -----------------------------------------------------------------------------------


@pytest.mark.chaos
def test_gateway_kill9_mid_stream_client_sees_every_event_once(fresh_host) -> None:
    host = fresh_host()
    url = _server(host)["url"]  # type: ignore[index]
    gateway_pid = host.actor("gateway")["pid"]
    send = subprocess.Popen(
        [sys.executable, "-m", "corral", "send", "--agent", "slow", "go", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "CORRAL_STATE_DIR": str(host.state_dir)},
    )
    try:

        def streamed() -> int:
            auth = host.client_headers()
            sessions = httpx.get(f"{url}/v1/sessions", headers=auth, timeout=5).json()["data"]
            return max((s["last_event_id"] for s in sessions if s["agent"] == "slow"), default=0)

        at_kill = wait_until(lambda: (n := streamed()) >= 8 and n, 30, "the turn to stream")
        os.kill(gateway_pid, signal.SIGKILL)
        out, err = send.communicate(timeout=90)
    finally:
        if send.poll() is None:
            send.kill()
            send.wait(10)
    assert send.returncode == 0, err
    result = json.loads(out)
    assert result["status"] == "idle"
    assert result["text"] == SLOW_FIRST + SLOW_SECOND
    ids = _check_stream(result["events"])
    assert ids[0] < at_kill < ids[-1], "the gateway died in the middle of the turn"
    deltas = [e["delta"] for e in result["events"] if e["type"] == "response.output_text.delta"]
    assert len(deltas) == len(SLOW_FIRST + SLOW_SECOND)
    gateway = host.actor("gateway")
    assert gateway["restarts"] >= 1 and gateway["pid"] != gateway_pid
    assert gateway["last_exit"]["code"] == -9


@pytest.mark.chaos
async def test_control_plane_kill9_while_parked_on_an_approval(fresh_host) -> None:
    host = await trio.to_thread.run_sync(fresh_host)
    before = await trio.to_thread.run_sync(_server, host)
    assert before is not None
    killed: list[int] = []

    async def kill_the_plane_then_accept(event: StreamEvent) -> str:
        # The turn is parked on this approval: take the control plane down under it, and
        # answer while it is gone — the client retries until the restarted plane takes it.
        os.kill(before["pid"], signal.SIGKILL)
        killed.append(before["pid"])
        return "accept"

    seen: list[StreamEvent] = []
    with trio.fail_after(90):
        async with ControlPlane(host.state_dir) as api:
            session = await api.create_session("demo")
            turn = await run_turn(
                api,
                session["id"],
                str(session["last_event_id"]),
                "hi",
                on_event=seen.append,
                decide=kill_the_plane_then_accept,
                follower=TurnFollower(session["id"]),
            )
    assert killed, "the turn never asked for the approval"
    assert (turn.status, turn.error) == ("idle", None)
    assert turn.text == DEMO_GREETING + DEMO_APPROVED
    _check_stream(turn.events)
    assert [e.id for e in seen] == [str(e["event_id"]) for e in turn.events]
    types = _types(turn.events)
    assert types.index("response.elicitation_request") < types.index(
        "response.elicitation_resolved"
    )
    after = await trio.to_thread.run_sync(_server, host)
    assert after is not None and after["state"] == "running"
    assert after["pid"] != before["pid"] and after["restarts"] >= 1
    assert after["url"] == before["url"], "a restart keeps the port"
    assert after["last_exit"]["code"] == -9


@pytest.mark.chaos
def test_host_stop_and_kill9_leave_no_control_plane_behind(fresh_host) -> None:
    host = fresh_host()
    plane = _server(host)["pid"]  # type: ignore[index]
    host.kill9()
    wait_until(lambda: not processes_of(host.state_dir), 15, "the control plane to die too")
    out = corral("send", "hi", "--state-dir", str(host.state_dir))
    assert out.returncode == 3 and "no running host found" in out.stderr
    with contextlib.suppress(FileNotFoundError):
        stat = Path(f"/proc/{plane}/stat").read_text()
        assert stat.rsplit(")", 1)[1].split()[0] == "Z"


def test_a_control_plane_that_cannot_start_stops_the_host_with_its_reason(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        host = HostProcess(
            tmp_path / "state",
            FAST_LIVENESS + f"[supervisor]\nintensity = 1\n[server]\nport = {port}\n",
        )
        host.start(wait=False)
        assert host.proc is not None
        try:
            code = host.proc.wait(60)
        finally:
            _stop(host)
    assert code == 1
    log = host.log()
    assert "the embedded control plane restarted more than 1 times" in log
    assert str(port) in log, "the control plane's own reason is in the log"
    assert processes_of(host.state_dir) == []
