"""``sys_session_send`` through a real host and its embedded control plane (#17): a scripted
parent hands work to a scripted child, the child's answer reaches the parent's inbox exactly
once, and the parent is woken to drain it (PROTOCOL_0_19.md §J; S-01..S-06, S-11..S-15,
S-20, S-22, S-23, P-17, P-19).

The crash tests stop dispatch, or the tools actor, at the points between the child's end and
the delivery (the ``crash_at`` option: the actor exits there as ``kill -9`` stops it, once),
and count the result in the parent's inbox file and the items the parent saw."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import HostProcess, corral, processes_of, wait_until
from tests.integration.test_e2e import _config, _start, _stop

PARENT = """
    spec_version: 1
    name: team
    description: hands work to its helper
    executor:
      harness: scripted
      script:
        turns:
          - - {tool: sys_session_send, arguments: {agent: helper, title: t1, args: "hi child"}}
            - {text: "launched"}
          - - {tool: sys_read_inbox, arguments: {}}
            - {text: "merged"}
    tools:
      agents: [helper]
    """
CHILD = """
    spec_version: 1
    name: helper
    executor:
      harness: scripted
      script:
        turns:
          - - {text: "CHILD_MARKER"}
    """
#: A parent that sends to the same child twice, then by id, then with both modes.
REPEATER = """
    spec_version: 1
    name: repeater
    executor:
      harness: scripted
      script:
        turns:
          - - {tool: sys_session_send, arguments: {agent: helper, title: again, args: "one"}}
            - tool: sys_session_send
              arguments: {agent: helper, title: again, args: {input: "two"}}
            - {tool: sys_session_send, arguments: {session_id: conv_not_mine, args: "three"}}
            - {tool: sys_session_send, arguments: {session_id: x, agent: helper, args: "four"}}
    tools:
      agents: [helper]
    """


#: A parent that fans out to two children and drains once per wake.
FANOUT = """
    spec_version: 1
    name: fanout
    executor:
      harness: scripted
      script:
        turns:
          - - {tool: sys_session_send, arguments: {agent: helper, title: t1, args: "one"}}
            - {tool: sys_session_send, arguments: {agent: helper, title: t2, args: "two"}}
          - - {tool: sys_read_inbox, arguments: {}}
          - - {tool: sys_read_inbox, arguments: {}}
    tools:
      agents: [helper]
    """
#: A child slow enough (about 0.3 s) for a kill to land while it works.
SLOW_CHILD = """
    spec_version: 1
    name: helper
    executor:
      harness: scripted
      script:
        turns:
          - - {text: "CHILD_MARKER", chunk: 2, delay_ms: 50}
    """

#: A child still at work (about 4 s) when the test has both handles.
STEADY_CHILD = SLOW_CHILD.replace("chunk: 2, delay_ms: 50", "chunk: 1, delay_ms: 300")


#: Children that fail, and that work for long (to be interrupted or deleted meanwhile).
FAILING_CHILD = """
    spec_version: 1
    name: helper
    executor:
      harness: scripted
      script:
        turns:
          - - {text: "partial "}
            - {fail: {code: child_broke, message: "the helper broke"}}
    """
LONG_CHILD = """
    spec_version: 1
    name: helper
    executor:
      harness: scripted
      script:
        turns:
          - - {text: "thinking ", repeat: 600, delay_ms: 50}
    """


def _agents(root: Path) -> Path:
    agents = root / "agents"
    for name, child in (("failing", FAILING_CHILD), ("long", LONG_CHILD)):
        (agents / name / "agents" / "helper").mkdir(parents=True)
        parent = PARENT.replace("name: team", f"name: {name}")
        (agents / name / "config.yaml").write_text(textwrap.dedent(parent))
        (agents / name / "agents" / "helper" / "config.yaml").write_text(textwrap.dedent(child))
    for name, child in (("fanout", SLOW_CHILD), ("fanlong", STEADY_CHILD)):
        (agents / name / "agents" / "helper").mkdir(parents=True)
        (agents / name / "config.yaml").write_text(
            textwrap.dedent(FANOUT.replace("name: fanout", f"name: {name}"))
        )
        (agents / name / "agents" / "helper" / "config.yaml").write_text(textwrap.dedent(child))
    for name, parent in (("team", PARENT), ("repeater", REPEATER)):
        (agents / name / "agents" / "helper").mkdir(parents=True)
        (agents / name / "config.yaml").write_text(textwrap.dedent(parent))
        (agents / name / "agents" / "helper" / "config.yaml").write_text(textwrap.dedent(CHILD))
    return agents


def _host(root: Path, extra: str = "") -> HostProcess:
    return HostProcess(root / "state", _config(_agents(root), extra))


@pytest.fixture(scope="module")
def plane_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostProcess]:
    host = _host(tmp_path_factory.mktemp("subagents"))
    try:
        yield _start(host)
    finally:
        _stop(host)


def _send(host: HostProcess, agent: str) -> dict[str, Any]:
    out = corral(
        "send", "--state-dir", str(host.state_dir), "--agent", agent, "go", "--json", timeout=60
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout)
    assert result["status"] == "idle", result
    return result


def _plane(host: HostProcess) -> httpx.Client:
    """The plane, as the runner asks it (the runner token may read sessions and items)."""
    server = json.loads((host.state_dir / "server" / "server.json").read_text())
    token = (host.state_dir / "server" / "runner_token").read_text().strip()
    return httpx.Client(
        base_url=server["url"], headers={"x-omnigent-runner-tunnel-token": token}, timeout=10
    )


def _items(host: HostProcess, session_id: str) -> list[dict[str, Any]]:
    with _plane(host) as http:
        page = http.get(f"/v1/sessions/{session_id}/items", params={"limit": 100, "order": "asc"})
    data: list[dict[str, Any]] = page.json()["data"]
    return data


def _outputs(items: list[dict[str, Any]]) -> list[str]:
    return [i["output"] for i in items if i["type"] == "function_call_output"]


def _drained(host: HostProcess, session_id: str) -> str | None:
    """The parent's ``sys_read_inbox`` output, once its woken turn has run it."""
    outputs = _outputs(_items(host, session_id))
    return outputs[1] if len(outputs) > 1 else None


