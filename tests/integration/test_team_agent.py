"""The packaged demo ``team`` agent through a real host (#17 item 5): one message fans out to
two scripted sub-agents, and the parent's reply merges both answers from its inbox (S-01,
S-14, S-15)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import HostProcess, corral, wait_until
from tests.integration.test_e2e import _config, _start, _stop


def test_s14_team_merges_the_answers_of_its_two_sub_agents(tmp_path: Path) -> None:
    (tmp_path / "agents").mkdir()
    host = HostProcess(tmp_path / "state", _config(tmp_path / "agents"))
    try:
        _start(host)
        out = corral("send", "--state-dir", str(host.state_dir), "--agent", "team", "go", "--json")
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout)
        assert result["status"] == "idle", result
        merged = result["text"].split("Merged:")[1]
        assert "researcher:research returned: Researcher: the durable registry" in merged
        assert "critic:review returned: Critic: a parent is woken" in merged
        # The wakes that follow run the empty turns: nothing is sent again.
        parent = result["session_id"]

        def entries() -> list[dict[str, object]]:
            state = host.ask("inspect", actor="dispatch")["state"]
            return [e for e in state["subagents"] if e["parent_id"] == parent]

        wait_until(lambda: all(e["woken"] for e in entries()), 30, "both wakes")
        listed = corral(
            "subagents", "--state-dir", str(host.state_dir), "--session", parent, "--json"
        )
        children = json.loads(listed.stdout)["sessions"][0]["children"]
        assert sorted(c["agent"] for c in children) == ["critic", "researcher"]
        assert all(len(c["work"]) == 1 for c in children)
    finally:
        _stop(host)
