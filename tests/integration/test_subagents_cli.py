"""``corral subagents`` and ``corral elicitations`` through a real host (#17 item 4): a scripted
parent dispatches to a scripted child that parks an approval, so the work entry is seen while
the child works (and its elicitation under its parent), then after its result reached the
parent (S-14, S-19; docs/cli.md)."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import HostProcess, corral, wait_until
from tests.integration.test_e2e import _config, _start, _stop

PARENT = """
    spec_version: 1
    name: boss
    executor:
      harness: scripted
      script:
        turns:
          - - {tool: sys_session_send, arguments: {agent: asker, title: q1, args: "check"}}
            - {text: "launched"}
          - - {tool: sys_read_inbox, arguments: {}}
    tools:
      agents: [asker]
    """
#: The child waits on a person: its work is pending until the test answers.
CHILD = """
    spec_version: 1
    name: asker
    executor:
      harness: scripted
      script:
        turns:
          - - {elicit: {message: "May the child answer?"}}
            - {text: "CHILD_ANSWER", on_decline: "CHILD_DECLINED"}
    """


#: S-18: a child whose first turn is followed by a continuation (a message posted to the
#: child while that turn ran, not a new send) delivers only what its last turn said.
LEAD = """
    spec_version: 1
    name: lead
    executor:
      harness: scripted
      script:
        turns:
          - - {tool: sys_session_send, arguments: {agent: drafter, title: d1, args: "draft"}}
          - - {tool: sys_read_inbox, arguments: {}}
    tools:
      agents: [drafter]
    """
#: Turn 1 waits on a person (so the test can post the continuation while it runs), then
#: narrates; turn 2, the continuation, gives the synthesis.
DRAFTER = """
    spec_version: 1
    name: drafter
    executor:
      harness: scripted
      script:
        turns:
          - - {elicit: {message: "Go on?"}}
            - {text: "INTERMEDIATE_NARRATION"}
          - - {text: "FINAL_SYNTHESIS"}
    """


#: A parent that waits in its own turn for its child's answer, while the child waits on a
#: person: the prompt reaches the parent's stream (mirrored), and is answered there.
WAITER = """
    spec_version: 1
    name: waiter
    executor:
      harness: scripted
      script:
        turns:
          - - {tool: sys_session_send, arguments: {agent: checker, title: c1, args: "check"}}
            - gather: {tool: sys_read_inbox, marker: "[System: sub-agent task", count: 1,
                       every_ms: 100, prefix: "merged: "}
          - []
    tools:
      agents: [checker]
    """
CHECKER = """
    spec_version: 1
    name: checker
    executor:
      harness: scripted
      script:
        turns:
          - - {elicit: {message: "May the checker answer?"}}
            - {text: "CHECKED", on_decline: "NOT_CHECKED"}
    """


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostProcess]:
    root = tmp_path_factory.mktemp("subagents-cli")
    agent = root / "agents" / "boss"
    (agent / "agents" / "asker").mkdir(parents=True)
    (agent / "config.yaml").write_text(textwrap.dedent(PARENT))
    (agent / "agents" / "asker" / "config.yaml").write_text(textwrap.dedent(CHILD))
    for name, text, child, child_text in (("waiter", WAITER, "checker", CHECKER),):
        (root / "agents" / name / "agents" / child).mkdir(parents=True)
        (root / "agents" / name / "config.yaml").write_text(textwrap.dedent(text))
        (root / "agents" / name / "agents" / child / "config.yaml").write_text(
            textwrap.dedent(child_text)
        )
    lead = root / "agents" / "lead"
    (lead / "agents" / "drafter").mkdir(parents=True)
    (lead / "config.yaml").write_text(textwrap.dedent(LEAD))
    (lead / "agents" / "drafter" / "config.yaml").write_text(textwrap.dedent(DRAFTER))
    host = HostProcess(root / "state", _config(root / "agents"))
    try:
        yield _start(host)
    finally:
        _stop(host)


def _cli(host: HostProcess, *args: str) -> tuple[int, dict[str, Any]]:
    out = corral(*args, "--state-dir", str(host.state_dir), "--json", timeout=60)
    return out.returncode, json.loads(out.stdout)


def _entries(host: HostProcess) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = host.ask("inspect", actor="dispatch")["state"]["subagents"]
    return entries


def _plane(host: HostProcess, path: str, body: dict[str, Any]) -> None:
    """POST ``body`` to the host's control plane as its client."""
    server = json.loads((host.state_dir / "server" / "server.json").read_text())
    token = (host.state_dir / "server" / "client_token").read_text().strip()
    answer = httpx.post(
        server["url"] + path, json=body, headers={"authorization": f"Bearer {token}"}, timeout=10
    )
    assert answer.status_code < 300, answer.text


def _resolve(host: HostProcess, session_id: str, elicitation_id: str) -> None:
    path = f"/v1/sessions/{session_id}/elicitations/{elicitation_id}/resolve"
    _plane(host, path, {"action": "accept"})