def _inbox_pushes(host: HostProcess, session_id: str) -> int:
    """How many times the parent's inbox file took a sub-agent result (small files: never
    compacted here)."""
    name = hashlib.sha256(session_id.encode()).hexdigest()[:32] + ".jsonl"
    path = host.state_dir / "actors" / "tools" / "inbox" / name
    pushes = 0
    for line in path.read_text().splitlines() if path.exists() else []:
        with contextlib.suppress(ValueError):  # a line being written
            record = json.loads(line)
            pushes += record.get("op") == "push" and record["item"].get("type") == "sub_agent"
    return pushes


def test_s01_s06_s14_the_child_s_answer_is_drained_from_the_parent_s_inbox(
    plane_host: HostProcess,
) -> None:
    result = _send(plane_host, "team")
    parent = result["session_id"]
    handle = json.loads(_outputs(_items(plane_host, parent))[0])
    # S-04: the handle at once, launching, never the child's answer.
    assert handle["status"] == "launching" and handle["kind"] == "sub_agent"
    assert (handle["agent"], handle["title"]) == ("helper", "t1")
    child = handle["conversation_id"]
    assert handle["task_id"] == handle["handle_id"] == child
    assert "CHILD_MARKER" not in handle["message"]
    # S-05: the parent's stream learned of the child, launching (the new child created first).
    kinds = [e["type"] for e in result["events"]]
    created = kinds.index("session.created")
    updated = kinds.index("session.child_session.updated")
    assert created < updated
    launching = result["events"][updated]
    assert launching["child_session_id"] == child
    assert launching["child"] == {
        "id": child,
        "title": "helper:t1",
        "tool": "helper",
        "session_name": "t1",
        "busy": False,
        "current_task_status": "launching",
    }
    # S-14, S-15: the woken parent drained the child's answer (the wake is §J step 7).
    drained = wait_until(lambda: _drained(plane_host, parent), 30, "the parent's drain")
    assert (
        drained == f"[System: sub-agent task {child} completed — helper:t1 returned: CHILD_MARKER]"
    )
    texts = [
        c["text"]
        for i in _items(plane_host, parent)
        if i["type"] == "message" and i["role"] == "user"
        for c in i["content"]
    ]
    assert texts[-1] == (
        "[System: sub-agent helper/t1 finished (completed) — 1 result waiting in inbox. "
        "Call sys_read_inbox to collect.]"
    )
    assert _inbox_pushes(plane_host, parent) == 1
    # §J step 8: the plane lists the child with its sub-agent and label.
    with _plane(plane_host) as http:
        page = http.get(f"/v1/sessions/{parent}/child_sessions").json()
        snap = http.get(f"/v1/sessions/{child}").json()
    (row,) = page["data"]
    assert {k: row[k] for k in ("id", "object", "parent_session_id", "title", "tool")} == {
        "id": child,
        "object": "child_session",
        "parent_session_id": parent,
        "title": "helper:t1",
        "tool": "helper",
    }
    assert (row["session_name"], row["kind"], row["busy"]) == ("t1", "sub_agent", False)
    assert row["labels"]["omnigent.subagent.dispatch_id"].startswith("subagent_")
    assert (snap["parent_session_id"], snap["sub_agent_name"]) == (parent, "helper")
    assert snap["root_conversation_id"] == parent


