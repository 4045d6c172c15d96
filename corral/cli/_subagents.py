"""``corral subagents``: the tree of sessions and the sub-agents they dispatched (#17).

The data is dispatch's durable work registry (``subagents.log``), as dispatch's inspection
snapshot lists it (``inspect`` on the control socket): one entry per ``sys_session_send``,
naming its parent and child session. This module turns those flat entries into the tree —
each session, the child sessions it gave work to, theirs — and says of each entry where its
result is:

``pending``   the child is still working (``launching`` or ``in_progress``);
``recorded``  the child ended and dispatch holds its result, not yet in the parent's inbox;
``inbox``     the result is in the parent's inbox, the parent not woken yet;
``woken``     the result is in the parent's inbox and the parent was woken to read it;
``drained``   the parent's ``sys_read_inbox`` took it (the tools actor tells dispatch, S-17):
              the work is done;
``abandoned`` the child never got its message (the send failed and told the parent so):
              there is no result.
"""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from .._exceptions import BadInput
from .._input import check_session_id
from .._jsonlines import JsonObject
from ._output import (
    EXIT_FAILURE,
    EXIT_NO_HOST,
    EXIT_USAGE,
    CliError,
    NoHost,
    ask_host,
    emit_json,
    json_option,
    pick,
    print_table,
    state_dir_option,
)

#: The states of an entry whose child has not ended.
_OPEN = frozenset({"launching", "in_progress"})


def _refused(message: str, *, code: str, exit_code: int) -> CliError:
    """A failure of the command; under ``--json`` its document is
    ``{"sessions": [], "error": {code, message}}``."""
    return CliError(message, code=code, exit_code=exit_code, document={"sessions": []})


def result_place(entry: JsonObject) -> str:
    """Where an entry's result is: ``pending``, ``recorded``, ``inbox``, ``woken``,
    ``drained`` or ``abandoned``."""
    if entry.get("status") in _OPEN:
        return "pending"
    if entry.get("abandoned"):
        return "abandoned"
    if entry.get("drained"):
        return "drained"
    if not entry.get("pushed"):
        return "recorded"
    return "woken" if entry.get("woken") else "inbox"


def _work(entry: JsonObject) -> JsonObject:
    return {
        "dispatch_id": entry["dispatch_id"],
        "status": entry["status"],
        "result": result_place(entry),
        "turn_id": entry.get("turn_id"),
        "output": entry.get("output", ""),
        "created_at": entry.get("created_at"),
        "ended_at": entry.get("ended_at") or None,
    }


def subagent_tree(entries: list[JsonObject], session_id: str | None = None) -> list[JsonObject]:
    """The registry's ``entries`` as trees: one per session that dispatched work and was not
    itself given any (or the one of ``session_id``), each node
    ``{session_id, parent_session_id, agent, title, work: [...], children: [...]}``.

    ``work`` is the entries that gave this session work, oldest first (a named child reused
    by a later send has one per send, S-16); ``children`` its own child sessions, in the
    order they were first given work. A session's subtree is shown once, even if the entries
    make a cycle.
    """
    ordered = sorted(entries, key=lambda e: (e.get("created_at") or 0.0, e["dispatch_id"]))
    given: dict[str, list[JsonObject]] = {}
    children: dict[str, list[str]] = {}
    for entry in ordered:
        child = entry["child_id"]
        given.setdefault(child, []).append(entry)
        siblings = children.setdefault(entry["parent_id"], [])
        if child not in siblings:
            siblings.append(child)
    roots = [session_id] if session_id is not None else [p for p in children if p not in given]
    seen: set[str] = set()

    def node(sid: str) -> JsonObject:
        seen.add(sid)
        work = given.get(sid, [])
        last = work[-1] if work else None
        return {
            "session_id": sid,
            "parent_session_id": last["parent_id"] if last else None,
            "agent": last["agent"] if last else None,
            "title": last["title"] if last else None,
            "work": [_work(e) for e in work],
            "children": [node(c) for c in children.get(sid, []) if c not in seen],
        }

    return [node(r) for r in roots]


def _entries(state_dir: Path | None) -> list[JsonObject]:
    """The registry's entries, from dispatch's snapshot."""
    try:
        reply = ask_host(state_dir, "inspect", actor="dispatch")
    except NoHost as exc:
        raise _refused(exc.message, code="no_host", exit_code=EXIT_NO_HOST) from None
    except click.ClickException as exc:
        raise _refused(
            f"dispatch did not answer: {exc.message}",
            code="dispatch_unavailable",
            exit_code=EXIT_FAILURE,
        ) from None
    return list(reply["state"].get("subagents", []))


def parents_of(entries: list[JsonObject]) -> dict[str, str]:
    """Each child session's parent, as the registry knows it."""
    return {e["child_id"]: e["parent_id"] for e in entries}


def _rows(table: Table, node: JsonObject, depth: int) -> None:
    indent = "  " * depth + ("└ " if depth else "")
    sid = indent + node["session_id"]
    who = f"{node['agent']}:{node['title']}" if node["agent"] else "-"
    if not node["work"]:
        table.add_row(sid, who, "-", "-", "-", "")
    for i, work in enumerate(node["work"]):
        table.add_row(
            sid if i == 0 else "",
            who if i == 0 else "",
            work["dispatch_id"],
            work["status"],
            work["result"],
            " ".join(work["output"].split()),
        )
    for child in node["children"]:
        _rows(table, child, depth + 1)


@click.command("subagents")
@click.option(
    "--session", "session_id", metavar="ID", default=None, help="Only this session's tree."
)
@state_dir_option
@json_option
def subagents_command(session_id: str | None, state_dir: Path | None, as_json: bool) -> None:
    """Show the tree of sessions and their sub-agents: each dispatch, its state, and where
    its result is (pending, recorded, inbox, woken, drained, abandoned).

    --session takes a session id or a unique prefix of one. Exit 1 when it names a session
    with no sub-agent work on this host, 2 when it is not a session id or names several, 3
    when no host runs.
    """
    if session_id is not None:
        try:
            check_session_id(session_id)
        except BadInput as exc:
            raise _refused(str(exc), code="invalid_session_id", exit_code=EXIT_USAGE) from None
    entries = _entries(state_dir)
    known = [e[k] for e in entries for k in ("parent_id", "child_id")]
    if session_id is not None and any(k.startswith(session_id) for k in known):
        session_id = pick(session_id, known, "session")
    elif session_id is not None:
        raise _refused(
            f"session {session_id} has no sub-agent work on this host (it dispatched none, "
            "and none was dispatched to it)",
            code="session_not_found",
            exit_code=EXIT_FAILURE,
        )
    trees = subagent_tree(entries, session_id)
    if as_json:
        emit_json({"sessions": trees})
        return
    table = Table("session", "sub-agent", "dispatch", "state", "result", "output")
    for tree in trees:
        _rows(table, tree, 0)
    print_table(table, ids=("session", "dispatch"))
