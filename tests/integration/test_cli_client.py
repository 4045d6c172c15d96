"""The terminal client and ``corral up``'s flags, without the real control plane.

Turn following and rendering run over recorded event lists (the shapes of PROTOCOL_FACTS.md
§ii.6). The HTTP side runs against :class:`FakePlane`, a few-route stand-in for the control
plane's client API that can drop streams and replay events, so reconnects and exactly-once
delivery are tested on their own; ``tests/integration/test_e2e.py`` runs the real thing.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from click.testing import CliRunner
from rich.console import Console

from corral.actors._actor_specs import ActorSpecs
from corral.actors._control import request
from corral.actors._control_plane import wants_control_plane
from corral.actors.host import Host
from corral.cli import cli
from corral.cli._chat import (
    Line,
    TurnView,
    describe,
    format_arguments,
    summarize_output,
)
from corral.cli._client import (
    ApiError,
    ControlPlane,
    NoControlPlane,
    SseParser,
    StreamEvent,
    TurnFollower,
    locate,
    run_turn,
)
from corral.cli._repl import LineReader, chat_loop
from corral.cli._up import server_runner, with_workspace
from corral.config import Config, RunnerSettings, parse_config
from corral.instance import Instance
from corral.runners import resolve_runner_ids
from corral.server_client import runner_id_for_token
from tests.conftest import FAST_LIVENESS, corral, processes_of, wait_until

# --- recorded events -------------------------------------------------------------------------

CALL = {
    "id": "fc_1",
    "type": "function_call",
    "status": "in_progress",
    "name": "sys_os_shell",
    "arguments": '{"command": "echo hello from corral"}',
    "call_id": "call_1",
}
OUTPUT = {
    "id": "fco_1",
    "type": "function_call_output",
    "call_id": "call_1",
    "output": '{"stdout": "hello from corral\\n", "stderr": "", "exit_code": 0}',
    "status": "completed",
}
ELICIT = {
    "elicitation_id": "elicit_1",
    "params": {"message": "May I finish?", "requestedSchema": {"type": "object"}},
}


def ev(n: int, kind: str, **data: Any) -> StreamEvent:
    return StreamEvent(id=str(n), type=kind, data={"type": kind, **data})


def approval_turn() -> list[StreamEvent]:
    """The approval scenario of §ii.6, as the control plane's stream numbers it."""
    return [
        ev(11, "session.terminal_pending", pending=True),
        ev(12, "session.status", status="running"),
        ev(13, "response.in_progress", response={"id": "resp_1", "status": "in_progress"}),
        ev(14, "response.output_text.delta", delta="Hello "),
        ev(15, "response.output_item.done", item=CALL),
        ev(16, "response.output_item.done", item={**CALL, "status": "completed"}),
        ev(17, "response.output_item.done", item=OUTPUT),
        ev(18, "response.elicitation_request", **ELICIT),
        ev(19, "response.elicitation_resolved", elicitation_id="elicit_1"),
        ev(20, "response.output_text.delta", delta="done."),
        ev(21, "response.completed", response={"id": "resp_1", "status": "completed"}),
        ev(22, "session.status", status="idle"),
    ]


# --- SSE parsing -----------------------------------------------------------------------------


def test_sse_parser_frames_comments_and_ids() -> None:
    lines = [
        ": keepalive",
        "",
        "id: 7",
        "event: session.status",
        'data: {"type": "session.status", "status": "running"}',
        "",
        "id: 8",
        'data: {"type": "response.output_text.delta",',
        'data:  "delta": "hi"}',
        "",
        "data: not json",
        "",
        "event: custom",
        "data: [1, 2]",
        "",
    ]
    parser = SseParser()
    events = [e for e in (parser.feed(line) for line in lines) if e is not None]
    assert [(e.id, e.type) for e in events] == [
        ("7", "session.status"),
        ("8", "response.output_text.delta"),
        ("8", "message"),  # the id carries over, as SSE says
        ("8", "custom"),
    ]
    assert events[0].data["status"] == "running"
    assert events[1].data["delta"] == "hi"
    assert events[2].data == {"data": "not json"}
    assert events[3].data == {"data": [1, 2]}


# --- following a turn ------------------------------------------------------------------------


def test_follower_collects_a_whole_turn() -> None:
    turn = TurnFollower("s1")
    fed = [turn.feed(e) for e in approval_turn()]
    assert all(fed) and turn.done
    result = turn.result()
    assert result["session_id"] == "s1"
    assert (result["status"], result["text"], result["error"]) == ("idle", "Hello done.", None)
    assert [e["event_id"] for e in result["events"]] == list(range(11, 23))
    assert result["events"][1] == {"event_id": 12, "type": "session.status", "status": "running"}
    assert turn.last_id == "22"
    # Nothing after the terminal edge belongs to the turn.
    assert not turn.feed(ev(23, "session.status", status="running"))
    assert len(turn.events) == 12


def test_follower_drops_replays_after_a_reconnect() -> None:
    events = approval_turn()
    turn = TurnFollower("s1")
    for e in events[:6]:
        turn.feed(e)
    # A reconnect replays from an older cursor: every repeat is dropped, in any order.
    replayed = [turn.feed(e) for e in [events[3], events[5], *events[4:]]]
    assert replayed[:3] == [False, False, False]
    assert [e["event_id"] for e in turn.events] == list(range(11, 23))
    assert turn.text == "Hello done."


