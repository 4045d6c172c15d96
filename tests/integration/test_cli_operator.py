"""An operator's CLI that acts (issue #19 item 3), typed as a user types it against real
hosts: ``corral sessions``, ``dead-letters requeue|purge``, ``elicitations resolve|cancel``,
ids taken by a unique prefix (an ambiguous one exits 2 naming the candidates, an unknown one
exits 1 naming it), ``status`` showing tunnels and workers, and one way to fail: one
``error: ...`` line on stderr and, under ``--json``, one ``{"error": {code, message}}``
document on stdout, whatever the verb."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from corral.bus import open_peer
from corral.cli._client import ControlPlane, run_turn
from corral.cli._sse import StreamEvent
from corral.config import LivenessSettings
from tests._echo import EchoCrash, EchoSleep
from tests.conftest import FAST_LIVENESS, HostProcess, corral, kill_host, wait_until
from tests.fake_tunnel_server import FakeTunnelServer
from tests.integration._plane_host import plane_host, start
from tests.integration.test_gateway import host_config, running

#: The dead-letter tests crash the test-only echo actor (tests/_echo.py).
RUNS_ECHO = True

FAST = LivenessSettings(interval_s=0.2, liveness=3)

#: An agent whose turn asks a person and says what it was told.
ASKS = """
    name: asks
    executor:
      harness: scripted
      script:
        turns:
          - - {text: "asking. "}
            - {elicit: {message: "May I deploy?"}}
            - {text: "Deployed.", on_decline: "Not deployed."}
    """

#: An agent whose turn runs a shell command, which the control plane's policy asks about.
SHELL = """
    name: shell
    executor:
      harness: scripted
      script:
        turns:
          - - {tool: sys_os_shell, arguments: {command: "echo operator-approved"}}
    """


def _json(out: subprocess.CompletedProcess) -> Any:
    """The one JSON document on stdout (a second line would fail here)."""
    (line,) = out.stdout.splitlines()
    return json.loads(line)


def _failed(out: subprocess.CompletedProcess, code: int, error: str) -> dict[str, Any]:
    """Check a failure told once: exit ``code``, one ``error:`` line on stderr, and under
    ``--json`` one document with ``error.code`` ``error``; returns the document's error."""
    assert out.returncode == code, (out.stdout, out.stderr)
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
    document = _json(out)
    assert document["error"]["code"] == error, document
    assert lines[0] == f"error: {document['error']['message']}" or lines[0].startswith(
        f"error: {document['error']['message']} (see `"
    )
    return dict(document["error"])


# --- dead letters ------------------------------------------------------------------------------


def _dead(host: HostProcess) -> list[dict[str, Any]]:
    return list(host.ask("dead_letters")["dead_letters"])


def _echo_running_after(host: HostProcess, restarts: int) -> dict[str, Any]:
    return host.wait_actor(
        "echo",
        lambda a: a["restarts"] == restarts and a["state"] == "running",
        30,
        f"echo running after {restarts} restarts",
    )


