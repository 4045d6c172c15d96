"""Background tool calls: ``sys_call_async`` and ``sys_cancel_async`` (T-23..T-25).

``sys_call_async {"tool": name, "args": {...}}`` starts ``name`` in the background and
answers at once with a handle (``handle_<12 hex>``); the result arrives later in the
session's inbox (:mod:`corral.tools.inbox`) as
``{"handle_id", "tool_name", "status", "output"}`` with status ``completed``, ``failed`` (the
exception text) or ``cancelled`` (``sys_cancel_async``, output ``""``).

Why it looks the way it does:

* **Structured concurrency.** Every background call is a child task of one nursery owned by
  :meth:`AsyncCalls.run`, inside its own cancel scope. Cancelling a handle cancels that scope;
  the task then reports ``cancelled`` and ends. Nothing else is started, so when a call has
  finished nothing of it remains (T-25) — the asyncio original had to cancel a "losing
  future" by hand and leaked one task per call when it forgot.
* **Durability.** A start is recorded on disk (with the ``call_id`` of the ``sys_call_async``
  call) before the handle is returned. A ``sys_call_async`` redelivered after a crash carries
  the same ``call_id`` and gets the same handle back instead of a second run. A call that was
  running when the tools actor died cannot be resumed (its context died with the process),
  but it is not forgotten either: :meth:`AsyncCalls.recover` reports it as ``failed`` with
  :data:`RESTARTED_OUTPUT`. Completions go to the inbox keyed by the handle id, so a result
  that was pushed just before a crash is not pushed again by recovery.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NotRequired, TypedDict

import trio

from .._jsonlines import JsonLinesLog, JsonObject
from ._api import RunTool, ToolContext, ToolSpec
from .inbox import NO_INBOX, SYS_READ_INBOX, Inbox

log = logging.getLogger("corral.tools.async_calls")

#: The output of a call the tools actor was running when it died.
RESTARTED_OUTPUT = (
    "the tools actor restarted while this task ran; it did not finish and its result is lost"
)
#: On-disk format version of the start/finish log.
FORMAT_VERSION = 1
_SELF = "sys_call_async"
# Finished calls remembered (for a redelivered sys_call_async) after a compaction.
_KEEP_FINISHED = 1000


def new_handle_id() -> str:
    """A fresh handle id: ``handle_`` and 12 hex digits."""
    return f"handle_{secrets.token_hex(6)}"


class Dispatched(TypedDict):
    """The immediate answer of ``sys_call_async``."""

    handle_id: str
    tool_name: str
    status: Literal["in_progress"]
    message: str


class CancelAnswer(TypedDict):
    """The answer of ``sys_cancel_async``; see :meth:`AsyncCalls.cancel`."""

    cancelled: bool
    handle_id: str
    status: NotRequired[str]
    message: NotRequired[str]


class _StartRecord(TypedDict):
    op: Literal["start"]
    handle_id: str
    session_id: str
    call_id: str
    tool_name: str
    at: float
    status: NotRequired[str]


class _Header(TypedDict):
    op: Literal["header"]
    format: Literal["corral.async_calls"]
    version: int


def dispatched_output(handle_id: str, tool_name: str) -> Dispatched:
    """The immediate answer of ``sys_call_async`` (T-23)."""
    return {
        "handle_id": handle_id,
        "tool_name": tool_name,
        "status": "in_progress",
        "message": (
            f"[System: {tool_name} dispatched as background task {handle_id}. Result will "
            "appear in your inbox — call sys_read_inbox to check.]"
        ),
    }


@dataclass(slots=True)
class _Started:
    """One recorded start; ``status`` is None until the call finished."""

    handle_id: str
    session_id: str
    call_id: str
    tool_name: str
    at: float
    status: str | None = None

    def record(self) -> _StartRecord:
        out: _StartRecord = {
            "op": "start",
            "handle_id": self.handle_id,
            "session_id": self.session_id,
            "call_id": self.call_id,
            "tool_name": self.tool_name,
            "at": self.at,
        }
        if self.status is not None:
            out["status"] = self.status
        return out


@dataclass(slots=True)
class _Running:
    """A call in flight: its cancel scope and the event set when its task has ended."""

    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    done: trio.Event = field(default_factory=trio.Event)


@dataclass(frozen=True, slots=True)
class AsyncCallsStatistics:
    """A snapshot of :class:`AsyncCalls`: calls in flight, recorded, finished."""

    running: int
    recorded: int
    finished: int


class AsyncCalls:
    """Runs ``sys_call_async`` calls in the background and delivers their results.

    One instance per tools actor, over its own directory (``dir/async_calls.jsonl``) and the
    actor's :class:`~corral.tools.inbox.Inbox`. It works only while :meth:`run` runs::

        async with trio.open_nursery() as nursery:
            await nursery.start(async_calls.run)   # recovers, then accepts calls
            ...                                    # serve tool calls
            nursery.cancel_scope.cancel()          # stops every background call

    A call still running when :meth:`run` is cancelled is not reported; the next
    incarnation's :meth:`recover` reports it as failed.

    Args:
        dir: where the start/finish log lives.
        inbox: where results go.
        max_runtime_s: a background call running longer fails with a timeout.
    """

    def __init__(self, dir: Path, inbox: Inbox, *, max_runtime_s: float = 3600.0) -> None:
        self.dir = dir
        self.inbox = inbox
        self.max_runtime_s = max_runtime_s
        self._log = JsonLinesLog(dir / "async_calls.jsonl", trio.CapacityLimiter(2))
        self._loaded = False
        self._lock = trio.Lock()
        self._records = 0
        self._handles: dict[str, _Started] = {}
        self._by_call: dict[tuple[str, str], str] = {}
        self._running: dict[str, _Running] = {}
        self._nursery: trio.Nursery | None = None

    # -- lifecycle ------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Recover, then own the background calls until cancelled (use ``nursery.start``)."""
        await self.recover()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None

    async def recover(self) -> int:
        """Report every recorded call that never finished as failed; returns how many.

        Called by :meth:`run`; safe to call again (calls running now are left alone).
        """
        await self._load()
        orphans = [
            s
            for s in self._handles.values()
            if s.status is None and s.handle_id not in self._running
        ]
        for started in orphans:
            log.warning(
                "async call %s (%s) of session %s was cut off by a restart",
                started.handle_id,
                started.tool_name,
                started.session_id,
            )
            await self._finish(started, "failed", RESTARTED_OUTPUT)
        return len(orphans)

    # -- operations -----------------------------------------------------------------------

    async def call(
        self, ctx: ToolContext, tool_name: str, args: JsonObject, run_tool: RunTool
    ) -> Dispatched:
        """Start ``tool_name(args)`` in the background for ``ctx``'s session.

        Idempotent by ``(ctx.session_id, ctx.call_id)``: a repeated call returns the first
        call's answer and starts nothing. Returns :func:`dispatched_output`.

        Raises:
            RuntimeError: :meth:`run` is not running.
        """
        await self._load()
        key = (ctx.session_id, ctx.call_id)
        async with self._lock:
            known = self._by_call.get(key)
            if known is not None:
                started = self._handles[known]
                return dispatched_output(started.handle_id, started.tool_name)
            nursery = self._nursery
            if nursery is None:
                raise RuntimeError("AsyncCalls.run is not running")
            handle = new_handle_id()
            while handle in self._handles:
                handle = new_handle_id()
            started = _Started(handle, ctx.session_id, ctx.call_id, tool_name, time.time())
            # Durable before the model hears of the handle; shielded so memory matches disk.
            with trio.CancelScope(shield=True):
                await self._log.append([started.record()])
                self._records += 1
                self._handles[handle] = started
                self._by_call[key] = handle
            running = _Running()
            self._running[handle] = running
            nursery.start_soon(self._run_one, started, running, args, run_tool, name=handle)
        return dispatched_output(handle, tool_name)

    async def cancel(
        self, session_id: str, handle_id: str, *, wait_s: float = 10.0
    ) -> CancelAnswer:
        """Cancel ``handle_id`` and wait (at most ``wait_s``) until it has reported.

        Returns ``{"cancelled": True, "handle_id"}`` when the call ended cancelled (now or
        earlier); ``{"cancelled": False, "handle_id", "status", "message"}`` when there is no
        such call in this session (status ``unknown``), when it had already finished, or
        when it finished before the cancel reached it.
        """
        await self._load()
        started = self._handles.get(handle_id)
        if started is None or started.session_id != session_id:
            return {
                "cancelled": False,
                "handle_id": handle_id,
                "status": "unknown",
                "message": "no background task with this handle in this session",
            }
        running = self._running.get(handle_id)
        if running is not None:
            running.scope.cancel()
            with trio.move_on_after(wait_s):
                await running.done.wait()
        if started.status == "cancelled":
            return {"cancelled": True, "handle_id": handle_id}
        if started.status is None:
            # The tool has not reacted to the cancel yet; its scope stays cancelled, so it
            # reports "cancelled" as soon as it reaches a checkpoint.
            return {"cancelled": True, "handle_id": handle_id, "status": "cancelling"}
        return {
            "cancelled": False,
            "handle_id": handle_id,
            "status": started.status,
            "message": f"the task already finished ({started.status})",
        }

    def running(self) -> list[str]:
        """Handle ids of the calls in flight now."""
        return list(self._running)

    def statistics(self) -> AsyncCallsStatistics:
        """Counts of calls in flight, recorded and finished."""
        finished = sum(1 for s in self._handles.values() if s.status is not None)
        return AsyncCallsStatistics(len(self._running), len(self._handles), finished)

    # -- internals ------------------------------------------------------------------------

    async def _run_one(
        self, started: _Started, running: _Running, args: JsonObject, run_tool: RunTool
    ) -> None:
        status, output = "failed", ""
        try:
            with running.scope:
                try:
                    with trio.fail_after(self.max_runtime_s):
                        result = await run_tool(started.tool_name, args)
                    status = "completed"
                    output = result if isinstance(result, str) else json.dumps(result)
                except trio.TooSlowError:
                    output = f"{started.tool_name} did not finish within {self.max_runtime_s:g}s"
                except Exception as exc:
                    # The inner tool's failure is the call's result, not a crash of ours.
                    output = str(exc) or type(exc).__name__
            if running.scope.cancelled_caught:
                status, output = "cancelled", ""
            await self._finish(started, status, output)
        finally:
            # Cancelled from outside (run() stopping): no report; recover() makes it next time.
            del self._running[started.handle_id]
            running.done.set()

    async def _finish(self, started: _Started, status: str, output: str) -> None:
        item = {
            "handle_id": started.handle_id,
            "tool_name": started.tool_name,
            "status": status,
            "output": output,
        }
        # Inbox first, then the finish record: a crash in between makes recover() push again,
        # which the inbox ignores (same key). Shielded: a half-done finish is worse than a
        # late stop.
        with trio.CancelScope(shield=True):
            await self.inbox.push(started.session_id, item, key=started.handle_id)
            async with self._lock:
                await self._log.append(
                    [{"op": "finish", "handle_id": started.handle_id, "status": status}]
                )
                self._records += 1
                started.status = status
                await self._maybe_compact()

    async def _load(self) -> None:
        if self._loaded:
            return
        async with self._lock:
            if self._loaded:
                return
            await trio.to_thread.run_sync(lambda: self.dir.mkdir(parents=True, exist_ok=True))
            records = await self._log.load()
            for record in records:
                self._replay(record)
            self._records = len(records)
            if not records:
                await self._log.append([_header()])
                self._records = 1
            self._loaded = True

    def _replay(self, record: JsonObject) -> None:
        op = record.get("op")
        if op == "header":
            version = record.get("version")
            if isinstance(version, int) and version > FORMAT_VERSION:
                raise ValueError(
                    f"{self._log.path}: async-call format version {version} is newer than "
                    f"this corral understands ({FORMAT_VERSION})"
                )
        elif op == "start":
            try:
                started = _Started(
                    handle_id=str(record["handle_id"]),
                    session_id=str(record["session_id"]),
                    call_id=str(record["call_id"]),
                    tool_name=str(record["tool_name"]),
                    at=float(record.get("at", 0.0)),
                    status=record.get("status"),
                )
            except (KeyError, TypeError, ValueError):
                log.warning("%s: skipping a malformed start record", self._log.path)
                return
            self._handles[started.handle_id] = started
            self._by_call[(started.session_id, started.call_id)] = started.handle_id
        elif op == "finish":
            known = self._handles.get(str(record.get("handle_id")))
            if known is not None:
                known.status = str(record.get("status") or "failed")

    async def _maybe_compact(self) -> None:
        # Called with the lock held. Live records after a rewrite: header + one per call kept.
        finished = [s for s in self._handles.values() if s.status is not None]
        unfinished = [s for s in self._handles.values() if s.status is None]
        kept = finished[-_KEEP_FINISHED:]
        live = 1 + len(unfinished) + len(kept)
        if self._records < max(2 * live, live + 256):
            return
        ordered = sorted([*kept, *unfinished], key=lambda s: s.at)
        await self._log.rewrite([_header(), *(s.record() for s in ordered)])
        self._records = 1 + len(ordered)
        self._handles = {s.handle_id: s for s in ordered}
        self._by_call = {(s.session_id, s.call_id): s.handle_id for s in ordered}