def test_follower_failed_turn_takes_the_error_of_its_edge() -> None:
    error = {"code": "scripted_failure", "message": "boom"}
    turn = TurnFollower("s1")
    for e in [
        ev(1, "session.status", status="running"),
        ev(2, "response.output_text.delta", delta="partial"),
        ev(3, "response.failed", response={"status": "failed", "error": error}),
        ev(4, "session.status", status="failed", error=error),
    ]:
        turn.feed(e)
    assert (turn.status, turn.error, turn.text) == ("failed", error, "partial")
    # An edge without its error still says why, from response.failed.
    turn = TurnFollower("s1")
    for e in [
        ev(1, "session.status", status="running"),
        ev(2, "response.failed", error=error),
        ev(3, "session.status", status="failed"),
    ]:
        turn.feed(e)
    assert turn.error == error


def test_follower_waits_for_running_and_spans_continuations() -> None:
    turn = TurnFollower("s1")
    # The tail of an earlier turn (its edge came before our running) does not end ours.
    turn.feed(ev(1, "session.status", status="idle"))
    assert not turn.done
    # A buffered follow-up runs on with no idle in between (§ii.6 "buffered").
    for e in [
        ev(2, "session.status", status="running"),
        ev(3, "response.output_text.delta", delta="a"),
        ev(4, "response.completed"),
        ev(5, "session.status", status="waiting"),
        ev(6, "session.status", status="running"),
        ev(7, "response.output_text.delta", delta="b"),
        ev(8, "response.completed"),
    ]:
        turn.feed(e)
    assert not turn.done
    turn.feed(ev(9, "session.status", status="idle"))
    assert (turn.done, turn.status, turn.text) == (True, "idle", "ab")
    # Interrupted: the first of two idle edges ends it (§ii.6 "interrupt").
    turn = TurnFollower("s2")
    for e in [ev(1, "session.status", status="running"), ev(2, "session.status", status="idle")]:
        turn.feed(e)
    assert turn.done and not turn.feed(ev(3, "session.status", status="idle"))


def test_follower_ends_when_the_runner_refused_its_message() -> None:
    """The message POST is answered ``queued`` at once (PROTOCOL_0_19 §C.1): a refusal comes
    only as ``session.delivery_failed``, and must end the turn, not leave it waiting."""
    turn = TurnFollower("s1", item_id="item_2")
    other = ev(1, "session.delivery_failed", item_id="item_1", status=409, detail="old one")
    turn.feed(other)
    assert not turn.done
    turn.feed(ev(2, "session.delivery_failed", item_id="item_2", status=409, detail="no harness"))
    assert (turn.done, turn.status) == (True, "failed")
    assert turn.error == {"code": "delivery_failed", "message": "no harness"}


def test_describe_a_refused_message_and_verdict() -> None:
    def failed(**data: Any) -> StreamEvent:
        return StreamEvent(id="1", type="session.delivery_failed", data=data)

    refused = failed(kind="message", status=409, detail="no harness")
    assert describe(refused) == Line("error", "the runner did not take the message: no harness")
    verdict = failed(kind="approval", status=503, detail=None)
    assert describe(verdict) == Line("error", "the runner did not take the verdict: HTTP 503")


def test_api_errors_in_both_shapes() -> None:
    def error_of(body: Any) -> tuple[str, str]:
        response = httpx.Response(404, json=body)
        error = ApiError.from_response("GET", "/v1/x", response)
        return error.error, error.detail

    assert error_of({"error": "not_found", "detail": "No session."}) == ("not_found", "No session.")
    assert error_of({"error": {"code": "not_found", "message": "Gone."}}) == ("not_found", "Gone.")


# --- how a turn looks ------------------------------------------------------------------------


def test_describe_each_kind_of_event() -> None:
    kinds = [(line.kind, line.text) if line else None for line in map(describe, approval_turn())]
    assert kinds == [
        None,
        None,
        None,
        ("text", "Hello "),
        ("tool", 'sys_os_shell {"command": "echo hello from corral"}'),
        ("tool", 'sys_os_shell {"command": "echo hello from corral"}'),
        ("output", "exit 0: hello from corral"),
        ("approval", "May I finish?"),
        None,
        ("text", "done."),
        None,
        None,
    ]
    failed = describe(ev(1, "session.status", status="failed", error={"code": "c", "message": "m"}))
    assert failed is not None and (failed.kind, failed.text) == ("error", "turn failed: c: m")


def test_output_and_argument_summaries() -> None:
    assert summarize_output("plain text\nsecond line") == "plain text second line"
    assert summarize_output('{"error": "not available on this runner"}') == (
        "error: not available on this runner"
    )
    assert summarize_output('{"stdout": "", "exit_code": 3}') == "exit 3: (no output)"
    assert summarize_output("") == "(empty)"
    assert summarize_output("x" * 500).endswith("…") and len(summarize_output("x" * 500)) == 160
    assert format_arguments({"a": 1}) == '{"a": 1}'
    assert format_arguments("not json") == "not json"