async def test_dead_letters_requeue_delivers_once_and_purge_forgets_for_good(
    host_factory,
) -> None:
    """Two messages that crash their recipient are dead letters after one attempt each;
    ``requeue`` by a unique prefix delivers one exactly once more (one more crash, dead
    again), ``purge`` drops the other, and a restarted host remembers both."""
    host = host_factory(FAST_LIVENESS + "[bus]\nmax_attempts = 1\n").start()
    state = ["--state-dir", str(host.state_dir)]
    async with open_peer("operator-test", host.endpoint, liveness=FAST) as peer:
        await peer.cast("echo", EchoCrash(code=3), durable=True)
        await peer.cast("echo", EchoCrash(code=3), durable=True)
    await trio.to_thread.run_sync(lambda: _echo_running_after(host, 2))
    first, second = (d["id"] for d in wait_until(lambda: len(_dead(host)) == 2 and _dead(host)))
    common = first[: next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)]
    assert common, "ids of one sender share its prefix"

    listed = await trio.to_thread.run_sync(lambda: corral("dead-letters", *state))
    assert listed.returncode == 0, listed.stderr
    assert first in listed.stdout and second in listed.stdout  # whole, never cut

    # Ambiguous: exit 2 naming both; unknown: exit 1 naming it. Nothing is done either way.
    out = corral("dead-letters", "requeue", common, "--json", *state)
    error = _failed(out, 2, "ambiguous_id")
    assert first in error["message"] and second in error["message"]
    out = corral("dead-letters", "purge", "nosuch", second, "--json", *state)
    assert "'nosuch'" in _failed(out, 1, "not_found")["message"]
    assert [d["id"] for d in _dead(host)] == [first, second]

    out = corral("dead-letters", "requeue", first[: len(common) + 1], *state)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"requeued {first}\n"
    await trio.to_thread.run_sync(lambda: _echo_running_after(host, 3))
    again = wait_until(lambda: [d for d in _dead(host) if d["id"] == first], 10, "dead again")
    assert [d["attempts"] for d in again] == [1]
    (echo,) = host.ask("mailboxes", actor="echo")["mailboxes"]
    assert echo["queued"] == echo["in_flight"] == 0  # delivered once, nothing left to retry

    out = corral("dead-letters", "--json", "purge", second, *state)
    assert out.returncode == 0, out.stderr
    assert _json(out) == {"purged": [second], "refused": [], "unknown": []}
    assert [d["id"] for d in _dead(host)] == [first]
    assert host.ask("mailboxes", actor="echo")["mailboxes"][0]["dead_letters"] == 1

    host.stop()
    host.start()
    assert [d["id"] for d in _dead(host)] == [first]
    assert host.actor("echo")["restarts"] == 0  # the requeued one is not delivered again


async def test_a_requeued_dead_letter_is_handled_once(host_factory) -> None:
    """A message whose recipient died while handling it is a dead letter after one attempt;
    requeued, the restarted recipient handles it, once, and nothing is left over."""
    host = host_factory(FAST_LIVENESS + "[bus]\nmax_attempts = 1\n").start()
    async with open_peer("operator-sleep", host.endpoint, liveness=FAST) as peer:
        await peer.cast("echo", EchoSleep(seconds=3), durable=True)

    def in_flight() -> bool:
        (row,) = host.ask("mailboxes", actor="echo")["mailboxes"]
        return bool(row["in_flight"])

    await trio.to_thread.run_sync(lambda: wait_until(in_flight, 30, "the sleep in flight"))
    os.kill(host.actor("echo")["pid"], signal.SIGKILL)
    await trio.to_thread.run_sync(lambda: _echo_running_after(host, 1))
    (dead,) = wait_until(lambda: _dead(host), 10, "the dead letter")
    assert dead["type"] == "echo.sleep" and dead["attempts"] == 1
    handled = host.ask("inspect", actor="echo")["state"]["handled"]

    out = corral(
        "dead-letters", "requeue", dead["id"], "--json", "--state-dir", str(host.state_dir)
    )
    assert out.returncode == 0, out.stderr
    assert _json(out) == {"requeued": [dead["id"]], "refused": [], "unknown": []}

    def done() -> bool:
        (row,) = host.ask("mailboxes", actor="echo")["mailboxes"]
        return row["queued"] == row["in_flight"] == 0

    await trio.to_thread.run_sync(lambda: wait_until(done, 30, "the requeued sleep handled"))
    state = host.ask("inspect", actor="echo")["state"]
    assert state["handled"] == handled + 1
    assert _dead(host) == [] and host.actor("echo")["restarts"] == 1


# --- mailboxes, status ---------------------------------------------------------------------------


def test_mailboxes_take_a_prefix_and_refuse_an_unknown_name(host: HostProcess) -> None:
    state = ["--state-dir", str(host.state_dir)]
    out = corral("mailboxes", "ech", "--json", *state)
    assert out.returncode == 0, out.stderr
    assert [m["actor"] for m in _json(out)["mailboxes"]] == ["echo"]
    out = corral("mailboxes", "nosuch", "--json", *state)
    message = _failed(out, 1, "not_found")["message"]
    assert message.startswith("no mailbox 'nosuch' (mailboxes here: ") and "echo" in message
    out = corral("mailboxes", "nosuch", *state)
    assert out.returncode == 1 and out.stdout == ""


