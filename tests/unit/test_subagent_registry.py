"""The durable sub-agent work registry (``corral.actors.dispatch._subagents``) without a host:
one entry per dispatched child, its one result, what survives a restart (S-16, S-19, S-20,
S-17, S-21, S-22, S-23)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from corral.actors.dispatch import _subagents
from corral.actors.dispatch._subagents import (
    PREVIEW_CHARS,
    WorkEntry,
    WorkRegistry,
    child_task_status,
    last_assistant_text,
    truncate_preview,
)


def _entry(dispatch_id: str = "subagent_000000000001", child: str = "conv_child") -> WorkEntry:
    return WorkEntry(
        dispatch_id=dispatch_id,
        parent_id="conv_parent",
        child_id=child,
        agent="worker",
        title="phase-a",
        runner_id="runner_1",
    )


async def _loaded(path: Path) -> tuple[WorkRegistry, list[WorkEntry]]:
    registry = WorkRegistry(path)
    return registry, await registry.load()


async def test_s19_an_entry_starts_launching_and_takes_its_result_once(tmp_path: Path) -> None:
    registry, _ = await _loaded(tmp_path)
    told: list[WorkEntry] = []
    registry.on_result = told.append
    assert await registry.add(_entry())
    assert not await registry.add(_entry())  # a redelivered registration
    (entry,) = registry.open_for("conv_child")
    assert (entry.status, entry.pushed, entry.woken) == ("launching", False, False)
    await registry.ended("conv_child", "turn_1", "completed", "CHILD_MARKER")
    # A second end (the terminal redelivered after a crash) finds no open entry.
    assert await registry.ended("conv_child", "turn_1", "completed", "other") == []
    assert [e.dispatch_id for e in told] == ["subagent_000000000001"]
    assert entry.key == "subagent_000000000001:turn_1"
    assert entry.inbox_item() == {
        "type": "sub_agent",
        "task_id": "conv_child",
        "handle_id": "conv_child",
        "conversation_id": "conv_child",
        "tool_name": "worker",
        "agent": "worker",
        "title": "phase-a",
        "status": "completed",
        "output": "CHILD_MARKER",
        "work_id": "subagent_000000000001",
    }


async def test_s19_a_recorded_result_not_yet_woken_is_delivered_after_a_restart(
    tmp_path: Path,
) -> None:
    registry, _ = await _loaded(tmp_path)
    await registry.add(_entry())
    await registry.add(_entry("subagent_000000000002", child="conv_other"))
    (entry,) = await registry.ended("conv_child", "turn_1", "failed", "boom")
    entry.pushed = True
    await registry.save(entry)
    again, undelivered = await _loaded(tmp_path)
    # The result survived, with how far it got; the other child still waits.
    assert [(e.dispatch_id, e.status, e.output, e.pushed) for e in undelivered] == [
        ("subagent_000000000001", "failed", "boom", True)
    ]
    assert [e.dispatch_id for e in again.open_for("conv_other")] == ["subagent_000000000002"]
    undelivered[0].woken = True
    await again.save(undelivered[0])
    assert (await _loaded(tmp_path))[1] == []


async def test_s19_a_torn_last_line_is_dropped(tmp_path: Path) -> None:
    registry, _ = await _loaded(tmp_path)
    await registry.add(_entry())
    await registry.ended("conv_child", "turn_1", "completed", "ok")
    with (tmp_path / "subagents.log").open("ab") as f:
        f.write(b'{"dispatch_id": "subagent_torn", "parent')
    _, undelivered = await _loaded(tmp_path)
    assert [e.output for e in undelivered] == ["ok"]


async def test_s16_each_send_to_a_reused_child_is_its_own_entry(tmp_path: Path) -> None:
    """A second send to the same child after the first one's result: the first result is
    the first entry's alone, and the second entry still waits (launching)."""
    registry, _ = await _loaded(tmp_path)
    await registry.add(_entry("subagent_000000000001"))
    (first,) = await registry.ended("conv_child", "turn_1", "completed", "FIRST_RESULT")
    await registry.add(_entry("subagent_000000000002"))
    (second,) = registry.open_for("conv_child")
    assert (second.dispatch_id, second.status) == ("subagent_000000000002", "launching")
    await registry.ended("conv_child", "turn_2", "completed", "SECOND_RESULT")
    assert (first.output, second.output) == ("FIRST_RESULT", "SECOND_RESULT")
    assert first.key != second.key


