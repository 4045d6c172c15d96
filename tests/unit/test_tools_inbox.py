"""The durable session inbox: T-17 to T-19 renderings, idempotence, crashes, torn tails."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from corral import _jsonlines as jsonlines_module
from corral.tools._api import ToolContext
from corral.tools.inbox import (
    INBOX_EMPTY,
    TOOLS,
    Inbox,
    Reviewed,
    render_item,
    terminal_idle_item,
)
from tests._tool_context import tool_context

SID = "conv_inbox"


def task(handle: str, output: Any = "out", status: str = "completed") -> dict[str, Any]:
    return {"handle_id": handle, "tool_name": "sys_os_shell", "status": status, "output": output}


def files(dir: Path) -> list[Path]:
    return sorted(dir.glob("*.jsonl"))


def lines_of(dir: Path) -> list[dict[str, Any]]:
    [path] = files(dir)
    return [json.loads(line) for line in path.read_text().splitlines()]


# --- T-17 / T-18 / T-19 ----------------------------------------------------------------------


async def test_t17_t18_t19_drain_renders_every_item_around_a_malformed_one(tmp_path: Path) -> None:
    inbox = Inbox(tmp_path)
    await inbox.push(SID, task("handle_before", "before"), key="handle_before")
    await inbox.push(SID, {"type": "terminal_idle", "source": "zsh"}, key="idle-1")
    await inbox.push(SID, task("handle_after", "after"), key="handle_after")

    text = await inbox.drain(SID, "call_read")

    assert text == (
        "[System: task handle_before completed — sys_os_shell returned: before]\n\n"
        "[System: malformed terminal_idle inbox item ignored — terminal-idle inbox payload "
        "requires non-empty string session]\n\n"
        "[System: task handle_after completed — sys_os_shell returned: after]"
    )
    assert await inbox.size(SID) == 0
    assert await inbox.drain(SID, "call_next") == INBOX_EMPTY


@pytest.mark.parametrize(
    ("item", "line"),
    [
        (task("h1", "boom", "failed"), "[System: task h1 failed — sys_os_shell error: boom]"),
        (task("h2", "", "cancelled"), "[System: task h2 cancelled]"),
        (task("h3", ""), "[System: task h3 completed — sys_os_shell produced no output]"),
        (task("h4", " \n\t"), "[System: task h4 completed — sys_os_shell produced no output]"),
        (task("h5", None), "[System: task h5 completed — sys_os_shell produced no output]"),
        (task("h6", {"a": 1}), '[System: task h6 completed — sys_os_shell returned: {"a": 1}]'),
        (terminal_idle_item("zsh", "s1"), "[System: terminal zsh:s1 is idle]"),
        (
            {"type": "terminal_idle", "session": "s1"},
            "[System: malformed terminal_idle inbox item ignored — terminal-idle inbox payload "
            "requires non-empty string source]",
        ),
        (
            {"type": "terminal_idle", "source": "zsh", "session": ""},
            "[System: malformed terminal_idle inbox item ignored — terminal-idle inbox payload "
            "requires non-empty string session]",
        ),
        (
            {
                "type": "sub_agent",
                "task_id": "child_1",
                "agent": "worker",
                "title": "phase-a",
                "status": "completed",
                "output": "CHILD_MARKER",
            },
            "[System: sub-agent task child_1 completed — worker:phase-a returned: CHILD_MARKER]",
        ),
        (
            {"type": "sub_agent", "task_id": "c", "agent": "w", "title": "t"}
            | {"status": "cancelled"},
            "[System: sub-agent task c cancelled — w:t]",
        ),
        ({"note": "odd"}, '[System: inbox item: {"note": "odd"}]'),
    ],
)
def test_t17_item_forms(item: dict[str, Any], line: str) -> None:
    assert render_item(item) == line


def test_t17_output_is_capped_at_12000_chars() -> None:
    line = render_item(task("h", "x" * 12_345))
    assert line == (
        "[System: task h completed — sys_os_shell returned: "
        + "x" * 12_000
        + "\n...[truncated 345 chars]]"
    )
    assert render_item(task("h", "y" * 12_000)).count("truncated") == 0


async def test_t19_single_item_drain_is_exactly_its_line(tmp_path: Path) -> None:
    inbox = Inbox(tmp_path)
    assert await inbox.drain(SID, "call_0") == "Inbox is empty — no completed tasks."
    await inbox.push(SID, task("handle_only", "", "cancelled"), key="handle_only")
    assert await inbox.drain(SID, "call_1") == "[System: task handle_only cancelled]"


async def test_t19_items_come_out_in_push_order(tmp_path: Path) -> None:
    inbox = Inbox(tmp_path)
    for i in (3, 1, 2):
        await inbox.push(SID, task(f"h{i}", str(i)), key=f"h{i}")
    text = await inbox.drain(SID, "call_1")
    assert [line.split()[2] for line in text.split("\n\n")] == ["h3", "h1", "h2"]


# --- idempotence and durability --------------------------------------------------------------


async def test_push_is_idempotent_by_key_even_after_delivery_and_restart(tmp_path: Path) -> None:
    inbox = Inbox(tmp_path)
    assert await inbox.push(SID, task("handle_a"), key="handle_a") is True
    assert await inbox.push(SID, task("handle_a", "again"), key="handle_a") is False
    assert await inbox.size(SID) == 1
    assert "returned: out]" in await inbox.drain(SID, "call_1")
    # A redelivered completion after the drain, and after a restart, is still ignored.
    assert await inbox.push(SID, task("handle_a"), key="handle_a") is False
    reopened = Inbox(tmp_path)
    assert await reopened.push(SID, task("handle_a"), key="handle_a") is False
    assert await reopened.drain(SID, "call_2") == INBOX_EMPTY


async def test_redrain_with_the_same_call_id_after_a_crash_returns_the_same_text(
    tmp_path: Path,
) -> None:
    inbox = Inbox(tmp_path)
    await inbox.push(SID, task("h1", "one"), key="h1")
    await inbox.push(SID, task("h2", "two"), key="h2")
    first = await inbox.drain(SID, "call_read")

    # The crash: nothing survives but the directory.
    reopened = Inbox(tmp_path)
    await reopened.push(SID, task("h3", "three"), key="h3")
    assert await reopened.drain(SID, "call_read") == first
    assert await reopened.size(SID) == 1  # the redelivery took nothing newer
    assert await reopened.drain(SID, "call_new") == (
        "[System: task h3 completed — sys_os_shell returned: three]"
    )
    assert await Inbox(tmp_path).drain(SID, "call_read") == first


async def test_an_empty_drain_is_recorded_too(tmp_path: Path) -> None:
    # Otherwise a redelivered empty drain would swallow an item pushed in between.
    inbox = Inbox(tmp_path)
    assert await inbox.drain(SID, "call_1") == INBOX_EMPTY
    await inbox.push(SID, task("h1"), key="h1")
    assert await Inbox(tmp_path).drain(SID, "call_1") == INBOX_EMPTY
    assert "h1" in await Inbox(tmp_path).drain(SID, "call_2")


async def test_queued_items_survive_a_crash(tmp_path: Path) -> None:
    inbox = Inbox(tmp_path)
    await inbox.push(SID, task("h1", "kept"), key="h1")
    assert "returned: kept" in await Inbox(tmp_path).drain(SID, "call_1")


async def test_every_push_and_drain_is_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inbox = Inbox(tmp_path)
    await inbox.push(SID, task("h0"), key="h0")  # creates the file (and fsyncs the dir)
    synced: list[int] = []
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(jsonlines_module.os, "fsync", counting_fsync)
    await inbox.push(SID, task("h1"), key="h1")
    assert len(synced) == 1
    await inbox.drain(SID, "call_1")
    assert len(synced) == 2
    await inbox.push(SID, task("h1"), key="h1")  # ignored: nothing written
    assert len(synced) == 2


async def test_torn_tail_is_dropped_and_the_file_repaired(tmp_path: Path) -> None:
    inbox = Inbox(tmp_path)
    await inbox.push(SID, task("h1", "whole"), key="h1")
    [path] = files(tmp_path)
    with path.open("ab") as f:
        f.write(b'{"op":"push","key":"h2","item":{"handle_id":"h2","tool_na')  # the crash

    reopened = Inbox(tmp_path)
    await reopened.push(SID, task("h3", "after"), key="h3")
    assert [r["op"] for r in lines_of(tmp_path)] == ["header", "push", "push"]
    text = await Inbox(tmp_path).drain(SID, "call_1")
    assert text == (
        "[System: task h1 completed — sys_os_shell returned: whole]\n\n"
        "[System: task h3 completed — sys_os_shell returned: after]"
    )


async def test_a_damaged_complete_line_is_skipped_not_fatal(tmp_path: Path) -> None:
    inbox = Inbox(tmp_path)
    await inbox.push(SID, task("h1", "a"), key="h1")
    [path] = files(tmp_path)
    with path.open("ab") as f:
        f.write(b"\x00\x00garbage\n")
    await Inbox(tmp_path).push(SID, task("h2", "b"), key="h2")
    text = await Inbox(tmp_path).drain(SID, "call_1")
    assert "h1 completed" in text and "h2 completed" in text


async def test_file_is_compacted_when_mostly_dead(tmp_path: Path) -> None:
    inbox = Inbox(tmp_path)
    for i in range(400):
        await inbox.push(SID, task(f"h{i}"), key=f"h{i}")
        await inbox.drain(SID, f"call_{i}")
    await inbox.push(SID, task("queued", "still here"), key="queued")
    records = lines_of(tmp_path)
    assert len(records) < 400  # 801 records were written
    assert records[0] == {
        "op": "header",
        "format": "corral.inbox",
        "version": 1,
        "session_id": SID,
    }
    reopened = Inbox(tmp_path)
    # Recent answers and keys survive the rewrite; the queued item too.
    assert await reopened.drain(SID, "call_399") == (
        "[System: task h399 completed — sys_os_shell returned: out]"
    )
    assert await reopened.push(SID, task("h398"), key="h398") is False
    assert "still here" in await reopened.drain(SID, "call_final")


# --- review hook, sessions, the tool ---------------------------------------------------------


async def test_review_can_replace_an_item_or_keep_it_queued(tmp_path: Path) -> None:
    inbox = Inbox(tmp_path)
    await inbox.push(SID, task("h1", "SECRET"), key="h1")
    await inbox.push(SID, task("h2", "fine"), key="h2")

    async def review(item: dict[str, Any]) -> Reviewed | None:
        if item["handle_id"] == "h1":
            return Reviewed({**item, "output": "[Result suppressed by policy: x]"}, keep=True)
        return None

    text = await inbox.drain(SID, "call_1", review=review)
    assert "SECRET" not in text
    assert "returned: [Result suppressed by policy: x]" in text
    assert await inbox.size(SID) == 1
    assert "returned: SECRET" in await inbox.drain(SID, "call_2")


async def test_a_failing_review_drains_nothing(tmp_path: Path) -> None:
    inbox = Inbox(tmp_path)
    await inbox.push(SID, task("h1"), key="h1")

    async def review(item: dict[str, Any]) -> Reviewed | None:
        raise RuntimeError("policy service down")

    with pytest.raises(RuntimeError):
        await inbox.drain(SID, "call_1", review=review)
    assert await inbox.size(SID) == 1
    assert "h1 completed" in await inbox.drain(SID, "call_1")


async def test_sessions_have_separate_inboxes(tmp_path: Path) -> None:
    inbox = Inbox(tmp_path)
    await inbox.push("conv/a", task("ha"), key="k")
    await inbox.push("conv_a", task("hb"), key="k")  # same key, other session
    assert len(files(tmp_path)) == 2
    assert "ha completed" in await inbox.drain("conv/a", "call_1")
    assert "hb completed" in await inbox.drain("conv_a", "call_1")
    await inbox.discard("conv_a")
    assert len(files(tmp_path)) == 1


def make_ctx(tmp_path: Path, inbox: Inbox | None, call_id: str = "call_1") -> ToolContext:
    return tool_context(tmp_path, session_id=SID, call_id=call_id, data_dir=tmp_path, inbox=inbox)


async def test_sys_read_inbox_drains_as_its_call_id(tmp_path: Path) -> None:
    [tool] = TOOLS
    assert (tool.name, tool.family) == ("sys_read_inbox", "inbox")
    inbox = Inbox(tmp_path / "inbox")
    await inbox.push(SID, task("h1", "x"), key="h1")
    first = await tool.run(make_ctx(tmp_path, inbox, "call_7"), {})
    assert first == "[System: task h1 completed — sys_os_shell returned: x]"
    assert await tool.run(make_ctx(tmp_path, inbox, "call_7"), {}) == first
    assert await tool.run(make_ctx(tmp_path, inbox, "call_8"), {}) == INBOX_EMPTY
    assert await tool.run(make_ctx(tmp_path, None), {}) == (
        "Error: async inbox not initialized for this session"
    )


async def test_a_long_drain_is_paged_not_cut(tmp_path: Path) -> None:
    inbox = Inbox(tmp_path)
    for i in range(5):
        await inbox.push(SID, task(f"h{i}", "x" * 100), key=f"h{i}")
    reviewed: list[str] = []

    async def review(item: dict[str, Any]) -> Reviewed | None:
        reviewed.append(item["handle_id"])
        return None

    first = await inbox.drain(SID, "call_1", review=review, max_chars=250)
    lines = first.split("\n\n")
    assert [line.split()[2] for line in lines[:2]] == ["h0", "h1"]
    assert lines[2] == "[System: 3 more inbox items not shown — call sys_read_inbox again]"
    assert reviewed == ["h0", "h1"]  # an item not taken is not evaluated
    assert await inbox.size(SID) == 3
    assert await inbox.drain(SID, "call_1", max_chars=250) == first
    # The first item is always taken, however long.
    one = await inbox.drain(SID, "call_2", max_chars=10)
    assert one.startswith("[System: task h2 completed")
    assert one.endswith("[System: 2 more inbox items not shown — call sys_read_inbox again]")
    rest = await inbox.drain(SID, "call_3")
    assert [line.split()[2] for line in rest.split("\n\n")] == ["h3", "h4"]
