"""Background tool calls: T-23 to T-25, redelivery by call id, recovery after a crash."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from corral.tools._api import ToolContext
from corral.tools.async_calls import RESTARTED_OUTPUT, TOOLS, AsyncCalls
from corral.tools.inbox import Inbox, Reviewed
from tests._tool_context import tool_context
from tests.conftest import wait_for

SID = "conv_async"
_TOOLS = {tool.name: tool for tool in TOOLS}


class FakeTools:
    """The inner tools ``ctx.run_tool`` runs, with a record of every run."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, dict[str, Any]]] = []
        self.gate = trio.Event()
        self.slow_cancelled = False

    async def __call__(self, name: str, args: dict[str, Any]) -> str:
        self.runs.append((name, args))
        if name == "fast":
            return "ok"
        if name == "boom":
            raise RuntimeError("kaput")
        if name == "gated":
            await self.gate.wait()
            return "gated-done"
        if name == "slow":
            try:
                await trio.sleep_forever()
            finally:
                self.slow_cancelled = True
        raise AssertionError(f"unexpected tool {name}")


def make_ctx(
    tmp_path: Path,
    calls: AsyncCalls | None,
    tools: FakeTools,
    *,
    call_id: str = "call_1",
    session_id: str = SID,
    inbox: Inbox | None = None,
) -> ToolContext:
    return tool_context(
        tmp_path,
        session_id=session_id,
        call_id=call_id,
        data_dir=tmp_path,
        inbox=inbox if inbox is not None else (calls.inbox if calls is not None else None),
        async_calls=calls,
        run_tool=tools,
    )


async def run(ctx: ToolContext, name: str, **args: Any) -> Any:
    out = await _TOOLS[name].run(ctx, args)
    return json.loads(out) if out.startswith("{") else out


@asynccontextmanager
async def running(tmp_path: Path, **kwargs: Any) -> AsyncIterator[AsyncCalls]:
    """An :class:`AsyncCalls` over ``tmp_path`` running in its own nursery."""
    calls = AsyncCalls(tmp_path / "async", Inbox(tmp_path / "inbox"), **kwargs)
    async with trio.open_nursery() as nursery:
        await nursery.start(calls.run)
        yield calls
        nursery.cancel_scope.cancel()


async def drained_items(inbox: Inbox, call_id: str) -> tuple[str, list[dict[str, Any]]]:
    """Drain the inbox, also returning the raw items (seen through the review hook)."""
    items: list[dict[str, Any]] = []

    async def review(item: dict[str, Any]) -> Reviewed | None:
        items.append(item)
        return None

    return await inbox.drain(SID, call_id, review=review), items


def task_count() -> int:
    """Every task in this trio run, from the root down."""

    def count(task: trio.lowlevel.Task) -> int:
        return 1 + sum(count(t) for n in task.child_nurseries for t in n.child_tasks)

    return count(trio.lowlevel.current_root_task())


async def has_items(inbox: Inbox, n: int = 1) -> bool:
    return await inbox.size(SID) >= n


# --- T-23 ------------------------------------------------------------------------------------


async def test_t23_call_answers_at_once_and_pushes_the_completion(tmp_path: Path) -> None:
    tools = FakeTools()
    async with running(tmp_path) as calls:
        ctx = make_ctx(tmp_path, calls, tools)
        out = await run(ctx, "sys_call_async", tool="fast", args={"x": 1})

        handle = out["handle_id"]
        assert re.fullmatch(r"handle_[0-9a-f]{12}", handle)
        assert out == {
            "handle_id": handle,
            "tool_name": "fast",
            "status": "in_progress",
            "message": (
                f"[System: fast dispatched as background task {handle}. Result will appear in "
                "your inbox — call sys_read_inbox to check.]"
            ),
        }
        await wait_for(lambda: has_items(calls.inbox), "the completion in the inbox")
        text, items = await drained_items(calls.inbox, "call_read")

    assert tools.runs == [("fast", {"x": 1})]
    assert items == [
        {"handle_id": handle, "tool_name": "fast", "status": "completed", "output": "ok"}
    ]
    assert text == f"[System: task {handle} completed — fast returned: ok]"


async def test_t23_an_exception_pushes_failed_with_its_text(tmp_path: Path) -> None:
    tools = FakeTools()
    async with running(tmp_path) as calls:
        out = await run(make_ctx(tmp_path, calls, tools), "sys_call_async", tool="boom")
        await wait_for(lambda: has_items(calls.inbox), "the failure in the inbox")
        _, items = await drained_items(calls.inbox, "call_read")
    assert items == [
        {"handle_id": out["handle_id"], "tool_name": "boom", "status": "failed", "output": "kaput"}
    ]


