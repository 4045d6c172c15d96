"""The durable per-session inbox that ``sys_read_inbox`` drains (T-17..T-19).

Background work (``sys_call_async`` completions, sub-agent results, terminal notices) is
*pushed* to the inbox of the session that started it; the model *drains* it with
``sys_read_inbox``, which renders every queued item as one text and removes them.

The runner this replaces kept the inbox as an in-memory queue, so a crash lost every
completion waiting in it, and a redelivered completion could be queued twice. Here both
operations are durable and idempotent:

* :meth:`Inbox.push` takes an idempotency key (the handle id of an async call, the work id of
  a sub-agent dispatch ...). A second push of a key already seen is ignored, so a completion
  redelivered after a crash is never delivered twice.
* :meth:`Inbox.drain` takes the ``call_id`` of the ``sys_read_inbox`` call and records the
  rendered text with it before returning. A tool call redelivered after a crash carries the
  same ``call_id`` and gets exactly the same text back; a new call gets only what was pushed
  since. Nothing is lost (the first answer may never have reached the model) and nothing is
  shown twice.

Storage is one append-only JSON-lines file per session (:class:`JsonLinesLog`), fsynced
after every push and drain, repaired at its torn tail on load and rewritten when most of it
is dead. The format is documented in ``docs/terminals-and-inbox.md``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple, TypedDict

import trio

from .._jsonlines import JsonLinesLog, JsonObject
from ._api import ToolContext, ToolSpec

#: What a drain of an empty inbox returns (T-19).
INBOX_EMPTY = "Inbox is empty — no completed tasks."
#: Longest item output shown in a drain; the rest is cut with a marker (T-17).
OUTPUT_CAP = 12_000
#: On-disk format version of an inbox file (its header record).
FORMAT_VERSION = 1

# Idempotency keys are kept for this many delivered items per session. A redelivery comes
# right after the crash that caused it, never thousands of items later, so a bounded window
# gives "never twice" in practice while keeping the file and the memory bounded.
_KEEP_KEYS = 10_000
# Recorded drain answers kept per session, for the same reason.
_KEEP_DRAINS = 64
# Compaction: rewrite a file once it holds this many more records than it would after a
# rewrite, and at least twice as many ("mostly dead").
_COMPACT_SLACK = 256


# ---------------------------------------------------------------------------------------------
# Rendering


def cap_output(text: str, limit: int = OUTPUT_CAP) -> str:
    """``text`` cut to ``limit`` characters with a ``\\n...[truncated N chars]`` marker."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n...[truncated {len(text) - limit} chars]"


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


class TerminalIdle(TypedDict):
    """The inbox item of a terminal that went quiet."""

    type: Literal["terminal_idle"]
    source: str
    session: str


def terminal_idle_item(terminal: str, session: str) -> TerminalIdle:
    """A well-formed ``terminal_idle`` inbox item: terminal ``terminal:session`` went quiet."""
    return {"type": "terminal_idle", "source": terminal, "session": session}


def _terminal_idle_problem(item: Mapping[str, object]) -> str | None:
    source = item.get("source")
    session = item.get("session")
    if not isinstance(source, str) or not source:
        return "terminal-idle inbox payload requires non-empty string source"
    if not isinstance(session, str) or not session:
        return "terminal-idle inbox payload requires non-empty string session"
    return None


def _render_sub_agent(item: Mapping[str, object]) -> str:
    # S-15: the sub-agent forms name the child task and "<agent>:<title>".
    task = _as_text(item.get("task_id") or item.get("handle_id"))
    who = f"{_as_text(item.get('agent') or item.get('tool_name'))}:{_as_text(item.get('title'))}"
    return _task_line(f"sub-agent task {task}", who, item, cancelled_names_who=True)