def test_s03_s12_p17_a_named_child_is_continued_and_by_id_is_child_only(
    plane_host: HostProcess,
) -> None:
    result = _send(plane_host, "repeater")
    parent = result["session_id"]
    # The first turn's four sends (a wake may already have run the script again).
    outputs = _outputs(_items(plane_host, parent))[:4]
    first, second, stranger, both = (json.loads(o) for o in outputs)
    # S-03: the second send continued the first child; S-01: both argument forms work.
    assert first["conversation_id"] == second["conversation_id"]
    assert second["status"] == "launching"
    with _plane(plane_host) as http:
        assert len(http.get(f"/v1/sessions/{parent}/child_sessions").json()["data"]) == 1
    # S-12, P-19: by id only to a direct child (an unknown one is not found).
    assert stranger == {"error": "session_not_found", "conversation_id": "conv_not_mine"}
    # P-17: never both modes.
    assert "both 'session_id' and 'agent'/'title'" in both["error"]
    kinds = [e["type"] for e in result["events"]]
    assert kinds.count("session.created") == 1  # one child, made once


@pytest.mark.parametrize(
    ("actor", "step"),
    [
        ("dispatch", "subagent_recorded"),
        ("dispatch", "subagent_pushed"),
        ("tools", "inbox_pushed"),
    ],
)
def test_s19_a_crash_between_the_child_s_end_and_delivery_delivers_once(
    tmp_path: Path, actor: str, step: str
) -> None:
    """``kill -9`` of dispatch after the result is recorded (before the push) or after the
    push (before the wake), or of the tools actor after the push (before its answer): the
    restarted actor delivers, and the parent's inbox takes the result exactly once."""
    host = _host(tmp_path, f'[actors.{actor}.options]\ncrash_at = "{step}"\n')
    try:
        _start(host)
        parent = _send(host, "team")["session_id"]
        drained = wait_until(lambda: _drained(host, parent), 60, "the parent's drain")
        assert "helper:t1 returned: CHILD_MARKER" in drained
        assert (host.state_dir / "actors" / actor / f"crashed-at-{step}").exists()
        assert _inbox_pushes(host, parent) == 1
        outputs = _outputs(_items(host, parent))
        assert sum("CHILD_MARKER" in o for o in outputs) == 1
    finally:
        _stop(host)


def _actor_pid(host: HostProcess, name: str) -> int:
    (actor,) = [a for a in host.status()["actors"] if a["name"] == name]
    assert actor["state"] == "running" and actor["pid"], actor
    pid: int = actor["pid"]
    return pid


