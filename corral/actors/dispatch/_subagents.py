"""The durable sub-agent work registry: one entry per dispatched child, and its one result.

``sys_session_send`` (the tools actor) gives a child session work, then registers it here
(:class:`~.messages.SubagentDispatched`) before the child's message is posted, so the child's
turn cannot end unseen. Dispatch owns every session and sees every turn's terminal edge: when
the child's turn chain ends (its terminal edge, never a turn followed by a continuation, S-18),
each open entry of that child takes the result — the child's last assistant text, its error,
or ``cancelled`` — and the result is delivered to the parent exactly once (S-14, S-19):

1. **recorded** here (fsynced) *before* the child's end is saved in ``sessions.log``: a crash
   between the two ends the turn again on the redelivered terminal, and the same result key
   (dispatch id + child turn id) is recorded once;
2. **pushed** to the parent's inbox (the tools actor, a durable call, idempotent by the
   result key), then marked ``pushed``;
3. the parent **woken** (``POST /v1/sessions/{parent}/events``, the §J step 7 message, with
   an ``Idempotency-Key`` derived from the result key), then marked ``woken``.

A restarted dispatch delivers every recorded result not yet marked ``woken``: a second push
is ignored by the inbox, so the parent's inbox holds the result once whichever step a crash
cut off. The wake is at least once: on the embedded control plane its key makes a repeat a
no-op; the real server keeps no key for a runner's message, so a crash in the instant between
its answer and the ``woken`` mark wakes the parent a second time (its ``sys_read_inbox`` then
finds nothing new).

The log is ``subagents.log`` in dispatch's data directory: one JSON line per change of an
entry (the whole entry, the last line of a dispatch id wins), a torn last line dropped at
load, rewritten at start to the live entries when it holds many dead lines.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import msgspec
import trio

from ..._jsonlines import JsonLinesLog, JsonObject
from . import _history as history

if TYPE_CHECKING:
    from ._turn import Turn

__all__ = [
    "PREVIEW_CHARS",
    "WorkEntry",
    "WorkRegistry",
    "child_task_status",
    "last_assistant_text",
    "truncate_preview",
    "turn_result",
]

WorkStatus = Literal["launching", "in_progress", "completed", "failed", "cancelled"]
#: The statuses that end an entry: its result is delivered.
TERMINAL: frozenset[str] = frozenset({"completed", "failed", "cancelled"})
#: Characters of a child's message preview mirrored to its parent (S-23, the server's own cap).
PREVIEW_CHARS = 150
#: Delivered entries kept (for inspection) when the log is rewritten; older ones are dropped.
KEEP_DELIVERED = 1000
#: A log is rewritten at load once it holds this many more lines than live entries.
_REWRITE_SLACK = 512

#: S-22: the child's ``session.status`` as its parent sees the child's task status.
_TASK_STATUS = {
    "launching": "launching",
    "running": "in_progress",
    "waiting": "in_progress",
    "idle": "completed",
    "failed": "failed",
}


def child_task_status(session_status: str) -> str | None:
    """S-22: ``current_task_status`` of a child whose session status is ``session_status``
    (None: unmapped, the field is left out)."""
    return _TASK_STATUS.get(session_status)


def truncate_preview(text: str, cap: int = PREVIEW_CHARS) -> str:
    """S-23: ``text`` unchanged when short, else its first ``cap`` characters and ``…``."""
    return text if len(text) <= cap else text[:cap] + "\u2026"


def turn_result(turn: Turn, status: str, failure: JsonObject | None) -> tuple[WorkStatus, str]:
    """How a sub-agent's turn that ended ``status`` is reported to its parent (S-15): its last
    assistant text, its error, or ``cancelled`` when it was interrupted."""
    if status == "failed":
        return "failed", str((failure or {}).get("message") or "turn failed")
    if turn.interrupted:
        return "cancelled", ""
    return "completed", last_assistant_text(history.commit(turn.items, turn.text, keep_draft=True))


def last_assistant_text(items: list[JsonObject]) -> str:
    """The text of the last assistant message of a turn's committed items (D-33): what a
    child delivers as its output (S-14)."""
    for item in reversed(items):
        if item.get("type") == "message" and item.get("role") == "assistant":
            content = item.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return "".join(
                    b["text"]
                    for b in content
                    if isinstance(b, dict) and isinstance(b.get("text"), str)
                )
    return ""


class WorkEntry(msgspec.Struct, kw_only=True):
    """One dispatched child's work (S-19): who asked, which child, how it ended, and how far
    its result got to the parent."""

    #: ``subagent_<12 hex>``: the child's ``omnigent.subagent.dispatch_id`` label.
    dispatch_id: str
    parent_id: str
    child_id: str
    agent: str
    title: str
    #: The runner id the parent is bound through: whose server the parent is woken on.
    runner_id: str | None = None
    status: WorkStatus = "launching"
    #: The child's output (its last assistant text, or its error); empty when cancelled.
    output: str = ""
    #: The child turn whose end is the result (part of the result's idempotency key).
    turn_id: str | None = None
    #: The result is in the parent's inbox.
    pushed: bool = False
    #: The parent was told (its wake message posted).
    woken: bool = False
    #: The parent's ``sys_read_inbox`` took the result (S-17).
    drained: bool = False
    #: The child never got its message (the tool failed, and told the parent): closed with
    #: nothing to deliver.
    abandoned: bool = False
    created_at: float = 0.0
    ended_at: float = 0.0

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def done(self) -> bool:
        """Nothing is left to do for it: its result was delivered (the parent woken for it;
        it may have taken it before, ``drained``)."""
        return self.terminal and self.woken

    @property
    def key(self) -> str:
        """The result's idempotency key: the inbox keeps it once, and the wake derives its own."""
        return f"{self.dispatch_id}:{self.turn_id or 'closed'}"

    def inbox_item(self) -> JsonObject:
        """S-20: the parent's inbox item, with the per-dispatch ``work_id``."""
        return {
            "type": "sub_agent",
            "task_id": self.child_id,
            "handle_id": self.child_id,
            "conversation_id": self.child_id,
            "tool_name": self.agent,
            "agent": self.agent,
            "title": self.title,
            "status": self.status,
            "output": self.output,
            "work_id": self.dispatch_id,
        }

    def wake_message(self) -> JsonObject:
        """§J step 7: the user message that starts the parent's next turn."""
        text = (
            f"[System: sub-agent {self.agent}/{self.title} finished ({self.status}) — 1 result "
            "waiting in inbox. Call sys_read_inbox to collect.]"
        )
        return {
            "type": "message",
            "data": {"role": "user", "content": [{"type": "input_text", "text": text}]},
        }