async def test_a_closed_child_ends_its_work_cancelled(tmp_path: Path) -> None:
    registry, _ = await _loaded(tmp_path)
    await registry.add(_entry())
    (entry,) = await registry.ended("conv_child", None, "cancelled", "")
    assert (entry.status, entry.key) == ("cancelled", "subagent_000000000001:closed")
    assert entry.wake_message()["data"]["content"][0]["text"] == (
        "[System: sub-agent worker/phase-a finished (cancelled) — 1 result waiting in inbox. "
        "Call sys_read_inbox to collect.]"
    )


async def test_the_log_is_rewritten_to_the_live_entries(tmp_path: Path) -> None:
    registry, _ = await _loaded(tmp_path)
    for n in range(300):
        entry = _entry(f"subagent_{n:012x}", child=f"conv_{n}")
        await registry.add(entry)
        (done,) = await registry.ended(entry.child_id, "turn_1", "completed", "x")
        done.pushed = done.woken = True
        await registry.save(done)
    await registry.add(_entry("subagent_live", child="conv_live"))
    # 901 lines appended; rewritten as it ran, the log never held more than the slack.
    lines = len((tmp_path / "subagents.log").read_bytes().splitlines())
    assert len(registry.entries) == 301 < lines <= 301 + _subagents._REWRITE_SLACK
    again, _ = await _loaded(tmp_path)
    assert len(again.entries) == 301
    assert [e.dispatch_id for e in again.open_for("conv_live")] == ["subagent_live"]


def test_s22_session_status_maps_to_child_task_status() -> None:
    assert [
        child_task_status(s) for s in ("launching", "running", "waiting", "idle", "failed")
    ] == ["launching", "in_progress", "in_progress", "completed", "failed"]
    assert child_task_status("archived") is None


def test_s23_a_long_preview_is_cut_with_an_ellipsis() -> None:
    assert truncate_preview("short") == "short"
    long = "x" * (PREVIEW_CHARS + 10)
    cut = truncate_preview(long)
    assert cut == "x" * PREVIEW_CHARS + "\u2026" and len(cut) == PREVIEW_CHARS + 1


def test_s14_the_output_is_the_last_assistant_text() -> None:
    items = [
        {"type": "message", "role": "assistant", "content": [{"text": "INTERMEDIATE"}]},
        {"type": "function_call", "name": "t"},
        {"type": "message", "role": "assistant", "content": [{"text": "FINAL "}, {"text": "x"}]},
        {"type": "function_call_output", "output": "o"},
    ]
    assert last_assistant_text(items) == "FINAL x"
    assert last_assistant_text([]) == ""


async def test_concurrent_saves_append_whole_lines(
    tmp_path: Path,
) -> None:
    """Saves of several entries at once append whole lines (one writer at a time)."""
    registry, _ = await _loaded(tmp_path)
    async with trio.open_nursery() as nursery:
        for n in range(20):
            nursery.start_soon(registry.add, _entry(f"subagent_{n:012x}", child=f"c{n}"))
    again, _ = await _loaded(tmp_path)
    assert len(again.entries) == 20


async def test_an_abandoned_entry_is_closed_with_nothing_to_deliver(tmp_path: Path) -> None:
    """The child's message was never taken: the tool's error told the parent, so the entry
    closes, nothing is pushed or woken, and the child's later end finds no open entry."""
    registry, _ = await _loaded(tmp_path)
    await registry.add(_entry())
    await registry.abandon(_entry())
    assert registry.entries["subagent_000000000001"].abandoned
    assert registry.open_for("conv_child") == []
    assert await registry.ended("conv_child", "turn_1", "completed", "late") == []
    assert (await _loaded(tmp_path))[1] == []