def _console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=200, color_system=None, highlight=False), buf


def test_turn_view_streams_text_and_shows_each_tool_call_once() -> None:
    console, buf = _console()
    view = TurnView(console)
    for e in approval_turn():
        view.show(e)
    view.end_text()
    assert buf.getvalue() == (
        "Hello \n"
        '  tool: sys_os_shell {"command": "echo hello from corral"}\n'
        "  output: exit 0: hello from corral\n"
        "  approval requested: May I finish?\n"
        "done.\n"
    )


def test_turn_view_keeps_notes_off_the_text_stream() -> None:
    out, text = _console()
    notes, side = _console()
    view = TurnView(out, notes)
    for e in approval_turn():
        view.show(e)
    assert text.getvalue() == "Hello done."
    assert "tool: sys_os_shell" in side.getvalue() and "Hello" not in side.getvalue()


# --- run_turn against a scripted control plane -----------------------------------------------


class ScriptedPlane:
    """``follow`` replays events; records the order of calls."""

    def __init__(self, events: list[StreamEvent], *, drop_after: int | None = None) -> None:
        self.events = events
        self.drop_after = drop_after
        self.calls: list[tuple[Any, ...]] = []

    async def post_message(self, session_id: str, text: str) -> dict[str, Any]:
        self.calls.append(("post", session_id, text))
        return {"queued": True, "item_id": "i1"}

    async def resolve(self, session_id: str, elicitation_id: str, action: str) -> dict[str, Any]:
        self.calls.append(("resolve", elicitation_id, action))
        return {}

    async def follow(self, session_id: str, after: str | None, on_event: Any, *, on_open: Any):
        self.calls.append(("open", after))
        await on_open()
        sent = self.events if self.drop_after is None else self.events[: self.drop_after]
        for e in sent:
            if await on_event(e):
                return
        # "Reconnect" from two events back: the repeats must not reach the caller.
        self.calls.append(("open", sent[-3].id))
        for e in self.events[self.drop_after - 2 :]:  # type: ignore[operator]
            if await on_event(e):
                return


async def test_run_turn_opens_before_posting_and_answers_each_approval_once() -> None:
    events = approval_turn()
    events.insert(8, events[7])  # the request repeated, as a sloppy replay would
    plane = ScriptedPlane(events, drop_after=9)
    seen: list[str] = []
    asked: list[str] = []

    async def decide(event: StreamEvent) -> str:
        asked.append(event.data["elicitation_id"])
        return "accept"

    turn = await run_turn(
        plane,  # type: ignore[arg-type]
        "s1",
        "10",
        "hi",
        on_event=lambda e: seen.append(str(e.id)),
        decide=decide,
    )
    assert plane.calls[:2] == [("open", "10"), ("post", "s1", "hi")]
    assert ("resolve", "elicit_1", "accept") in plane.calls
    assert asked == ["elicit_1"]
    assert seen == [str(n) for n in range(11, 23)]
    assert turn.status == "idle"
    assert turn.item_id == "i1"


# --- a fake control plane over HTTP ----------------------------------------------------------


