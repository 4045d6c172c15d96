"""``corral status``, ``corral mailboxes``: look inside a host."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ._output import (
    CliError,
    NoHost,
    ask_host,
    emit_json,
    json_option,
    pick,
    print_table,
    state_dir_option,
)


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
    _show_status(data)


#: The colour of each state a row of ``corral status`` can be in: green all is well, yellow
#: on its way (or back), red needs a look.
STATE_STYLES = {
    "running": "green",
    "connected": "green",
    "idle": "green",
    "starting": "yellow",
    "connecting": "yellow",
    "restarting": "yellow",
    "reconnecting": "yellow",
    "draining": "yellow",
    "stopping": "yellow",
    "busy": "cyan",
    "stopped": "dim",
    "closed": "dim",
    "failed": "bold red",
    "gave_up": "bold red",
}


def styled(state: str | None) -> Text:
    """A state, in its colour (plain where the output is not a terminal)."""
    return Text(str(state or "-"), style=STATE_STYLES.get(str(state), ""))


def _show_status(data: dict[str, Any]) -> None:
    """The default view of ``corral status``: the host, its actors, the control plane, the
    runner tunnels and the harness workers, each state in its colour and each error said."""
    host = data["host"]
    console = Console(soft_wrap=not sys.stdout.isatty())
    console.print(
        Text.assemble(
            f"corral {host['version']}  pid {host['pid']}  ",
            styled(host.get("state")),
            f"  up {host['uptime_s']:.0f}s  state {host['state_dir']}",
        )
    )
    zygote = host.get("zygote")
    if zygote:
        console.print(
            f"zygote pid {zygote['pid'] or '-'}  forked {zygote['forked']}"
            f"  exec'd {zygote['exec']}"
            + ("  (given up: children are exec'd)" if zygote["gave_up"] else "")
        )
    seed = host.get("seed")
    if seed:
        console.print(f"seed pid {seed['pid']}" + ("" if seed["alive"] else " (gone)"))
    table = Table("actor", "state", "pid", "restarts", "uptime", "last exit")
    for a in data["actors"]:
        last = a["last_exit"]
        table.add_row(
            a["name"],
            styled(a["state"]),
            str(a["pid"] or "-"),
            str(a["restarts"]),
            _age(a["uptime_s"]),
            "-" if not last else f"{last['reason']} ({time.time() - last['at']:.0f}s ago)",
        )
    print_table(table)
    server = data.get("server")
    if server:
        console.print(
            Text.assemble(
                f"control plane {server['url'] or '-'}  ",
                styled(server["state"]),
                f"  pid {server['pid'] or '-'}  restarts {server.get('restarts', 0)}",
            )
        )
    tunnels = data.get("tunnels") or []
    if tunnels:
        table = Table("runner", "server", "state", "for", "streams", "error", "next attempt")
        for t in tunnels:
            since = t.get("since")
            table.add_row(
                str(t.get("runner_id") or "-"),
                str(t.get("server") or t.get("url") or "-"),
                styled(t.get("state")),
                _age(time.time() - since if since else None),
                str(t.get("responses_open", "-")),
                Text(str(t.get("error") or "-"), style="red" if t.get("error") else ""),
                _age(t.get("next_attempt_in_s")),
            )
        print_table(table, ids=("runner", "server"))
    workers = data.get("workers") or []
    if workers:
        table = Table("worker session", "harness", "state", "idle", "crashes", "pid")
        for w in workers:
            table.add_row(
                str(w["session_id"]),
                str(w.get("harness") or "-"),
                styled("busy" if w.get("in_flight") else "idle"),
                _age(w.get("idle_s")),
                Text(str(w.get("crashes", 0)), style="red" if w.get("crashes") else ""),
                str(w.get("pid") or "-"),
            )
        print_table(table, ids=("worker session",))


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
            raise CliError(
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
    if actor is not None:
        names = [m["actor"] for m in ask_host(state_dir, "mailboxes")["mailboxes"]]
        actor = pick(actor, names, "mailbox", "mailboxes")
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
    print_table(table)
    console = Console(soft_wrap=True)
    for m in data["mailboxes"]:
        for p in m.get("peek", []):
            console.print(
                f"  {m['actor']}: {p['id']} {p['type']} session={p['session_id']} "
                f"attempts={p['attempts']} age={_age(p['age_s'])} {p['state']}"
            )