def test_s17_s19_subagents_shows_the_work_pending_then_delivered_then_drained(
    host: HostProcess,
) -> None:
    code, sent = _cli(host, "send", "--agent", "boss", "go")
    assert code == 0 and sent["status"] == "idle", sent
    parent = sent["session_id"]
    # The child parks its approval: its work is pending, and the elicitation is its parent's.
    rows = wait_until(
        lambda: [r for r in host.ask("elicitations")["elicitations"] if r["state"] == "parked"],
        30,
        "the child's approval",
    )
    code, listed = _cli(host, "elicitations")
    assert code == 0
    (row,) = [r for r in listed["elicitations"] if r["state"] == "parked"]
    child = row["session_id"]
    assert child != parent and row["parent_session_id"] == parent
    code, before = _cli(host, "subagents", "--session", parent)
    assert code == 0
    (tree,) = before["sessions"]
    assert (tree["session_id"], tree["parent_session_id"], tree["work"]) == (parent, None, [])
    (node,) = tree["children"]
    assert (node["session_id"], node["parent_session_id"]) == (child, parent)
    assert (node["agent"], node["title"], node["children"]) == ("asker", "q1", [])
    (work,) = node["work"]
    assert work["dispatch_id"].startswith("subagent_")
    assert (work["status"], work["result"], work["output"]) == ("in_progress", "pending", "")
    # Answered: the child ends, its result reaches the parent's inbox and wakes it, and the
    # parent's next turn takes it from there (sys_read_inbox): the work is done (S-17).
    _resolve(host, child, rows[0]["elicitation_id"])
    wait_until(
        lambda: any(e["drained"] for e in _entries(host) if e["child_id"] == child),
        30,
        "the result delivered and drained",
    )
    code, after = _cli(host, "subagents")
    assert code == 0
    (tree,) = [t for t in after["sessions"] if t["session_id"] == parent]
    (work,) = tree["children"][0]["work"]
    done = ("completed", "drained", "CHILD_ANSWER")
    assert (work["status"], work["result"], work["output"]) == done
    assert work["turn_id"] and work["ended_at"] >= work["created_at"]
    # The child's own tree: it is the root, with the work it was given.
    code, own = _cli(host, "subagents", "--session", child)
    assert code == 0
    assert [t["work"][0]["dispatch_id"] for t in own["sessions"]] == [work["dispatch_id"]]
    # The table shows the same.
    table = corral("subagents", "--state-dir", str(host.state_dir), env={"COLUMNS": "250"})
    assert table.returncode == 0
    assert work["dispatch_id"] in table.stdout and "asker:q1" in table.stdout


def test_subagents_refuses_a_bad_or_unknown_session(host: HostProcess, tmp_path: Path) -> None:
    code, bad = _cli(host, "subagents", "--session", "no spaces allowed")
    assert code == 2 and bad["sessions"] == [] and bad["error"]["code"] == "invalid_session_id"
    code, unknown = _cli(host, "subagents", "--session", "conv_nobody")
    assert (code, unknown["error"]["code"]) == (1, "session_not_found")
    assert "conv_nobody" in unknown["error"]["message"]
    out = corral("subagents", "--state-dir", str(tmp_path / "nohost"), "--json")
    assert out.returncode == 3
    assert json.loads(out.stdout)["error"]["code"] == "no_host"


def test_s18_a_child_continued_while_it_ran_delivers_only_its_final_turn(
    host: HostProcess,
) -> None:
    code, sent = _cli(host, "send", "--agent", "lead", "go")
    assert code == 0 and sent["status"] == "idle", sent
    parent = sent["session_id"]
    (child,) = [e["child_id"] for e in _entries(host) if e["parent_id"] == parent]
    (row,) = wait_until(
        lambda: [
            r
            for r in host.ask("elicitations")["elicitations"]
            if r["state"] == "parked" and r["session_id"] == child
        ],
        30,
        "the child's first turn to wait",
    )

    # While the child's first turn runs, a message to the child itself: a continuation,
    # buffered by dispatch (its count of buffered messages says when).
    def buffered() -> int:
        count: int = host.ask("inspect", actor="dispatch")["state"]["buffered"]
        return count

    before = buffered()
    _plane(host, f"/v1/sessions/{child}/events", {"type": "message", "data": {"content": "more"}})
    wait_until(lambda: buffered() > before, 30, "the continuation buffered")
    _resolve(host, child, row["elicitation_id"])
    (entry,) = wait_until(
        lambda: [e for e in _entries(host) if e["child_id"] == child and e["drained"]],
        30,
        "the child's result delivered and drained",
    )
    assert (entry["status"], entry["output"]) == ("completed", "FINAL_SYNTHESIS")
    assert [e["dispatch_id"] for e in _entries(host) if e["child_id"] == child] == [
        entry["dispatch_id"]
    ]


def test_a_child_s_prompt_is_answered_from_the_parent_s_turn(host: HostProcess) -> None:
    """The child's approval is mirrored onto the parent's stream with its owner as
    ``params.target_session_id`` (as the 0.19.1 server does); ``corral send --approve`` on
    the parent answers it there, and the parent's turn gets the child's answer."""
    code, sent = _cli(host, "send", "--agent", "waiter", "--approve", "go")
    assert code == 0 and sent["status"] == "idle", sent
    assert sent["text"].startswith("merged: ") and "CHECKED" in sent["text"], sent["text"]
    (ask,) = [e for e in sent["events"] if e["type"] == "response.elicitation_request"]
    child = ask["params"]["target_session_id"]
    assert child != sent["session_id"] and ask["params"]["message"] == "May the checker answer?"
    assert any(
        e["type"] == "response.elicitation_resolved"
        and e["elicitation_id"] == ask["elicitation_id"]
        for e in sent["events"]
    )