def _task_line(
    task: str, who: str, item: Mapping[str, object], *, cancelled_names_who: bool = False
) -> str:
    """One finished task's line: ``[System: <task> <status> — <who> returned: <output>]``
    and its cancelled, failed and no-output forms (T-17, S-15)."""
    status = _as_text(item.get("status"))
    output = _as_text(item.get("output"))
    if status == "cancelled":
        suffix = f" — {who}" if cancelled_names_who else ""
        return f"[System: {task} cancelled{suffix}]"
    if status == "failed":
        return f"[System: {task} failed — {who} error: {cap_output(output)}]"
    if not output.strip():
        return f"[System: {task} {status} — {who} produced no output]"
    return f"[System: {task} {status} — {who} returned: {cap_output(output)}]"


def render_item(item: Mapping[str, object]) -> str:
    """The line ``sys_read_inbox`` shows for one inbox item.

    Async-task items (``handle_id``, ``tool_name``, ``status``, ``output``) render as T-17
    says; ``terminal_idle`` items as ``[System: terminal <terminal>:<session> is idle]``, or,
    when malformed, as a line saying so (T-18); sub-agent items (``"type": "sub_agent"``) as
    S-15 says. Never raises: one odd item must not stop a drain.
    """
    kind = item.get("type")
    if kind == "terminal_idle":
        problem = _terminal_idle_problem(item)
        if problem is not None:
            return f"[System: malformed terminal_idle inbox item ignored — {problem}]"
        return f"[System: terminal {item['source']}:{item['session']} is idle]"
    if kind == "sub_agent":
        return _render_sub_agent(item)
    if "handle_id" not in item:
        return f"[System: inbox item: {cap_output(_as_text(item))}]"
    handle = _as_text(item.get("handle_id"))
    return _task_line(f"task {handle}", _as_text(item.get("tool_name")), item)


# ---------------------------------------------------------------------------------------------
# The inbox


class Reviewed(NamedTuple):
    """What a drain :data:`Review` hook decided about one item.

    ``item`` is rendered in place of the original (e.g. its output replaced by a policy
    verdict). ``keep`` leaves the *original* queued for a later drain (e.g. a policy service
    that could not answer: the model sees a placeholder now and the real item later).
    """

    item: Mapping[str, object]
    keep: bool = False


#: Looks at each queued item during a drain; ``None`` renders the item unchanged.
Review = Callable[[Mapping[str, object]], Awaitable[Reviewed | None]]


@dataclass(slots=True)
class _SessionBox:
    session_id: str
    log: JsonLinesLog
    lock: trio.Lock = field(default_factory=trio.Lock)
    #: Queued items by key, in push order.
    queue: dict[str, Mapping[str, object]] = field(default_factory=dict)
    #: Every retained key (queued or delivered), oldest first.
    seen: dict[str, None] = field(default_factory=dict)
    #: Recorded drain answers by call id, oldest first.
    drains: dict[str, str] = field(default_factory=dict)
    #: Per recorded drain: the ``work_id`` of each sub-agent result it took (S-17).
    drained_work: dict[str, list[str]] = field(default_factory=dict)
    #: Records in the file, to decide when to compact.
    records: int = 0


def _session_file_name(session_id: str) -> str:
    # A digest: session ids are arbitrary strings, and two ids must never share a file.
    return hashlib.sha256(session_id.encode()).hexdigest()[:32] + ".jsonl"