class WorkRegistry:
    """The entries, in memory and in ``subagents.log``; :meth:`load` before use.

    ``on_result`` is told each entry whose result was just recorded (dispatch delivers it, in
    the background), ``on_started`` each entry whose child began its work.
    """

    def __init__(self, data_dir: Path) -> None:
        self.log = JsonLinesLog(data_dir / "subagents.log", trio.CapacityLimiter(1))
        self.entries: dict[str, WorkEntry] = {}
        self.on_result: Callable[[WorkEntry], None] | None = None
        self.on_started: Callable[[WorkEntry], None] | None = None
        #: Lines in the log: past the live entries' count by enough, it is rewritten.
        self._lines = 0
        #: An append waits for a rewrite in progress, so the rewrite cannot drop its line.
        self._writing = trio.Lock()

    async def load(self) -> list[WorkEntry]:
        """Read the log back; returns the entries whose result is not delivered yet."""
        lines = await self.log.load()
        self._lines = len(lines)
        for line in lines:
            try:
                entry = msgspec.convert(line, WorkEntry)
            except msgspec.ValidationError:
                continue
            self.entries[entry.dispatch_id] = entry
        await self._compact()
        return self.undelivered()

    def undelivered(self) -> list[WorkEntry]:
        """Entries with a result still to deliver, oldest first."""
        return sorted(
            (e for e in self.entries.values() if e.terminal and not e.done),
            key=lambda e: e.ended_at,
        )

    def open_for(self, child_id: str) -> list[WorkEntry]:
        """The child's entries still waiting for its result."""
        return [e for e in self.entries.values() if e.child_id == child_id and not e.terminal]

    async def add(self, entry: WorkEntry) -> bool:
        """Record a new entry (fsynced); False when its dispatch id is known (a redelivery)."""
        if entry.dispatch_id in self.entries:
            return False
        entry.created_at = entry.created_at or time.time()
        self.entries[entry.dispatch_id] = entry
        await self.save(entry)
        return True

    async def abandon(self, entry: WorkEntry) -> None:
        """Close the entry of ``entry.dispatch_id`` (recorded if it was not): its child never
        got the message, and the parent knows from the tool's error, so nothing is delivered."""
        current = self.entries.setdefault(entry.dispatch_id, entry)
        if current.terminal:
            return
        current.status, current.pushed, current.woken = "cancelled", True, True
        current.abandoned = True
        current.created_at = current.created_at or time.time()
        current.ended_at = time.time()
        await self.save(current)

    async def save(self, entry: WorkEntry) -> None:
        """Append the entry as it is now (fsynced)."""
        await self._append([entry])
        await self._compact()

    async def drained(self, parent_id: str, work_ids: list[str]) -> list[WorkEntry]:
        """The parent took these results from its inbox (S-17): each of its entries with a
        result is done (saved), whatever step of its delivery was left; an id of another
        parent, of work still running or already drained is ignored. Done entries past
        :data:`KEEP_DELIVERED` are forgotten, so the registry does not keep them all."""
        taken = [
            entry
            for work_id in dict.fromkeys(work_ids)
            if (entry := self.entries.get(work_id)) is not None
            and entry.parent_id == parent_id
            and entry.terminal
            and not entry.drained
        ]
        for entry in taken:
            entry.drained = True
        if taken:
            await self._append(taken)
        await self._compact()
        return taken

    async def _append(self, entries: list[WorkEntry]) -> None:
        async with self._writing:
            await self.log.append([msgspec.to_builtins(e) for e in entries])
            self._lines += len(entries)

    def started(self, child_id: str) -> list[WorkEntry]:
        """The child's turn began: its launching entries are ``in_progress``, each told to
        ``on_started`` (not saved: a restart reads them as launching, which ends the same
        way)."""
        entries = [e for e in self.open_for(child_id) if e.status == "launching"]
        for entry in entries:
            entry.status = "in_progress"
            if self.on_started is not None:
                self.on_started(entry)
        return entries

    async def ended(
        self, child_id: str, turn_id: str | None, status: WorkStatus, output: str
    ) -> list[WorkEntry]:
        """The child's turn chain ended (``turn_id``; None: the child was closed): each open
        entry takes the result, saved before this returns, then goes to ``on_result``."""
        entries = self.open_for(child_id)
        now = time.time()
        for entry in entries:
            entry.status, entry.output, entry.turn_id, entry.ended_at = (
                status,
                output,
                turn_id,
                now,
            )
        if entries:
            await self._append(entries)
        if self.on_result is not None:
            for entry in entries:
                self.on_result(entry)
        return entries

    async def _compact(self) -> None:
        """Forget done entries past the newest :data:`KEEP_DELIVERED`, and rewrite the log to
        the entries kept once it holds :data:`_REWRITE_SLACK` lines more than them."""
        done = sorted((e for e in self.entries.values() if e.done), key=lambda e: e.ended_at)
        for entry in done[:-KEEP_DELIVERED] if len(done) > KEEP_DELIVERED else ():
            del self.entries[entry.dispatch_id]
        async with self._writing:
            if self._lines <= len(self.entries) + _REWRITE_SLACK:
                return
            kept = [msgspec.to_builtins(e) for e in self.entries.values()]
            await self.log.rewrite(kept)
            self._lines = len(kept)