async def test_t23_args_may_be_a_json_text(tmp_path: Path) -> None:
    tools = FakeTools()
    async with running(tmp_path) as calls:
        await run(make_ctx(tmp_path, calls, tools), "sys_call_async", tool="fast", args='{"y": 2}')
        await wait_for(lambda: has_items(calls.inbox), "the completion")
    assert tools.runs == [("fast", {"y": 2})]


async def test_t23_error_texts(tmp_path: Path) -> None:
    tools = FakeTools()
    async with running(tmp_path) as calls:
        ctx = make_ctx(tmp_path, calls, tools)
        assert await run(ctx, "sys_call_async") == 'Error: sys_call_async requires "tool" argument'
        assert await run(ctx, "sys_call_async", tool=" ") == (
            'Error: sys_call_async requires "tool" argument'
        )
        assert await run(ctx, "sys_call_async", tool="sys_call_async") == (
            "Error: sys_call_async cannot dispatch itself"
        )
        no_inbox = make_ctx(tmp_path, None, tools)
        assert await run(no_inbox, "sys_call_async", tool="fast") == (
            "Error: async inbox not initialized for this session"
        )
        bad = await run(ctx, "sys_call_async", tool="fast", args="{nope")
        assert bad.startswith('Error: sys_call_async "args" is not valid JSON')
        assert await run(ctx, "sys_call_async", tool="fast", args=[1]) == (
            'Error: sys_call_async "args" must be a JSON object'
        )
    assert tools.runs == []


async def test_t23_a_run_longer_than_the_limit_fails(tmp_path: Path) -> None:
    tools = FakeTools()
    async with running(tmp_path, max_runtime_s=0.05) as calls:
        await run(make_ctx(tmp_path, calls, tools), "sys_call_async", tool="slow")
        await wait_for(lambda: has_items(calls.inbox), "the timeout in the inbox")
        _, [item] = await drained_items(calls.inbox, "call_read")
    assert (item["status"], item["output"]) == ("failed", "slow did not finish within 0.05s")
    assert tools.slow_cancelled


# --- T-24 ------------------------------------------------------------------------------------


@pytest.mark.parametrize("argument", ["handle_id", "task_id"])
async def test_t24_cancel_stops_an_in_flight_call(tmp_path: Path, argument: str) -> None:
    tools = FakeTools()
    async with running(tmp_path) as calls:
        ctx = make_ctx(tmp_path, calls, tools)
        handle = (await run(ctx, "sys_call_async", tool="slow"))["handle_id"]

        async def tool_started() -> bool:
            return bool(tools.runs)

        await wait_for(tool_started, "the slow tool to start")
        answer = await run(
            make_ctx(tmp_path, calls, tools, call_id="c2"), "sys_cancel_async", **{argument: handle}
        )

        assert answer == {"cancelled": True, "handle_id": handle}
        assert tools.slow_cancelled
        text, items = await drained_items(calls.inbox, "call_read")
    assert items == [
        {"handle_id": handle, "tool_name": "slow", "status": "cancelled", "output": ""}
    ]
    assert text == f"[System: task {handle} cancelled]"


async def test_t24_cancel_of_an_unknown_or_finished_handle(tmp_path: Path) -> None:
    tools = FakeTools()
    async with running(tmp_path) as calls:
        ctx = make_ctx(tmp_path, calls, tools)
        assert await run(ctx, "sys_cancel_async", handle_id="handle_000000000000") == {
            "cancelled": False,
            "handle_id": "handle_000000000000",
            "status": "unknown",
            "message": "no background task with this handle in this session",
        }
        assert await run(ctx, "sys_cancel_async") == (
            'Error: sys_cancel_async requires "handle_id" argument'
        )
        handle = (await run(ctx, "sys_call_async", tool="fast"))["handle_id"]
        await wait_for(lambda: has_items(calls.inbox), "the completion")
        assert await run(ctx, "sys_cancel_async", handle_id=handle) == {
            "cancelled": False,
            "handle_id": handle,
            "status": "completed",
            "message": "the task already finished (completed)",
        }
        # Another session cannot see (or cancel) this session's handles.
        other = make_ctx(tmp_path, calls, tools, session_id="conv_other")
        assert (await run(other, "sys_cancel_async", handle_id=handle))["status"] == "unknown"


# --- T-25 ------------------------------------------------------------------------------------