class Inbox:
    """Every session's durable inbox, stored under ``dir`` (one file per session).

    One instance per tools actor; safe to use from many tasks at once (operations on one
    session are serialised). Items are JSON objects; see :func:`render_item` for the shapes
    that render specially.
    """

    def __init__(self, dir: Path, *, threads: int = 4) -> None:
        self.dir = dir
        self._limiter = trio.CapacityLimiter(threads)
        self._boxes: dict[str, _SessionBox] = {}
        self._open_lock = trio.Lock()

    async def push(self, session_id: str, item: Mapping[str, object], key: str) -> bool:
        """Queue ``item`` for ``session_id`` unless ``key`` was pushed before.

        Returns True if queued, False if ``key`` was already seen (a redelivery). Durable
        when it returns.
        """
        box = await self._box(session_id)
        async with box.lock:
            if key in box.seen:
                return False
            record = {"op": "push", "key": key, "item": item}
            # Shielded: once the record is on disk, memory must say so too, or a retried
            # push would write the key twice.
            with trio.CancelScope(shield=True):
                await box.log.append([record])
                box.records += 1
                box.seen[key] = None
                box.queue[key] = item
            return True

    async def drain(
        self,
        session_id: str,
        call_id: str,
        *,
        review: Review | None = None,
        max_chars: int | None = None,
    ) -> str:
        """Render and remove everything queued for ``session_id``, as ``call_id``.

        A repeated drain with the same ``call_id`` returns the text recorded the first time
        and removes nothing more. Items are rendered in push order and joined with a blank
        line; an empty inbox gives :data:`INBOX_EMPTY`. ``review`` may replace an item's
        rendering or keep it queued (see :class:`Reviewed`); if it raises, nothing is drained.

        ``max_chars``: once the text has reached it, later items stay queued and a last line
        says how many (``[System: N more inbox items not shown — call sys_read_inbox
        again]``), so a long drain is paged rather than cut (and lost) downstream. The first
        item is always taken. ``review`` sees only the items taken.
        """
        box = await self._box(session_id)
        async with box.lock:
            recorded = box.drains.get(call_id)
            if recorded is not None:
                return recorded
            lines: list[str] = []
            taken: list[str] = []
            work: list[str] = []
            queued = list(box.queue.items())
            size = 0
            for done, (key, item) in enumerate(queued):
                if max_chars is not None and lines and size >= max_chars:
                    lines.append(
                        f"[System: {len(queued) - done} more inbox items not shown — call "
                        "sys_read_inbox again]"
                    )
                    break
                verdict = await review(item) if review is not None else None
                lines.append(render_item(verdict.item if verdict is not None else item))
                size += len(lines[-1]) + 2
                if verdict is None or not verdict.keep:
                    taken.append(key)
                    if item.get("type") == "sub_agent" and isinstance(item.get("work_id"), str):
                        work.append(str(item["work_id"]))
            text = "\n\n".join(lines) if lines else INBOX_EMPTY
            record = {"op": "drain", "call_id": call_id, "taken": taken, "text": text}
            if work:
                record["work"] = work
            with trio.CancelScope(shield=True):
                await box.log.append([record])
                box.records += 1
                box.drains[call_id] = text
                if work:
                    box.drained_work[call_id] = work
                for key in taken:
                    box.queue.pop(key, None)
                await self._maybe_compact(box)
            return text

    async def drained_work(self, session_id: str, call_id: str) -> list[str]:
        """The ``work_id`` of each sub-agent result the drain ``call_id`` took (S-17): the
        same after a replay of the drain, so a caller that died before passing them on can
        pass them on again."""
        box = await self._box(session_id)
        return list(box.drained_work.get(call_id, ()))

    async def size(self, session_id: str) -> int:
        """How many items are queued for ``session_id``."""
        box = await self._box(session_id)
        return len(box.queue)

    async def discard(self, session_id: str) -> None:
        """Forget ``session_id``'s inbox entirely (the session was deleted)."""
        box = await self._box(session_id)
        async with box.lock:
            with trio.CancelScope(shield=True):
                await box.log.remove()
                box.queue.clear()
                box.seen.clear()
                box.drains.clear()
                box.drained_work.clear()
                box.records = 0
                # The next use starts a new file, with its header.
                self._boxes.pop(session_id, None)

    async def _box(self, session_id: str) -> _SessionBox:
        box = self._boxes.get(session_id)
        if box is not None:
            return box
        async with self._open_lock:
            box = self._boxes.get(session_id)
            if box is None:
                await trio.to_thread.run_sync(
                    lambda: self.dir.mkdir(parents=True, exist_ok=True), limiter=self._limiter
                )
                path = self.dir / _session_file_name(session_id)
                box = _SessionBox(session_id, JsonLinesLog(path, self._limiter))
                records = await box.log.load()
                _replay(box, records)
                if not records:
                    await box.log.append([_header(session_id)])
                    box.records = 1
                self._boxes[session_id] = box
            return box

    async def _maybe_compact(self, box: _SessionBox) -> None:
        # Live records after a rewrite: header, "seen", queued pushes, kept drains.
        live = 2 + len(box.queue) + min(len(box.drains), _KEEP_DRAINS)
        if box.records < max(2 * live, live + _COMPACT_SLACK):
            return
        delivered = [k for k in box.seen if k not in box.queue][-_KEEP_KEYS:]
        drains = list(box.drains.items())[-_KEEP_DRAINS:]
        records: list[Mapping[str, object]] = [_header(box.session_id)]
        records.append({"op": "seen", "keys": delivered})
        records.extend({"op": "push", "key": k, "item": v} for k, v in box.queue.items())
        # A kept drain's items are gone already: only its answer (and the work it took)
        # matters now.
        for call_id, text in drains:
            record: dict[str, object] = {
                "op": "drain",
                "call_id": call_id,
                "taken": [],
                "text": text,
            }
            if call_id in box.drained_work:
                record["work"] = box.drained_work[call_id]
            records.append(record)
        box.drained_work = {c: box.drained_work[c] for c, _ in drains if c in box.drained_work}
        await box.log.rewrite(records)
        box.records = len(records)
        box.seen = dict.fromkeys([*delivered, *box.queue])
        box.drains = dict(drains)