class FakePlane:
    """The control plane's client API, just enough of it, in a thread.

    Agents: ``demo`` (text, a tool call, an approval, then text per the verdict), ``fail``
    (ends failed) and ``hang`` (streams, then waits for an interrupt). ``drop_first_stream``
    closes the first stream of a session after that many events; ``overlap`` makes every
    reopened stream replay that many events before the cursor.
    """

    def __init__(self, *, drop_first_stream: int | None = None, overlap: int = 0) -> None:
        self.drop_first_stream = drop_first_stream
        self.overlap = overlap
        self.lock = threading.Condition()
        self.sessions: dict[str, dict[str, Any]] = {}
        self.log: list[tuple[str, ...]] = []
        self.open_streams: dict[str, int] = {}
        self.stopping = False
        plane = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if plane.authorized(self):
                    plane.get(self)

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if plane.authorized(self):
                    plane.post(self, body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    @contextlib.contextmanager
    def serving(self, state_dir: Path) -> Iterator[FakePlane]:
        """Serve, with a ``server.json`` in ``state_dir`` that points here."""
        (state_dir / "server").mkdir(parents=True, exist_ok=True)
        (state_dir / "server" / "server.json").write_text(
            json.dumps({"url": self.url, "pid": os.getpid()})
        )
        # The client token, where the real plane keeps it; every call must carry it.
        (state_dir / "server" / "client_token").write_text(self.token + "\n")
        thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            with self.lock:
                self.stopping = True
                self.lock.notify_all()
            self.httpd.shutdown()
            self.httpd.server_close()

    # --- the turn scripts -------------------------------------------------------------------

    def _emit(self, sid: str, *events: dict[str, Any]) -> None:
        with self.lock:
            stream = self.sessions[sid]["events"]
            for e in events:
                stream.append((len(stream) + 1, e))
            self.lock.notify_all()

    def _start(self, sid: str) -> None:
        agent = self.sessions[sid]["agent"]
        running = {"type": "session.status", "status": "running"}
        if agent == "demo":
            self._emit(
                sid,
                running,
                {"type": "response.output_text.delta", "delta": "Hello "},
                {"type": "response.output_item.done", "item": CALL},
                {"type": "response.output_item.done", "item": OUTPUT},
                {"type": "response.elicitation_request", **ELICIT},
            )
        elif agent == "fail":
            error = {"code": "scripted_failure", "message": "boom"}
            self._emit(
                sid,
                running,
                {"type": "response.failed", "error": error},
                {"type": "session.status", "status": "failed", "error": error},
            )
        else:
            self._emit(sid, running, {"type": "response.output_text.delta", "delta": "working"})

    def _verdict(self, sid: str, action: str) -> None:
        text = "Approved." if action == "accept" else "Declined."
        self._emit(
            sid,
            {"type": "response.elicitation_resolved", "elicitation_id": "elicit_1"},
            {"type": "response.output_text.delta", "delta": text},
            {"type": "response.completed"},
            {"type": "session.status", "status": "idle"},
        )

    # --- routes -----------------------------------------------------------------------------

    token = "fake-plane-client-token"

    def authorized(self, h: BaseHTTPRequestHandler) -> bool:
        """Whether the request carries the client token (else it is answered 401)."""
        if h.headers.get("authorization") == f"Bearer {self.token}":
            return True
        self._reply(h, 401, {"error": "unauthorized", "detail": "no client token"})
        return False

    def _reply(self, h: BaseHTTPRequestHandler, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        h.send_response(status)
        h.send_header("content-type", "application/json")
        h.send_header("content-length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def get(self, h: BaseHTTPRequestHandler) -> None:
        parts = h.path.split("?")[0].strip("/").split("/")
        if parts == ["v1", "agents"]:
            agents = [{"name": n, "harness": "scripted", "model": "m"} for n in ("demo", "fail")]
            return self._reply(h, 200, {"agents": agents})
        sid = parts[2] if len(parts) > 2 else ""
        if sid not in self.sessions:
            return self._reply(h, 404, {"error": "unknown_session", "detail": "no such session"})
        if len(parts) == 3:
            return self._reply(h, 200, self._session(sid))
        self._stream(h, sid)

    def _session(self, sid: str) -> dict[str, Any]:
        with self.lock:
            events = self.sessions[sid]["events"]
            last = events[-1][0] if events else 0
        return {"id": sid, "object": "session", "agent": self.sessions[sid]["agent"],
                "status": "idle", "last_event_id": last}  # fmt: skip

    def _stream(self, h: BaseHTTPRequestHandler, sid: str) -> None:
        cursor = int(h.headers.get("last-event-id") or 0)
        session = self.sessions[sid]
        first = session["streams"] == 0
        session["streams"] += 1
        if not first:
            cursor = max(0, cursor - self.overlap)
        self.log.append(("stream", sid, str(cursor)))
        h.send_response(200)
        h.send_header("content-type", "text/event-stream")
        h.send_header("connection", "close")
        h.end_headers()
        with self.lock:
            self.open_streams[sid] = self.open_streams.get(sid, 0) + 1
        sent = 0
        try:
            while True:
                with self.lock:
                    pending = [(n, e) for n, e in session["events"] if n > cursor]
                    if not pending and not self.stopping:
                        self.lock.wait(0.5)
                    if self.stopping:
                        return
                if not pending:
                    h.wfile.write(b": keepalive\n\n")
                    h.wfile.flush()
                    continue
                for n, e in pending:
                    if first and sent == self.drop_first_stream:
                        return  # the connection closes mid-turn
                    frame = f"id: {n}\nevent: {e['type']}\ndata: {json.dumps(e)}\n\n"
                    h.wfile.write(frame.encode())
                    h.wfile.flush()
                    cursor, sent = n, sent + 1
        except OSError:
            return
        finally:
            with self.lock:
                self.open_streams[sid] -= 1
            h.close_connection = True

    def post(self, h: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        parts = h.path.strip("/").split("/")
        if parts == ["v1", "sessions"]:
            if body.get("agent") not in ("demo", "fail", "hang"):
                return self._reply(h, 404, {"error": "unknown_agent", "detail": "no such agent"})
            sid = f"s{len(self.sessions) + 1}"
            self.sessions[sid] = {"agent": body["agent"], "events": [], "streams": 0}
            return self._reply(h, 201, self._session(sid))
        sid = parts[2]
        if parts[3:] == ["events"] and body["type"] == "message":
            with self.lock:
                # The client must be listening before it posts (no race).
                self.log.append(("message", sid, str(self.open_streams.get(sid, 0))))
            self._start(sid)
            return self._reply(h, 202, {"queued": True, "item_id": "item_1"})
        if parts[3:] == ["events"] and body["type"] == "interrupt":
            self.log.append(("interrupt", sid))
            self._emit(sid, {"type": "session.status", "status": "idle"})
            return self._reply(h, 202, {})
        if parts[3] == "elicitations":
            self.log.append(("resolve", sid, body["action"]))
            self._reply(h, 202, {})
            self._verdict(sid, body["action"])
            return None
        return self._reply(h, 404, {"error": "not_found"})


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[FakePlane]:
    fake = FakePlane()
    with fake.serving(tmp_path / "state"):
        yield fake


def _send(state: Path, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return corral("send", "--state-dir", str(state), *args, timeout=timeout)


def test_send_json_full_turn_with_approval(plane: FakePlane, tmp_path: Path) -> None:
    out = _send(tmp_path / "state", "--agent", "demo", "--approve", "hi", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert set(result) == {"session_id", "status", "text", "error", "events"}
    assert (result["status"], result["text"], result["error"]) == ("idle", "Hello Approved.", None)
    assert [e["event_id"] for e in result["events"]] == list(range(1, 10))
    assert [e["type"] for e in result["events"]][-2:] == ["response.completed", "session.status"]
    assert ("message", result["session_id"], "1") in plane.log, "posted with the stream open"
    assert ("resolve", result["session_id"], "accept") in plane.log


def test_send_declines_by_default_and_streams_text(plane: FakePlane, tmp_path: Path) -> None:
    out = _send(tmp_path / "state", "hi")  # the default agent is demo
    assert out.returncode == 0, out.stderr
    assert out.stdout == "Hello Declined.\n"
    assert "tool: sys_os_shell" in out.stderr and "declined (--decline)" in out.stderr
    assert ("resolve", "s1", "decline") in plane.log


def test_send_to_an_existing_session_follows_only_the_new_turn(
    plane: FakePlane, tmp_path: Path
) -> None:
    first = json.loads(_send(tmp_path / "state", "--approve", "one", "--json").stdout)
    out = _send(tmp_path / "state", "--session", first["session_id"], "two", "--json")
    assert out.returncode == 0, out.stderr
    second = json.loads(out.stdout)
    assert second["session_id"] == first["session_id"]
    assert [e["event_id"] for e in second["events"]] == list(range(10, 19))
    assert second["text"] == "Hello Declined."


def test_send_failed_turn_exits_1_with_the_error(plane: FakePlane, tmp_path: Path) -> None:
    out = _send(tmp_path / "state", "--agent", "fail", "hi", "--json")
    assert out.returncode == 1
    result = json.loads(out.stdout)
    assert result["status"] == "failed"
    assert result["error"] == {"code": "scripted_failure", "message": "boom"}
    assert "scripted_failure: boom" in out.stderr
    # Without --json too, the failure is told once: the error line (#19).
    out = _send(tmp_path / "state", "--agent", "fail", "hi")
    assert out.returncode == 1
    told = [line for line in out.stderr.splitlines() if "boom" in line]
    assert len(told) == 1, out.stderr
    assert told[0].startswith("error: session ") and told[0].endswith(": scripted_failure: boom")


def test_send_bad_input(plane: FakePlane, tmp_path: Path) -> None:
    state = tmp_path / "state"
    out = _send(state, "--agent", "nope", "hi", "--json")
    assert out.returncode == 1
    assert "unknown agent 'nope' (agents here: demo, fail)" in out.stderr
    # The one --json document: a turn's shape, failed, with the error (#19).
    assert json.loads(out.stdout) == {
        "session_id": None,
        "status": "failed",
        "text": "",
        "events": [],
        "error": {"code": "not_found", "message": "unknown agent 'nope' (agents here: demo, fail)"},
    }
    out = _send(state, "--session", "missing", "hi")
    assert out.returncode == 1 and "unknown session 'missing'" in out.stderr
    out = _send(state, "--session", "s1", "--agent", "demo", "hi")
    assert out.returncode == 2 and "not both" in out.stderr
    out = _send(state, "--timeout", "0", "hi")
    assert out.returncode == 2


def test_send_timeout_interrupts_and_exits_1(plane: FakePlane, tmp_path: Path) -> None:
    started = time.monotonic()
    out = _send(tmp_path / "state", "--agent", "hang", "--timeout", "1", "hi", "--json")
    assert time.monotonic() - started < 20
    assert out.returncode == 1
    result = json.loads(out.stdout)
    assert result["status"] == "failed" and result["error"]["code"] == "client_timeout"
    assert result["text"] == "working"
    assert "did not end within 1s" in out.stderr
    assert ("interrupt", result["session_id"]) in plane.log


@pytest.mark.parametrize("overlap", [0, 3])
def test_send_sees_every_event_once_across_a_dropped_stream(tmp_path: Path, overlap: int) -> None:
    fake = FakePlane(drop_first_stream=3, overlap=overlap)
    with fake.serving(tmp_path / "state"):
        out = _send(tmp_path / "state", "--approve", "hi", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert [e["event_id"] for e in result["events"]] == list(range(1, 10))
    assert result["text"] == "Hello Approved."
    streams = [entry for entry in fake.log if entry[0] == "stream"]
    assert len(streams) == 2
    assert streams[1][2] == str(3 - overlap), "reopened from the last event seen"


def test_agents_json_and_table(plane: FakePlane, tmp_path: Path) -> None:
    out = corral("agents", "--json", "--state-dir", str(tmp_path / "state"))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {
        "agents": [
            {"name": "demo", "harness": "scripted", "model": "m"},
            {"name": "fail", "harness": "scripted", "model": "m"},
        ],
        "invalid": [],  # the files the control plane did not load (this one lists none)
    }
    out = corral("agents", env={"CORRAL_STATE_DIR": str(tmp_path / "state")})
    assert out.returncode == 0 and "demo" in out.stdout and "scripted" in out.stdout


def test_chat_through_a_pipe(plane: FakePlane, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "corral", "chat", "--state-dir", str(tmp_path / "state")],
        input="hi\ny\n\nagain\nn\n",
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "session s1 with agent demo" in out
    assert out.count('tool: sys_os_shell {"command": "echo hello from corral"}') == 2
    assert out.count("approval requested: May I finish?") == 2
    assert "approve? [y/N] Approved." in out and "approve? [y/N] Declined." in out
    assert [e for e in plane.log if e[0] == "resolve"] == [
        ("resolve", "s1", "accept"),
        ("resolve", "s1", "decline"),
    ]


def _read_until(proc: subprocess.Popen, marker: str, count: int, timeout: float) -> str:
    """Read the process's stdout until ``marker`` appeared ``count`` times (prompts end no
    line, so this reads raw bytes)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    out = ""
    deadline = time.monotonic() + timeout
    while out.count(marker) < count:
        left = deadline - time.monotonic()
        assert left > 0, f"no {marker!r} x{count} in {out!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 4096).decode()
            assert chunk, f"stdout closed before {marker!r} x{count}: {out!r}"
            out += chunk
    return out


def _exit_and_stderr(proc: subprocess.Popen, timeout: float = 20) -> tuple[int, str]:
    """The process's exit code and its stderr, once it exits within ``timeout`` (killed if
    it does not)."""
    try:
        code = proc.wait(timeout)
        assert proc.stderr is not None
        return code, proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


@pytest.mark.parametrize("quit_with", ["eof", "ctrl-c"])
def test_chat_ctrl_c_interrupts_the_turn_then_quits(
    plane: FakePlane, tmp_path: Path, quit_with: str
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "corral", "chat", "--agent", "hang"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "CORRAL_STATE_DIR": str(tmp_path / "state")},
    )
    try:
        assert proc.stdin is not None
        out = _read_until(proc, "you> ", 1, 20)
        proc.stdin.write(b"hi\n")
        proc.stdin.flush()
        out += _read_until(proc, "working", 1, 20)
        proc.send_signal(signal.SIGINT)  # interrupts the turn, which then ends idle
        out += _read_until(proc, "you> ", 1, 20)
        assert ("interrupt", "s1") in plane.log
        if quit_with == "eof":
            proc.stdin.close()
        else:
            proc.send_signal(signal.SIGINT)  # at the prompt: quits
    except BaseException:
        proc.kill()
        proc.wait(10)
        raise
    code, err = _exit_and_stderr(proc)
    assert code == 0, err
    assert "interrupting the turn" in out
    assert "Traceback" not in err


def test_chat_whose_control_plane_is_gone_ends_the_turn_control_plane_unreachable(
    tmp_path: Path,
) -> None:
    # Before, chat left with exit 3 ("no host", as if it had never found one) and no word
    # of the turn; send told the same loss as the turn's failure (exit 1).
    state = tmp_path / "state"
    fake = FakePlane()
    with fake.serving(state):
        proc = subprocess.Popen(
            [sys.executable, "-m", "corral", "chat", "--agent", "hang"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "CORRAL_STATE_DIR": str(state)},
        )
        try:
            assert proc.stdin is not None
            _read_until(proc, "you> ", 1, 20)
            proc.stdin.write(b"hi\n")
            proc.stdin.flush()
            _read_until(proc, "working", 1, 20)
        except BaseException:
            proc.kill()
            raise
    # The plane stopped (its stream ends) and its process is gone, with no host left.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (state / "server" / "server.json").write_text(json.dumps({"url": fake.url, "pid": dead.pid}))
    code, err = _exit_and_stderr(proc)
    assert code == 1, err
    assert "session s1: control_plane_unreachable: no running host found" in err
    assert "the message was stored as item_1 and may still run" in err
    assert "Traceback" not in err


async def test_chat_loop_in_process(plane: FakePlane, tmp_path: Path) -> None:
    lines = iter(["hi", "yes"])

    def answer(prompt: str) -> str:
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None

    console, buf = _console()
    with trio.fail_after(30):
        async with ControlPlane(tmp_path / "state") as api:
            await chat_loop(
                api, LineReader(answer), TurnView(console), session_id=None, agent="demo"
            )
    assert "Hello \n  tool: sys_os_shell" in buf.getvalue()
    assert "Approved." in buf.getvalue()


async def test_chat_loop_quits_on_ctrl_c_at_the_prompt_without_a_keyboard_interrupt(
    plane: FakePlane, tmp_path: Path
) -> None:
    """Ctrl-C at ``you>`` ends the loop as a quit: received by chat, not raised as
    KeyboardInterrupt wherever the main thread is (a quit once went unseen for 20 s)."""
    asked = threading.Event()
    never = threading.Event()

    def blocked(prompt: str) -> str:
        asked.set()
        never.wait(30)  # the read Ctrl-C abandons: it never returns in time
        raise EOFError

    console, buf = _console()
    with trio.fail_after(20):
        async with ControlPlane(tmp_path / "state") as api, trio.open_nursery() as nursery:

            async def ctrl_c_once_asked() -> None:
                await trio.to_thread.run_sync(asked.wait, 10)
                signal.raise_signal(signal.SIGINT)

            nursery.start_soon(ctrl_c_once_asked)
            await chat_loop(
                api, LineReader(blocked), TurnView(console), session_id=None, agent="demo"
            )
    never.set()
    assert "session s1 with agent demo" in buf.getvalue()


# --- no host ---------------------------------------------------------------------------------


def test_no_host_exits_3(tmp_path: Path) -> None:
    state = tmp_path / "nothing"
    for args in (["agents", "--json"], ["send", "hi", "--json"], ["chat"]):
        out = corral(*args, "--state-dir", str(state))
        assert out.returncode == 3, (args, out)
        assert "no running host found" in out.stderr
        if "--json" in args:  # the one error document (#19)
            assert json.loads(out.stdout)["error"]["code"] == "no_host"
        else:
            assert out.stdout == ""


def test_stale_server_file_without_a_host_exits_3(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "server").mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (state / "server" / "server.json").write_text(
        json.dumps({"url": "http://127.0.0.1:9", "pid": dead.pid})
    )
    with pytest.raises(NoControlPlane, match="no running host found"):
        locate(state)
    out = corral("send", "hi", "--state-dir", str(state))
    assert out.returncode == 3 and "no running host found" in out.stderr


# --- corral up: flags ------------------------------------------------------------------------


def test_server_runner_id_order() -> None:
    token = "tok-123"
    derived = runner_id_for_token(token)
    env = {"CORRAL_RUNNER_ID": "from-env", "CORRAL_RUNNER_TOKEN": token}
    url = "https://omnigent.example/prefix"
    assert server_runner(url, "from-flag", env) == RunnerSettings(
        server=url, id="from-flag", token=token
    )
    assert server_runner(url, None, env).id == "from-env"
    assert server_runner(url, None, {"CORRAL_RUNNER_TOKEN": token}).id == derived
    bare = server_runner(url, None, {})
    assert (bare.id, bare.token) == (None, None)


def test_server_runner_stable_id_kept_in_the_state_dir(tmp_path: Path) -> None:
    bare = server_runner("http://127.0.0.1:8000", None, {})
    (first,) = resolve_runner_ids([bare], tmp_path)
    (again,) = resolve_runner_ids([bare], tmp_path)
    assert first.id and first.id == again.id
    assert first.id in (tmp_path / "runner-ids.json").read_text()


def test_up_bad_flags_exit_2(tmp_path: Path) -> None:
    runner = CliRunner()
    state = ["--state-dir", str(tmp_path / "state")]
    cases = [
        (["--runner-id", "r1"], "--runner-id needs --server"),
        (["--server", "not a url"], "--server 'not a url' is not an http(s)://"),
        (["--server", "ftp://x"], "is not an http(s)://"),
        (["--server", "http://127.0.0.1:1", "--runner-id", " r1"], "--runner-id must be"),
    ]
    for args, message in cases:
        result = runner.invoke(cli, ["up", *state, *args], env={"CORRAL_RUNNER_ID": ""})
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output, (args, result.output)
    assert not (tmp_path / "state" / "host.json").exists()


def test_workspace_flag_env_and_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = parse_config({"workspace": str(tmp_path / "from-config")})
    assert with_workspace(Config(), None).workspace is None
    assert with_workspace(config, None).workspace == str(tmp_path / "from-config")
    flag = with_workspace(config, tmp_path / "flag" / "ws")
    assert flag.workspace == str(tmp_path / "flag" / "ws")
    assert (tmp_path / "flag" / "ws").is_dir()
    monkeypatch.chdir(tmp_path)
    assert with_workspace(Config(), Path("rel")).workspace == str(tmp_path / "rel")


def test_up_hands_runners_and_workspace_to_actors(tmp_path: Path) -> None:
    config = parse_config(
        {
            "workspace": str(tmp_path / "ws"),
            "runners": [{"server": "http://a.example", "id": "ra"}],
            "actors": {"gateway": {"options": {"backoff_base_s": 0.1}}},
        }
    )
    runner = server_runner("https://b.example", None, {"CORRAL_RUNNER_TOKEN": "t"})
    host = Host(config, tmp_path / "state", runner=runner)
    assert not wants_control_plane(config, runner)
    specs = ActorSpecs(config, host.instance, host._resolve_runners())
    gateway = specs.child_record("gateway", "x:Y", config.actors["gateway"])["options"]
    assert gateway["backoff_base_s"] == 0.1
    assert [(r["server"], r["id"], r["token"]) for r in gateway["runners"]] == [
        ("http://a.example", "ra", None),
        ("https://b.example", runner_id_for_token("t"), "t"),
    ]
    from corral.config import ActorSettings

    dispatch = specs.child_record("dispatch", "x:Y", ActorSettings())["options"]
    assert dispatch["runners"] == gateway["runners"]
    tools = specs.child_record("tools", "x:Y", ActorSettings())["options"]
    # The tools actor asks each session's server for the session tools' reads (#17).
    assert tools == {"workspace": str(tmp_path / "ws"), "runners": gateway["runners"]}
    # No runner anywhere: the embedded control plane is wanted (unless disabled).
    assert wants_control_plane(Config(), None) is (
        Path(__file__).parents[2].joinpath("corral/server/__main__.py").exists()
    )
    off = parse_config({"server": {"enabled": False}})
    assert not wants_control_plane(off, None)


def test_up_with_server_flag_serves_that_runner_and_no_control_plane(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (tmp_path / "c.toml").write_text(FAST_LIVENESS)
    log = (tmp_path / "up.log").open("ab")
    flags = ["--state-dir", str(state), "--config", str(tmp_path / "c.toml")]
    flags += ["--server", "http://127.0.0.1:9", "--runner-id", "runner-e2e"]
    flags += ["--workspace", str(tmp_path / "ws")]
    proc = subprocess.Popen(
        [sys.executable, "-m", "corral", "up", *flags],
        stdout=log,
        stderr=log,
        start_new_session=True,
        env={**os.environ, "CORRAL_RUNNER_TOKEN": "tok"},
    )
    try:
        control = Instance(state).control_path

        def running() -> dict[str, Any] | None:
            assert proc.poll() is None, (tmp_path / "up.log").read_text()
            try:
                status = request(control, "status")
            except (OSError, RuntimeError, ValueError):
                return None
            # The gateway reports its tunnel once it has tried it, after it is running.
            return status if status["host"]["state"] == "running" and status["tunnels"] else None

        status = wait_until(running, 30, "the host and its tunnel's row")
        assert status["server"] is None
        assert [t["runner_id"] for t in status["tunnels"]] == ["runner-e2e"]
        assert (tmp_path / "ws").is_dir()
        started = time.monotonic()
        out = corral("agents", "--state-dir", str(state))
        assert out.returncode == 3 and "runs no embedded control plane" in out.stderr
        assert time.monotonic() - started < 15, "said at once, not after the whole wait"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
            log.close()
            for pid in processes_of(state):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def _consumed(n: int, item_id: str, runner_status: str | None) -> StreamEvent:
    data = {"item_id": item_id, "type": "message", "runner_status": runner_status}
    return ev(n, "session.input.consumed", data=data)


def test_follower_of_a_message_to_a_busy_session_takes_only_its_own_turn() -> None:
    """Busy (§E.3): the running turn's tail is not this turn's; the next turn is, and it
    ends at its own edge."""
    turn = TurnFollower("s1", item_id="item_2", busy=True)
    fed = [
        turn.feed(e)
        for e in [
            ev(5, "response.output_text.delta", delta="theirs "),
            _consumed(6, "item_2", "buffered"),
            ev(7, "response.output_text.delta", delta="theirs"),
            ev(8, "response.completed"),
            ev(9, "session.status", status="running"),
            ev(10, "response.output_text.delta", delta="mine"),
            ev(11, "response.completed"),
            ev(12, "session.status", status="idle"),
        ]
    ]
    assert fed == [False] * 4 + [True] * 4
    assert (turn.done, turn.status, turn.text) == (True, "idle", "mine")
    assert [e["event_id"] for e in turn.events] == [9, 10, 11, 12]
    # The running turn ended before the message came: its edge, then the message's turn.
    turn = TurnFollower("s1", item_id="item_2", busy=True)
    for e in [
        ev(5, "response.output_text.delta", delta="theirs"),
        ev(6, "session.status", status="idle"),
        ev(7, "session.status", status="running"),
        _consumed(8, "item_2", "accepted"),
        ev(9, "response.output_text.delta", delta="mine"),
        ev(10, "session.status", status="idle"),
    ]:
        turn.feed(e)
    assert (turn.done, turn.text, turn.events[0]["event_id"]) == (True, "mine", 7)


def test_follower_of_a_message_ends_at_the_next_turn_and_skips_another_client_s() -> None:
    """A turn of messages buffered behind this one ends it (no idle between). A turn another
    client started after the cursor was read is dropped once the consumed of this message
    says it waits behind it."""
    turn = TurnFollower("s1", item_id="item_1")
    for e in [
        ev(1, "session.status", status="running"),
        _consumed(2, "item_1", "accepted"),
        ev(3, "response.output_text.delta", delta="a"),
        ev(4, "response.completed"),
    ]:
        assert turn.feed(e)
    assert not turn.feed(ev(5, "session.status", status="running"))
    assert (turn.done, turn.status, turn.text) == (True, "idle", "a")
    turn = TurnFollower("s1", item_id="item_1")
    for e in [
        ev(1, "session.status", status="running"),
        ev(2, "response.output_text.delta", delta="theirs"),
        _consumed(3, "item_1", "buffered"),
        ev(4, "response.failed", error={"code": "x", "message": "y"}),
        ev(5, "session.status", status="failed"),
        ev(6, "session.status", status="running"),
        ev(7, "response.output_text.delta", delta="mine"),
        ev(8, "session.status", status="idle"),
    ]:
        turn.feed(e)
    assert (turn.done, turn.status, turn.text) == (True, "idle", "mine")
    assert [e["event_id"] for e in turn.events] == [6, 7, 8]