def _header() -> _Header:
    return {"op": "header", "format": "corral.async_calls", "version": FORMAT_VERSION}


# ---------------------------------------------------------------------------------------------
# The tools


def _inner_args(raw: Any) -> JsonObject | str:
    """The inner tool's arguments (an object, a JSON text of one, or absent), or an error."""
    if raw is None:
        return {}
    if isinstance(raw, str):
        if not raw.strip():
            return {}
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            return f'Error: sys_call_async "args" is not valid JSON: {exc}'
    if not isinstance(raw, dict):
        return 'Error: sys_call_async "args" must be a JSON object'
    return raw


async def _sys_call_async(ctx: ToolContext, args: JsonObject) -> str:
    tool = args.get("tool")
    if not isinstance(tool, str) or not tool.strip():
        return 'Error: sys_call_async requires "tool" argument'
    tool = tool.strip()
    if tool == _SELF:
        return "Error: sys_call_async cannot dispatch itself"
    if ctx.inbox is None or ctx.async_calls is None:
        return NO_INBOX
    if ctx.run_tool is None:
        return "Error: sys_call_async cannot run tools in this context"
    inner = _inner_args(args.get("args"))
    if isinstance(inner, str):
        return inner
    answer = await ctx.async_calls.call(ctx, tool, inner, ctx.run_tool)
    return json.dumps(answer, ensure_ascii=False)