def _registry(host: HostProcess) -> dict[str, dict[str, Any]]:
    """The work entries as dispatch last wrote them (the last line of a dispatch id wins)."""
    path = host.state_dir / "actors" / "dispatch" / "subagents.log"
    entries: dict[str, dict[str, Any]] = {}
    if not path.exists():
        return entries
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            entries[record["dispatch_id"]] = record
    return entries


@pytest.mark.timeout(240)
def test_s14_s19_kill9_of_dispatch_and_tools_during_fan_out_loses_and_doubles_nothing(
    tmp_path: Path,
) -> None:
    """Four parents fan out to two children each; dispatch is killed once the children
    work, the tools actor once results are recorded. Every send that returned a handle has
    its result drained exactly once (counted in the drains and in the inbox files), and
    every result recorded is delivered."""
    host = _host(tmp_path)
    parents: list[str] = []
    try:
        _start(host)
        with _client(host) as http:
            for _ in range(4):
                created = http.post("/v1/sessions", json={"agent": "fanout"})
                assert created.status_code == 201, created.text
                parents.append(created.json()["id"])
            for parent in parents:
                message = {"type": "message", "data": {"content": "go"}}
                posted = http.post(f"/v1/sessions/{parent}/events", json=message)
                assert posted.status_code == 202, posted.text
        wait_until(lambda: len(_registry(host)) >= 4, 60, "children at work")
        os.kill(_actor_pid(host, "dispatch"), signal.SIGKILL)
        wait_until(
            lambda: any(e["status"] == "completed" for e in _registry(host).values()),
            60,
            "a recorded result",
        )
        os.kill(_actor_pid(host, "tools"), signal.SIGKILL)
        # Each send answered with a handle has its result drained. A send the kill cut off
        # answered an error ("may have partly run"): its parent does not wait for it, and its
        # child's result comes if its message had gone out before the kill.
        wait_until(
            lambda: (
                all(_settled(host, p) for p in parents)
                and all(
                    e["woken"] if e["status"] != "launching" else not _items(host, e["child_id"])
                    for e in _registry(host).values()
                )
            ),
            90,
            "every handle's result drained, every recorded result delivered (an entry left "
            "launching only for a child whose message never went out)",
        )
        for parent in parents:
            drained = "\n".join(o for o in _outputs(_items(host, parent)) if "sub-agent" in o)
            results = _results(host, parent)
            assert len(results) == len(set(results)), drained  # never twice
            assert _inbox_pushes(host, parent) == len(results)
            # No parent sent again: its history held each wake once (a wake read back twice
            # made it start over, S-03).
            sends = [
                i
                for i in _items(host, parent)
                if i["type"] == "function_call" and i["name"] == "sys_session_send"
            ]
            assert len(sends) == 2, parent
    finally:
        _stop(host)


@pytest.mark.timeout(240)
def test_s14_s19_kill9_of_the_whole_host_during_fan_out_delivers_each_result_once(
    tmp_path: Path,
) -> None:
    """The host itself dies (``kill -9``: its actors, workers and control plane with it)
    while two parents' children work; a new host on the same state dir ends each child's
    cut-off turn once and delivers each result to its parent once, none lost, none twice."""
    host = _host(tmp_path)
    parents: list[str] = []
    try:
        _start(host)
        with _client(host) as http:
            for _ in range(2):
                created = http.post("/v1/sessions", json={"agent": "fanlong"})
                parents.append(created.json()["id"])
                message = {"type": "message", "data": {"content": "go"}}
                assert http.post(f"/v1/sessions/{parents[-1]}/events", json=message).is_success
        wait_until(lambda: all(_handles(host, p) for p in parents), 60, "both sends answered")
        # Still at work (the log says launching until a child ends: in_progress is not saved).
        assert any(e["status"] == "launching" for e in _registry(host).values())
        host.kill9()
        wait_until(lambda: not processes_of(host.state_dir), 20, "the host's processes gone")
        _start(host)
        pattern = r"sub-agent task (\w+) (?:completed|failed|cancelled)"

        def results(parent: str) -> list[str]:
            drained = "\n".join(o for o in _outputs(_items(host, parent)) if "sub-agent" in o)
            return re.findall(pattern, drained)

        def settled(parent: str) -> bool:
            handles = _handles(host, parent) or {}
            return set(handles.values()) <= set(results(parent)) and _status(host, parent) == (
                "idle"
            )

        wait_until(lambda: all(settled(p) for p in parents), 120, "every result drained")
        for parent in parents:
            assert len(results(parent)) == len(set(results(parent))) == 2, results(parent)
            assert _inbox_pushes(host, parent) == 2
        assert all(e["woken"] for e in _registry(host).values())
    finally:
        _stop(host)