async def test_t25_nothing_of_a_call_remains_after_completion_or_cancel(tmp_path: Path) -> None:
    tools = FakeTools()
    async with running(tmp_path) as calls:
        ctx = make_ctx(tmp_path, calls, tools)
        baseline = task_count()

        # Completion path: the tool finishes, nothing waits for a cancel any more.
        await run(ctx, "sys_call_async", tool="gated")

        async def started() -> bool:
            return bool(tools.runs)

        await wait_for(started, "the gated tool to start")
        assert task_count() == baseline + 1 and len(calls.running()) == 1
        tools.gate.set()
        await wait_for(lambda: has_items(calls.inbox), "the completion")

        async def settled() -> bool:
            return not calls.running() and task_count() == baseline

        await wait_for(settled, "the completed call's task to end")

        # Cancel path: the tool is cut off, nothing of it is left running.
        slow = make_ctx(tmp_path, calls, tools, call_id="call_2")
        handle = (await run(slow, "sys_call_async", tool="slow"))["handle_id"]
        assert task_count() == baseline + 1
        await run(slow, "sys_cancel_async", handle_id=handle)
        assert calls.running() == []
        assert task_count() == baseline
        stats = calls.statistics()
        assert (stats.running, stats.recorded, stats.finished) == (0, 2, 2)


# --- durability ------------------------------------------------------------------------------


async def test_a_redelivered_call_returns_the_same_handle_and_runs_once(tmp_path: Path) -> None:
    tools = FakeTools()
    async with running(tmp_path) as calls:
        ctx = make_ctx(tmp_path, calls, tools, call_id="call_dup")
        first = await run(ctx, "sys_call_async", tool="gated")
        assert await run(ctx, "sys_call_async", tool="gated") == first  # while it runs
        tools.gate.set()
        await wait_for(lambda: has_items(calls.inbox), "the completion")
        assert await run(ctx, "sys_call_async", tool="gated") == first  # after it finished
    assert len(tools.runs) == 1
    # ... and after a restart.
    async with running(tmp_path) as restarted:
        ctx = make_ctx(tmp_path, restarted, tools, call_id="call_dup")
        assert await run(ctx, "sys_call_async", tool="gated") == first
        assert await restarted.inbox.size(SID) == 1
    assert len(tools.runs) == 1


async def test_recovery_reports_a_call_the_crash_cut_off_as_failed(tmp_path: Path) -> None:
    tools = FakeTools()
    async with running(tmp_path) as calls:
        ctx = make_ctx(tmp_path, calls, tools, call_id="call_cut")
        handle = (await run(ctx, "sys_call_async", tool="slow"))["handle_id"]

        async def started() -> bool:
            return bool(tools.runs)

        await wait_for(started, "the slow tool to start")
        # Leaving the block cancels run(): the "crash" — the call never reports.
    assert await calls.inbox.size(SID) == 0

    restarted = AsyncCalls(tmp_path / "async", Inbox(tmp_path / "inbox"))
    assert await restarted.recover() == 1
    assert await restarted.recover() == 0  # reported once
    text, items = await drained_items(restarted.inbox, "call_read")
    assert items == [
        {"handle_id": handle, "tool_name": "slow", "status": "failed", "output": RESTARTED_OUTPUT}
    ]
    assert text == f"[System: task {handle} failed — slow error: {RESTARTED_OUTPUT}]"
    # The redelivered sys_call_async is answered, not run again.
    async with trio.open_nursery() as nursery:
        await nursery.start(restarted.run)
        again = make_ctx(tmp_path, restarted, tools, call_id="call_cut")
        assert (await run(again, "sys_call_async", tool="slow"))["handle_id"] == handle
        nursery.cancel_scope.cancel()
    assert len(tools.runs) == 1


async def test_a_result_pushed_just_before_a_crash_is_not_replaced_by_recovery(
    tmp_path: Path,
) -> None:
    tools = FakeTools()
    async with running(tmp_path) as calls:
        await run(make_ctx(tmp_path, calls, tools), "sys_call_async", tool="fast")
        await wait_for(lambda: has_items(calls.inbox), "the completion")

        async def finished() -> bool:
            return calls.statistics().finished == 1

        await wait_for(finished, "the finish record")
    # A finished call is nothing to recover.
    assert await AsyncCalls(tmp_path / "async", Inbox(tmp_path / "inbox")).recover() == 0
    # The crash came after the inbox push but before the finish record was written.
    log = tmp_path / "async" / "async_calls.jsonl"
    records = log.read_text().splitlines()
    assert json.loads(records[-1])["op"] == "finish"
    log.write_text("\n".join(records[:-1]) + "\n")

    restarted = AsyncCalls(tmp_path / "async", Inbox(tmp_path / "inbox"))
    assert await restarted.recover() == 1
    _, items = await drained_items(restarted.inbox, "call_read")
    assert [item["status"] for item in items] == ["completed"]


def test_tools_exported_for_the_registry() -> None:
    assert [(t.name, t.family) for t in TOOLS] == [
        ("sys_call_async", "inbox"),
        ("sys_cancel_async", "inbox"),
        ("sys_read_inbox", "inbox"),
    ]