def _up_with_server(host: HostProcess, server: str) -> HostProcess:
    """Start ``corral up --server SERVER`` on ``host``'s state dir and config."""
    host._log = open(host.log_path, "ab")  # noqa: SIM115 - closed by host.stop()
    host.proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "corral", "up", "--state-dir", str(host.state_dir)),
            *("--config", str(host.config_path), "--server", server),
        ],
        stdout=host._log,
        stderr=host._log,
        start_new_session=True,
    )
    return host


def test_status_shows_an_unhealthy_tunnel_without_json(host_factory) -> None:
    """``corral up --server http://127.0.0.1:1``: the default view of ``corral status``
    shows the tunnel reconnecting and why, on one line however long (a pipe)."""
    host = _up_with_server(host_factory(), "http://127.0.0.1:1")
    state = ["--state-dir", str(host.state_dir)]

    def reconnecting() -> dict[str, Any] | None:
        out = corral("status", "--json", *state)
        tunnels = json.loads(out.stdout).get("tunnels") if out.returncode == 0 else None
        return tunnels[0] if tunnels and tunnels[0]["error"] else None

    tunnel = wait_until(reconnecting, 60, "the tunnel's first failure")
    out = corral("status", *state)
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if tunnel["runner_id"] in line)
    assert "http://127.0.0.1:1" in row
    assert any(s in row for s in ("reconnecting", "connecting"))
    assert tunnel["error"] in row  # whole, on the tunnel's own line

    # No control plane: the sessions are dispatch's (none yet), and a verdict has no
    # plane to go through.
    out = corral("sessions", "--json", *state)
    assert out.returncode == 0, out.stderr
    assert _json(out) == {"sessions": [], "source": "host"}
    out = corral("sessions", *state)
    assert out.returncode == 0 and "session" in out.stdout
    out = corral("elicitations", "cancel", "elicit_nosuch", "--json", *state)
    assert "'elicit_nosuch'" in _failed(out, 1, "not_found")["message"]
    host.stop()


async def test_sessions_of_a_host_without_a_control_plane_are_dispatch_s(
    host_factory, tunnels: FakeTunnelServer
) -> None:
    """A host serving another server lists the sessions its dispatch holds: the server made
    one through the tunnel, and ``corral sessions`` shows it, its id whole and a prefix of
    it taken where a session id is."""
    host = host_factory(host_config(tunnels, [{"id": "ops-a"}]))
    async with running(host):
        tunnel = await tunnels.wait_tunnel("ops-a")
        sid = "sess_operator_" + "0123456789abcdef" * 2
        body = {"session_id": sid, "agent_id": "agent_ops", "sub_agent_name": None}
        assert (await tunnel.request("POST", "/v1/sessions", body)).status == 201
        state = ["--state-dir", str(host.state_dir)]
        out = await trio.to_thread.run_sync(lambda: corral("sessions", "--json", *state))
        assert out.returncode == 0, out.stderr
        document = _json(out)
        assert document["source"] == "host"
        (row,) = document["sessions"]
        assert row["session_id"] == sid and row["agent"] == "agent_ops"
        assert row["status"] == "idle" and row["created_at"] > 0
        table = await trio.to_thread.run_sync(lambda: corral("sessions", *state))
        assert sid in table.stdout
        # The server holds the session's stream open: the tunnel's row counts it.
        await tunnel.open_stream(sid)
        out = await trio.to_thread.run_sync(lambda: corral("status", "--json", *state))
        (row,) = _json(out)["tunnels"]
        assert row["responses_open"] == 1, row
        view = await trio.to_thread.run_sync(lambda: corral("status", *state))
        header = next(line for line in view.stdout.splitlines() if "next attempt" in line)
        line = next(line for line in view.stdout.splitlines() if "ops-a" in line)
        assert "streams" in header and " 1 " in line, view.stdout


