"""``corral subagents``: the sub-agent work of a host, read straight from dispatch's registry.

Each entry is one ``sys_session_send``: the parent, the child, how the child's work ended and
where its result is (``waiting`` while the child works, ``recorded``, ``in_inbox``,
``delivered`` once the parent was woken; docs/dispatch.md, "Sub-agent work"). The command
reads ``<state dir>/actors/dispatch/subagents.log`` and never writes it, so it works with or
without a running host.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.tree import Tree

from ..actors.dispatch._subagents import LOG_NAME, WorkEntry, read_entries, truncate_preview
from ..config import resolve_state_dir
from ..instance import Instance
from ._output import emit_json, json_option, state_dir_option

#: Characters of an output shown in the tree.
_OUTPUT_WIDTH = 60


def _row(entry: WorkEntry) -> dict[str, Any]:
    return {
        "dispatch_id": entry.dispatch_id,
        "parent_session_id": entry.parent_id,
        "child_session_id": entry.child_id,
        "agent": entry.agent,
        "title": entry.title,
        "status": entry.status,
        "result": entry.result,
        "output": truncate_preview(entry.output),
        "child_turn_id": entry.turn_id,
        "created_at": entry.created_at,
        "ended_at": entry.ended_at or None,
    }


def _under(entries: list[WorkEntry], session_id: str) -> list[WorkEntry]:
    """The entries of ``session_id``'s tree: its children's, theirs, and so on."""
    found: list[WorkEntry] = []
    parents = {session_id}
    while True:
        more = [e for e in entries if e.parent_id in parents and e not in found]
        if not more:
            return sorted(found, key=lambda e: e.created_at)
        found.extend(more)
        parents = {e.child_id for e in more}


@click.command("subagents")
@click.option("--session", "session_id", default=None, help="Only this session's tree.")
@state_dir_option
@json_option
def subagents_command(state_dir: Path | None, session_id: str | None, as_json: bool) -> None:
    """Show each sub-agent's work: parent, child, status, and where its result is."""
    inst = Instance(resolve_state_dir(str(state_dir) if state_dir else None))
    entries = read_entries(inst.actor_dir("dispatch") / LOG_NAME)
    if session_id is not None:
        entries = _under(entries, session_id)
    if as_json:
        emit_json({"subagents": [_row(e) for e in entries]})
        return
    console = Console()
    if not entries:
        console.print("no sub-agent work" + (f" under {session_id}" if session_id else ""))
        return
    nodes: dict[str, Tree] = {}
    roots: list[Tree] = []
    for entry in entries:
        parent = nodes.get(entry.parent_id)
        if parent is None:
            parent = nodes[entry.parent_id] = Tree(entry.parent_id)
            roots.append(parent)
        output = entry.output.replace("\n", " ")
        label = (
            f"{entry.agent}:{entry.title}  {entry.child_id}  {entry.status}  {entry.result}"
            f"  {time.strftime('%H:%M:%S', time.localtime(entry.created_at))}"
            + (f"  {output[:_OUTPUT_WIDTH]!r}" if output else "")
        )
        node = parent.add(label)
        # A child's own sub-agents hang under its first entry (a continued child has more).
        nodes.setdefault(entry.child_id, node)
    for root in roots:
        console.print(root)