async def _sys_cancel_async(ctx: ToolContext, args: JsonObject) -> str:
    handle = args.get("handle_id") or args.get("task_id")  # task_id: the legacy spelling
    if not isinstance(handle, str) or not handle.strip():
        return 'Error: sys_cancel_async requires "handle_id" argument'
    if ctx.async_calls is None:
        return NO_INBOX
    answer = await ctx.async_calls.cancel(
        ctx.session_id, handle.strip(), wait_s=max(0.0, min(ctx.timeout_s, 10.0))
    )
    return json.dumps(answer, ensure_ascii=False)


SYS_CALL_ASYNC = ToolSpec(
    name="sys_call_async",
    description=(
        "Run another tool in the background. Returns a handle at once; the tool's result "
        "appears in your inbox when it finishes (call sys_read_inbox). Cancel with "
        "sys_cancel_async."
    ),
    parameters={
        "type": "object",
        "properties": {
            "tool": {"type": "string", "description": "Name of the tool to run."},
            "args": {
                "type": ["object", "string"],
                "description": "The tool's arguments (an object, or a JSON text of one).",
            },
        },
        "required": ["tool"],
    },
    run=_sys_call_async,
    family="inbox",
)

SYS_CANCEL_ASYNC = ToolSpec(
    name="sys_cancel_async",
    description=(
        "Cancel a background task started with sys_call_async. Its inbox entry then says "
        "it was cancelled."
    ),
    parameters={
        "type": "object",
        "properties": {
            "handle_id": {"type": "string", "description": "The handle sys_call_async gave."},
            "task_id": {"type": "string", "description": "Older name of handle_id."},
        },
    },
    run=_sys_cancel_async,
    family="inbox",
)

#: ``sys_call_async``, ``sys_cancel_async`` and ``sys_read_inbox`` (from :mod:`.inbox`).
TOOLS: list[ToolSpec] = [SYS_CALL_ASYNC, SYS_CANCEL_ASYNC, SYS_READ_INBOX]
