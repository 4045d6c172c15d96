"""``corral subagents``' tree and result places, on registry entries as dispatch lists them
(#17 item 4; S-16: a reused named child has one entry per send)."""

from __future__ import annotations

from typing import Any

from corral.cli._subagents import result_place, subagent_tree


def _entry(n: int, parent: str, child: str, **state: Any) -> dict[str, Any]:
    return {
        "dispatch_id": f"subagent_{n:012x}",
        "parent_id": parent,
        "child_id": child,
        "agent": "helper",
        "title": child,
        "status": "completed",
        "pushed": True,
        "woken": True,
        "output": "",
        "created_at": float(n),
        **state,
    }


def test_result_place_follows_the_delivery_steps() -> None:
    assert result_place({"status": "launching"}) == "pending"
    assert result_place({"status": "in_progress"}) == "pending"
    assert result_place({"status": "failed", "pushed": False}) == "recorded"
    assert result_place({"status": "completed", "pushed": True, "woken": False}) == "inbox"
    assert result_place({"status": "cancelled", "pushed": True, "woken": True}) == "woken"


def test_s16_the_tree_nests_grandchildren_and_keeps_each_send() -> None:
    entries = [
        _entry(3, "c1", "g1", status="in_progress", pushed=False, woken=False),
        _entry(1, "p", "c1"),
        _entry(2, "p", "c2"),
        _entry(4, "p", "c1"),  # c1 continued by a second send
        _entry(5, "q", "c3"),
    ]
    trees = subagent_tree(entries)
    assert [t["session_id"] for t in trees] == ["p", "q"]
    (p, _) = trees
    assert [c["session_id"] for c in p["children"]] == ["c1", "c2"]
    c1 = p["children"][0]
    sends = ["subagent_000000000001", "subagent_000000000004"]
    assert [w["dispatch_id"] for w in c1["work"]] == sends
    (g1,) = c1["children"]
    assert (g1["parent_session_id"], g1["work"][0]["result"]) == ("c1", "pending")
    (only,) = subagent_tree(entries, "c1")
    assert only["parent_session_id"] == "p" and len(only["work"]) == 2


def test_a_cycle_of_entries_shows_each_session_once() -> None:
    (tree,) = subagent_tree([_entry(1, "a", "b"), _entry(2, "b", "a")], "a")
    assert [c["session_id"] for c in tree["children"]] == ["b"]
    assert tree["children"][0]["children"] == []
