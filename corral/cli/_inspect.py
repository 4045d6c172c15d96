"""``corral status``, ``corral mailboxes``, ``corral dead-letters``: look inside a host."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from ._output import NoHost, ask_host, emit_json, json_option, state_dir_option
from ._subagents import parents_of


def _age(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


@click.command("status")
@click.option(
    "--wait",
    "wait_s",
    type=click.FloatRange(min=0),
    default=None,
    metavar="SECONDS",
    help="Wait up to SECONDS for a host whose every actor is running (exit 1 if it is not, "
    "3 if no host appears).",
)
@state_dir_option
@json_option
def status_command(state_dir: Path | None, wait_s: float | None, as_json: bool) -> None:
    """Show the host and every actor: state, pid, restarts, last exit."""
    data = ask_host(state_dir, "status") if wait_s is None else _wait_running(state_dir, wait_s)
    if as_json:
        emit_json(data)
        return
    host = data["host"]
    console = Console()
    console.print(
        f"corral {host['version']}  pid {host['pid']}  up {host['uptime_s']:.0f}s  "
        f"state {host['state_dir']}"
    )
    table = Table("actor", "state", "pid", "restarts", "uptime", "last exit")
    for a in data["actors"]:
        last = a["last_exit"]
        table.add_row(
            a["name"],
            a["state"],
            str(a["pid"] or "-"),
            str(a["restarts"]),
            _age(a["uptime_s"]),
            "-" if not last else f"{last['reason']} ({time.time() - last['at']:.0f}s ago)",
        )
    console.print(table)
    server = data.get("server")
    if server:
        console.print(
            f"control plane {server['url'] or '-'}  {server['state']}  pid {server['pid'] or '-'}"
            f"  restarts {server.get('restarts', 0)}"
        )


def _all_running(data: dict[str, Any]) -> bool:
    return data["host"]["state"] == "running" and all(
        a["state"] == "running" for a in data["actors"]
    )


def _wait_running(state_dir: Path | None, wait_s: float) -> dict[str, Any]:
    """The status of the host once it and every actor run; asks once per change of the
    host's status (the control socket's ``wait``), and looks for a host that is not up yet
    every 50 ms."""
    deadline = time.monotonic() + wait_s
    after = -1
    while True:
        remaining = deadline - time.monotonic()
        try:
            data = ask_host(
                state_dir, "wait", timeout=remaining + 10, after=after, wait_s=max(remaining, 0)
            )
        except NoHost:
            if remaining <= 0:
                raise
            time.sleep(min(0.05, remaining))
            continue
        if _all_running(data):
            return data
        if remaining <= 0:
            waiting = [a["name"] for a in data["actors"] if a["state"] != "running"]
            raise click.ClickException(
                f"the host is {data['host']['state']} after {wait_s:g}s; not running: "
                + (", ".join(waiting) or "-")
            )
        after = data["changes"]


@click.command("mailboxes")
@click.argument("actor", required=False)
@click.option("--peek", type=click.IntRange(0, 1000), default=0, help="Show the N oldest.")
@state_dir_option
@json_option
def mailboxes_command(actor: str | None, peek: int, state_dir: Path | None, as_json: bool) -> None:
    """Show each actor's durable mailbox: queued, in flight (stuck: past [bus] stuck_after_s),
    parked, dead letters."""
    data = ask_host(state_dir, "mailboxes", actor=actor, peek=peek)
    if as_json:
        emit_json(data)
        return
    columns = ("queued", "in_flight", "stuck", "parked", "dead_letters", "redelivered")
    table = Table(
        "actor", "queued", "in flight", "stuck", "parked", "dead", "redelivered", "oldest"
    )
    for m in data["mailboxes"]:
        table.add_row(m["actor"], *(str(m[k]) for k in columns), _age(m["oldest_age_s"]))
    console = Console()
    console.print(table)
    for m in data["mailboxes"]:
        for p in m.get("peek", []):
            console.print(
                f"  {m['actor']}: {p['id']} {p['type']} session={p['session_id']} "
                f"attempts={p['attempts']} age={_age(p['age_s'])} {p['state']}"
            )


@click.command("dead-letters")
@state_dir_option
@json_option
def dead_letters_command(state_dir: Path | None, as_json: bool) -> None:
    """List messages that could not be delivered or handled, with the error."""
    data: dict[str, Any] = ask_host(state_dir, "dead_letters")
    if as_json:
        emit_json(data)
        return
    table = Table("id", "actor", "type", "attempts", "error", "at")
    for d in data["dead_letters"]:
        table.add_row(
            d["id"],
            d["actor"],
            d["type"],
            str(d["attempts"]),
            d["error"],
            time.strftime("%H:%M:%S", time.localtime(d["at"])),
        )
    Console().print(table)


@click.command("elicitations")
@state_dir_option
@json_option
def elicitations_command(state_dir: Path | None, as_json: bool) -> None:
    """List elicitations parked by harness workers, and recently resolved ones; a sub-agent's
    shows its parent session."""
    data: dict[str, Any] = ask_host(state_dir, "elicitations")
    parents = _parents(state_dir) if data["elicitations"] else {}
    for e in data["elicitations"]:
        e["parent_session_id"] = parents.get(e["session_id"])
    if as_json:
        emit_json(data)
        return
    table = Table("elicitation", "session", "parent", "turn", "state", "prompt", "created")
    for e in data["elicitations"]:
        table.add_row(
            e["elicitation_id"],
            e["session_id"],
            e["parent_session_id"] or "-",
            e["turn_id"],
            e["state"] + (f" ({e['reason']})" if e.get("reason") else ""),
            str(e["params"].get("message", "")),
            time.strftime("%H:%M:%S", time.localtime(e["created_at"])),
        )
    Console().print(table)


def _parents(state_dir: Path | None) -> dict[str, str]:
    """Each sub-agent session's parent, from dispatch's work registry; {} when dispatch does
    not answer (the elicitations are still worth showing without it)."""
    try:
        reply = ask_host(state_dir, "inspect", actor="dispatch")
    except click.ClickException:
        return {}
    return parents_of(list(reply["state"].get("subagents", [])))