class _Header(TypedDict):
    op: Literal["header"]
    format: Literal["corral.inbox"]
    version: int
    session_id: str


def _header(session_id: str) -> _Header:
    return {
        "op": "header",
        "format": "corral.inbox",
        "version": FORMAT_VERSION,
        "session_id": session_id,
    }


def _replay(box: _SessionBox, records: list[JsonObject]) -> None:
    for record in records:
        op = record.get("op")
        if op == "header":
            version = record.get("version")
            if isinstance(version, int) and version > FORMAT_VERSION:
                raise ValueError(
                    f"{box.log.path}: inbox format version {version} is newer than this "
                    f"corral understands ({FORMAT_VERSION})"
                )
        elif op == "push":
            key, item = record.get("key"), record.get("item")
            if isinstance(key, str) and isinstance(item, dict) and key not in box.seen:
                box.seen[key] = None
                box.queue[key] = item
        elif op == "seen":
            for key in record.get("keys") or []:
                if isinstance(key, str):
                    box.seen[key] = None
        elif op == "drain":
            call_id, text = record.get("call_id"), record.get("text")
            if isinstance(call_id, str) and isinstance(text, str) and call_id not in box.drains:
                box.drains[call_id] = text
                work = record.get("work")
                if isinstance(work, list) and work:
                    box.drained_work[call_id] = [w for w in work if isinstance(w, str)]
                for key in record.get("taken") or []:
                    box.queue.pop(key, None)
    box.records = len(records)


# ---------------------------------------------------------------------------------------------
# The tool

#: The error text when a session has no inbox (shared with ``sys_call_async``, T-23).
NO_INBOX = "Error: async inbox not initialized for this session"


async def _sys_read_inbox(ctx: ToolContext, args: JsonObject) -> str:
    del args
    if ctx.inbox is None:
        return NO_INBOX
    # Here, not at the top: the review module builds on this one's types.
    from .inbox_review import subagent_review

    text = await ctx.inbox.drain(
        ctx.session_id, ctx.call_id, review=subagent_review(ctx), max_chars=ctx.max_output_chars
    )
    work = await ctx.inbox.drained_work(ctx.session_id, ctx.call_id)
    if work and ctx.work_drained is not None:
        # Passed on after the drain is on disk, and again if this call is replayed: a
        # crash in between leaves the work entries waiting, never wrongly done (S-17).
        await ctx.work_drained(work)
    return text


SYS_READ_INBOX = ToolSpec(
    name="sys_read_inbox",
    description=(
        "Read and clear this session's inbox: the results of background tasks started with "
        "sys_call_async (and other notices), oldest first. Returns 'Inbox is empty — no "
        "completed tasks.' when nothing has arrived."
    ),
    parameters={"type": "object", "properties": {}, "additionalProperties": False},
    run=_sys_read_inbox,
    family="inbox",
)

#: The inbox tool (``corral.tools.async_calls.TOOLS`` includes it too).
TOOLS: list[ToolSpec] = [SYS_READ_INBOX]