def _handles(host: HostProcess, parent: str) -> dict[str, str] | None:
    """``{title: child}`` of the parent's sends that returned a handle, once both sends
    answered (None before)."""
    items = _items(host, parent)
    calls = [i for i in items if i["type"] == "function_call" and i["name"] == "sys_session_send"]
    answers = {i["call_id"]: i["output"] for i in items if i["type"] == "function_call_output"}
    if len(calls) < 2 or not all(c["call_id"] in answers for c in calls):
        return None
    handles = [json.loads(answers[c["call_id"]]) for c in calls]
    return {h["title"]: h["conversation_id"] for h in handles if h.get("status") == "launching"}


def _status(host: HostProcess, session_id: str) -> str:
    with _plane(host) as http:
        status: str = http.get(f"/v1/sessions/{session_id}").json()["status"]
    return status


def _results(host: HostProcess, parent: str) -> list[tuple[str, str]]:
    """``(child, title)`` of every result the parent drained, in order."""
    drained = "\n".join(o for o in _outputs(_items(host, parent)) if "sub-agent" in o)
    return re.findall(r"sub-agent task (\w+) completed — helper:(t\d) returned", drained)


def _settled(host: HostProcess, parent: str) -> bool:
    """Both sends answered, each handle's result drained, the inbox drained, idle."""
    handles = _handles(host, parent)
    if not handles:
        return False
    results = set(_results(host, parent))
    return (
        {(c, t) for t, c in handles.items()} <= results
        and _inbox_pushes(host, parent) == len(_results(host, parent))
        and _status(host, parent) == "idle"
    )


def _client(host: HostProcess) -> httpx.Client:
    """The plane, as a client asks it (``corral token``'s credential)."""
    server = json.loads((host.state_dir / "server" / "server.json").read_text())
    token = (host.state_dir / "server" / "client_token").read_text().strip()
    return httpx.Client(
        base_url=server["url"], headers={"authorization": f"Bearer {token}"}, timeout=10
    )


def test_s15_a_failed_child_reaches_its_parent_as_a_result(plane_host: HostProcess) -> None:
    parent = _send(plane_host, "failing")["session_id"]
    child = json.loads(_outputs(_items(plane_host, parent))[0])["conversation_id"]
    drained = wait_until(lambda: _drained(plane_host, parent), 30, "the parent's drain")
    assert drained == f"[System: sub-agent task {child} failed — helper:t1 error: the helper broke]"


@pytest.mark.parametrize("how", ["interrupt", "delete"])
def test_s15_an_interrupted_or_deleted_child_reaches_its_parent_cancelled(
    plane_host: HostProcess, how: str
) -> None:
    """A parent never waits for a child that was stopped: interrupted, its work ends
    ``cancelled``; deleted (closed), too."""
    parent = _send(plane_host, "long")["session_id"]
    child = json.loads(_outputs(_items(plane_host, parent))[0])["conversation_id"]
    wait_until(lambda: _status(plane_host, child) == "running", 30, "the child at work")
    with _client(plane_host) as http:
        if how == "interrupt":
            answer = http.post(f"/v1/sessions/{child}/events", json={"type": "interrupt"})
        else:
            answer = http.delete(f"/v1/sessions/{child}")
        assert answer.status_code < 300, answer.text
    drained = wait_until(lambda: _drained(plane_host, parent), 30, "the parent's drain")
    assert drained == f"[System: sub-agent task {child} cancelled — helper:t1]"
