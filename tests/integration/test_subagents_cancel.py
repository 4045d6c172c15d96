"""``sys_cancel_task`` through a real host and its embedded control plane (#17, S-49..S-52).

A scripted parent hands work to a child that sleeps, then cancels it with the id it learned
(its script takes the tool's arguments from the user message): the child, an in-process
harness, is interrupted, never stopped (S-51); its interrupted turn ends ``cancelled`` and that
result, not the child's answer, reaches the parent's inbox once. Cancelling it again answers
its end and posts nothing; an id that is not the caller's work is no in-flight task (S-52).
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import HostProcess, corral, wait_until
from tests.integration.test_e2e import _config, _start, _stop
from tests.integration.test_subagents import _inbox_pushes, _items, _outputs

PARENT = """
    spec_version: 1
    name: canceller
    executor:
      harness: scripted
      script:
        turns:
          - - {tool: sys_session_send, arguments: {agent: sleeper, title: s1, args: "sleep"}}
          - - {tool: sys_cancel_task, arguments_from_message: true}
          - - {tool: sys_read_inbox, arguments: {}}
          - - {tool: sys_cancel_task, arguments_from_message: true}
          - - {tool: sys_cancel_task, arguments_from_message: true}
    tools:
      agents: [sleeper]
    """
CHILD = """
    spec_version: 1
    name: sleeper
    executor:
      harness: scripted
      script:
        turns:
          - - {sleep_ms: 120000}
            - {text: "SHOULD_NOT_DELIVER"}
    """


@pytest.fixture
def host(tmp_path: Path) -> Iterator[HostProcess]:
    agents = tmp_path / "agents"
    (agents / "canceller" / "agents" / "sleeper").mkdir(parents=True)
    (agents / "canceller" / "config.yaml").write_text(textwrap.dedent(PARENT))
    (agents / "canceller" / "agents" / "sleeper" / "config.yaml").write_text(textwrap.dedent(CHILD))
    h = HostProcess(tmp_path / "state", _config(agents))
    try:
        yield _start(h)
    finally:
        _stop(h)


def _send(host: HostProcess, *args: str) -> dict[str, Any]:
    out = corral("send", "--state-dir", str(host.state_dir), *args, "--json", timeout=60)
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout)
    assert result["status"] == "idle", result
    return result


def test_s51_s52_a_running_child_is_interrupted_and_its_cancel_reaches_the_inbox_once(
    host: HostProcess,
) -> None:
    parent = _send(host, "--agent", "canceller", "go")["session_id"]
    child = json.loads(_outputs(_items(host, parent))[0])["task_id"]
    _send(host, "--session", parent, json.dumps({"task_id": child}))
    asked = json.loads(_outputs(_items(host, parent))[1])
    assert asked["cancel_requested"] is True and asked["cancel_confirmed"] is False
    assert asked["task_id"] == child and asked["status"] in ("launching", "in_progress")
    assert "sys_read_inbox" in asked["message"]
    # The interrupted child ends cancelled; the woken parent drains that, never its answer.
    drained = wait_until(
        lambda: (o := _outputs(_items(host, parent)))[2:3] and o[2], 60, "the parent's drain"
    )
    assert drained == f"[System: sub-agent task {child} cancelled — sleeper:s1]"
    assert _inbox_pushes(host, parent) == 1
    # Ended work answers its end, posting nothing (S-52); not the caller's work: no task.
    _send(host, "--session", parent, json.dumps({"task_id": child}))
    again = json.loads(_outputs(_items(host, parent))[3])
    assert again == {"cancelled": True, "task_id": child, "status": "cancelled"}
    _send(host, "--session", parent, json.dumps({"handle_id": "conv_nobody"}))
    assert _outputs(_items(host, parent))[4] == "Error: no in-flight task with task_id conv_nobody"
    child_texts = [
        c.get("text", "")
        for i in _items(host, child)
        if i["type"] == "message"
        for c in i.get("content", [])
    ]
    assert "SHOULD_NOT_DELIVER" not in "".join(child_texts)
    assert all("SHOULD_NOT_DELIVER" not in o for o in _outputs(_items(host, parent)))