# --- sessions and elicitations, through the embedded control plane --------------------------------


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A host with its embedded control plane, the ``asks`` and ``shell`` agents and a rule
    that asks before any ``sys_os_*`` tool runs, for the module."""
    host = plane_host(
        tmp_path_factory.mktemp("plane"),
        {"asks": ASKS, "shell": SHELL, "broken": "name: broken\nexector: {harness: scripted}\n"},
        '[[server.policies]]\ntool = "sys_os_*"\naction = "ask"\nmessage = "Run it?"\n',
    )
    try:
        yield start(host)
    finally:
        kill_host(host)


def _parked(host: HostProcess, elicitation_id: str) -> bool:
    return bool(
        host.wait_for(
            lambda e: any(
                r["elicitation_id"] == elicitation_id and r["state"] == "parked"
                for r in e["elicitations"]
            ),
            30,
            f"{elicitation_id} parked",
            op="elicitations",
        )
    )


async def _turn_answered_by(
    host: HostProcess,
    answer: list[str],
    *,
    agent: str = "asks",
    expect: dict[str, Any] | None = None,
) -> tuple[str, str, list[StreamEvent]]:
    """Run one turn of a new session of ``agent`` whose question the operator answers with
    the CLI (``answer`` with the elicitation id's prefix added); returns the session id, the
    elicitation id and the turn's events."""
    seen: list[str] = []
    async with ControlPlane(host.state_dir) as api:
        session = await api.create_session(agent)
        sid = str(session["id"])

        async def decide(event: StreamEvent) -> None:
            eid = str(event.data["elicitation_id"])
            seen.append(eid)
            await trio.to_thread.run_sync(_parked, host, eid)
            # The default view of status shows the turn's worker, busy, its session whole.
            status = await trio.to_thread.run_sync(
                lambda: corral("status", "--state-dir", str(host.state_dir))
            )
            row = next(line for line in status.stdout.splitlines() if sid in line)
            assert "scripted" in row and "busy" in row
            out = await trio.to_thread.run_sync(
                lambda: corral(
                    "elicitations",
                    *answer[:1],
                    eid[:12],
                    *answer[1:],
                    "--json",
                    "--state-dir",
                    str(host.state_dir),
                )
            )
            assert out.returncode == 0, out.stderr
            document = _json(out)
            assert document["elicitation_id"] == eid and document["session_id"] == sid
            if expect is not None:
                assert {k: document[k] for k in expect} == expect
            return None  # answered by the operator, not by this client

        events: list[StreamEvent] = []
        with trio.fail_after(60):
            turn = await run_turn(
                api,
                sid,
                str(session.get("last_event_id")),
                "go",
                on_event=events.append,
                decide=decide,
            )
    assert turn.status == "idle", turn.error
    (eid,) = seen
    return sid, eid, events


def _text(events: list[StreamEvent]) -> str:
    return "".join(str(e.data["delta"]) for e in events if e.type == "response.output_text.delta")


async def test_resolve_accept_lets_the_waiting_turn_go_on_once(plane: HostProcess) -> None:
    """``elicitations resolve ID --accept`` (ID a prefix) answers as the server's approval
    event does: the turn goes on with the yes; a second verdict exits 1 already_resolved."""
    state = ["--state-dir", str(plane.state_dir)]
    _, eid, events = await _turn_answered_by(
        plane, ["resolve", "--accept"], expect={"action": "accept"}
    )
    assert _text(events) == "asking. Deployed."
    out = corral("elicitations", "resolve", eid, "--decline", "--json", *state)
    assert eid in _failed(out, 1, "already_resolved")["message"]
    out = corral("elicitations", "cancel", eid, *state)
    assert out.returncode == 1 and out.stderr == f"error: elicitation {eid} is already resolved\n"
    listed = _json(corral("elicitations", "--json", *state))["elicitations"]
    assert [r["state"] for r in listed if r["elicitation_id"] == eid] == ["resolved"]


async def test_resolve_decline_and_cancel_end_the_question_with_a_no(plane: HostProcess) -> None:
    _, _, declined = await _turn_answered_by(
        plane, ["resolve", "--decline"], expect={"action": "decline"}
    )
    assert _text(declined) == "asking. Not deployed."
    _, _, cancelled = await _turn_answered_by(plane, ["cancel"], expect={"action": "cancel"})
    assert _text(cancelled) == "asking. Not deployed."


async def test_resolve_answers_a_tool_call_the_policy_asked_about(plane: HostProcess) -> None:
    """A ``[[server.policies]]`` ask rule parks the tool call in the policy actor; the
    operator's accept runs it, as a person's in the server's UI would."""
    _, eid, events = await _turn_answered_by(
        plane, ["resolve", "--accept"], agent="shell", expect={"action": "accept"}
    )
    rows = _json(corral("elicitations", "--json", "--state-dir", str(plane.state_dir)))
    (row,) = [r for r in rows["elicitations"] if r["elicitation_id"] == eid]
    assert row["owner"] == "policy"
    outputs = [
        str(e.data["item"].get("output"))
        for e in events
        if e.type == "response.output_item.done"
        and e.data["item"].get("type") == "function_call_output"
    ]
    assert len(outputs) == 1 and "operator-approved" in outputs[0]


def test_resolve_needs_a_verdict_and_an_id_it_knows(plane: HostProcess) -> None:
    state = ["--state-dir", str(plane.state_dir)]
    out = corral("elicitations", "resolve", "elicit_", "--json", *state)
    _failed(out, 2, "usage")
    out = corral("elicitations", "resolve", "nosuch", "--accept", "--json", *state)
    assert "'nosuch'" in _failed(out, 1, "not_found")["message"]


async def test_sessions_lists_the_control_plane_s_and_send_takes_a_prefix(
    plane: HostProcess,
) -> None:
    state = ["--state-dir", str(plane.state_dir)]
    async with ControlPlane(plane.state_dir) as api:
        made = str((await api.create_session("asks", title="for the list"))["id"])
    out = corral("sessions", "--json", *state)
    assert out.returncode == 0, out.stderr
    document = _json(out)
    assert document["source"] == "control_plane"
    row = next(s for s in document["sessions"] if s["session_id"] == made)
    assert row["agent"] == "asks" and row["title"] == "for the list"
    assert row["status"] == "idle" and row["parent_session_id"] is None
    table = corral("sessions", *state)
    assert table.returncode == 0 and made in table.stdout  # the whole id

    out = corral("send", "--session", made[:10], "go", "--json", *state)
    assert out.returncode == 0, out.stderr
    sent = _json(out)
    assert sent["session_id"] == made and sent["text"] == "asking. Not deployed."
    out = corral("send", "--session", "nosuch", "go", "--json", *state)
    assert "unknown session 'nosuch'" in _failed(out, 1, "not_found")["message"]


def test_agents_check_fails_with_one_line_after_the_table(plane: HostProcess) -> None:
    out = corral("agents", "--check", "--state-dir", str(plane.state_dir))
    assert out.returncode == 1
    assert "broken" in out.stdout and "invalid" in out.stdout  # the table says which, why
    assert out.stderr == "error: 1 agent file(s) are invalid\n"


# --- one way to fail ------------------------------------------------------------------------------

#: Every verb that asks a host, as typed, each with --json.
ASKING = [
    ["status"],
    ["mailboxes"],
    ["mailboxes", "echo"],
    ["dead-letters"],
    ["dead-letters", "requeue", "abc"],
    ["dead-letters", "purge", "abc"],
    ["elicitations"],
    ["elicitations", "resolve", "abc", "--accept"],
    ["elicitations", "cancel", "abc"],
    ["sessions"],
    ["subagents"],
    ["agents"],
    ["send", "hi"],
]


@pytest.mark.parametrize("verb", ASKING, ids=lambda v: " ".join(v))
def test_no_host_is_one_json_document_and_one_line(tmp_path: Path, verb: list[str]) -> None:
    """No host: exit 3, ``no_host``, the same wording everywhere, on one line even when the
    state dir's path is far longer than 80 columns (a pipe is never wrapped)."""
    nowhere = tmp_path / ("a-long-directory-name-" * 5) / "state"
    out = corral(*verb, "--json", "--state-dir", str(nowhere))
    error = _failed(out, 3, "no_host")
    assert error["message"].startswith(f"no running host found on {nowhere}")


def test_usage_errors_are_one_document_too(tmp_path: Path) -> None:
    out = corral("mailboxes", "--peek", "lots", "--json", "--state-dir", str(tmp_path))
    assert "--peek" in _failed(out, 2, "usage")["message"]
    out = corral("dead-letters", "requeue", "--json", "--state-dir", str(tmp_path))
    _failed(out, 2, "usage")
    out = corral("token", "--json", "--state-dir", str(tmp_path))
    _failed(out, 1, "no_credential")