async def test_s22_the_child_s_first_turn_marks_its_work_in_progress_once(tmp_path: Path) -> None:
    registry, _ = await _loaded(tmp_path)
    started: list[str] = []
    registry.on_started = lambda e: started.append(e.dispatch_id)
    await registry.add(_entry())
    assert [e.status for e in registry.started("conv_child")] == ["in_progress"]
    assert registry.started("conv_child") == []  # a continuation turn of the same work
    assert started == ["subagent_000000000001"]


async def test_s21_a_registered_entry_names_its_parent_and_is_gone_once_drained(
    tmp_path: Path,
) -> None:
    """Registration records who asked (parent, agent as the tool, title as the session name,
    mirrored to the parent as ``<agent>:<title>``); the parent's drain unregisters it."""
    registry, _ = await _loaded(tmp_path)
    await registry.add(_entry())
    (entry,) = registry.open_for("conv_child")
    assert (entry.parent_id, entry.agent, entry.title) == ("conv_parent", "worker", "phase-a")
    await registry.ended("conv_child", "turn_1", "completed", "done")
    assert await registry.drained("conv_parent", [entry.dispatch_id]) == [entry]
    assert entry.drained and registry.open_for("conv_child") == []


async def test_s17_a_drained_result_ends_only_its_own_entry(tmp_path: Path) -> None:
    """Draining the first result does not unregister the child's next work (the seed's
    "cleanup does not unregister next turn"); another parent's drain, work still running and
    a second drain change nothing; all of it survives a restart."""
    registry, _ = await _loaded(tmp_path)
    await registry.add(_entry("subagent_000000000001"))
    (first,) = await registry.ended("conv_child", "turn_1", "completed", "FIRST")
    await registry.add(_entry("subagent_000000000002"))
    assert await registry.drained("conv_other", ["subagent_000000000001"]) == []
    ids = ["subagent_000000000001", "subagent_000000000002", "subagent_unknown"]
    assert await registry.drained("conv_parent", ids) == [first]
    assert await registry.drained("conv_parent", ids) == []
    (second,) = registry.open_for("conv_child")
    assert second.dispatch_id == "subagent_000000000002" and not second.drained
    # Drained before its wake was marked: still woken after a restart (one wake a result).
    again, undelivered = await _loaded(tmp_path)
    assert [e.dispatch_id for e in undelivered] == ["subagent_000000000001"]
    assert again.entries["subagent_000000000001"].drained
    assert [e.dispatch_id for e in again.open_for("conv_child")] == ["subagent_000000000002"]


async def test_s17_done_entries_are_forgotten_past_the_newest_kept_and_the_log_shrinks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long-lived dispatch does not keep every finished entry: past KEEP_DELIVERED done
    ones the oldest go from memory, and the log is rewritten while it runs."""
    monkeypatch.setattr(_subagents, "KEEP_DELIVERED", 5)
    monkeypatch.setattr(_subagents, "_REWRITE_SLACK", 20)
    registry, _ = await _loaded(tmp_path)
    await registry.add(_entry("subagent_live", child="conv_live"))
    for n in range(40):
        entry = _entry(f"subagent_{n:012x}", child=f"conv_{n}")
        await registry.add(entry)
        (done,) = await registry.ended(entry.child_id, "turn_1", "completed", "x")
        await registry.drained("conv_parent", [done.dispatch_id])
        done.pushed = done.woken = True
        await registry.save(done)
    assert len(registry.entries) == 6  # the live one and the newest five done
    assert "subagent_000000000027" in registry.entries
    assert "subagent_000000000000" not in registry.entries
    lines = (tmp_path / "subagents.log").read_bytes().splitlines()
    assert len(lines) <= len(registry.entries) + 20 + 3
    again, _ = await _loaded(tmp_path)
    assert set(again.entries) == set(registry.entries)
