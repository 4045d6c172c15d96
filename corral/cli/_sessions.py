"""``corral sessions``: the sessions of a host, newest first.

Where they come from: the embedded control plane's ``GET /v1/sessions`` when the host runs
one (its store knows each session's agent, title and parent); otherwise — a host serving
another server (``--server``, ``[[runners]]``) — what dispatch holds (its inspection
snapshot), which knows no title, and the agent only by its server's id.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click
import trio
from rich.table import Table

from .._jsonlines import JsonObject
from ..config import resolve_state_dir
from ._client import ApiError, ControlPlane
from ._locate import NoControlPlane, NoCredential, locate
from ._output import (
    CliError,
    NoHost,
    ask_host,
    emit_json,
    json_option,
    no_host_message,
    print_table,
    state_dir_option,
)

#: The most sessions the control plane lists in one page.
LIST_LIMIT = 1000


def _from_plane(state_dir: Path) -> list[JsonObject]:
    async def main() -> list[JsonObject]:
        async with ControlPlane(state_dir) as api:
            page = await api.call("GET", f"/v1/sessions?limit={LIST_LIMIT}", idempotent=True)
        return [
            {
                "session_id": s.get("id"),
                "agent": s.get("agent_name") or s.get("agent"),
                "status": s.get("status"),
                "title": s.get("title"),
                "parent_session_id": s.get("parent_session_id"),
                "created_at": s.get("created_at"),
                "last_event_id": s.get("last_event_id"),
            }
            for s in page.get("data", [])
        ]

    try:
        return trio.run(main)
    except NoControlPlane as exc:
        raise NoHost(str(exc), document={"sessions": []}) from None
    except (NoCredential, ApiError) as exc:
        raise CliError(
            f"the control plane did not list its sessions: {exc}",
            code="unauthorized" if isinstance(exc, NoCredential) else "control_plane_error",
            document={"sessions": []},
        ) from None


def _from_dispatch(state_dir: Path) -> list[JsonObject]:
    try:
        reply = ask_host(state_dir, "inspect", actor="dispatch")
    except NoHost:
        raise  # not dispatch's fault: exit 3 as it is
    except click.ClickException as exc:
        raise CliError(
            f"dispatch did not answer: {exc.message}",
            code="dispatch_unavailable",
            document={"sessions": []},
        ) from None
    rows = [
        {
            "session_id": s["id"],
            "agent": s.get("agent_id"),
            "status": s.get("status"),
            "title": None,
            "parent_session_id": None,
            "created_at": s.get("created_at"),
            "last_event_id": None,
        }
        for s in reply["state"].get("session_list", [])
    ]
    return sorted(rows, key=lambda r: r["created_at"] or 0, reverse=True)


def list_sessions(state_dir: Path | None) -> tuple[str, list[JsonObject]]:
    """Where the sessions were read (``control_plane`` or ``host``) and the rows.

    Raises:
        NoHost: no host runs on the state dir.
        CliError: the one that should answer did not.
    """
    directory = resolve_state_dir(str(state_dir) if state_dir else None)
    try:
        url = locate(directory)
    except NoControlPlane:
        raise NoHost(no_host_message(directory), document={"sessions": []}) from None
    except NoCredential as exc:
        raise CliError(str(exc), code="no_credential", document={"sessions": []}) from None
    if url is None:
        # A host without a plane, or one (re)starting it: the host says which.
        status = ask_host(directory, "status")
        if status.get("server") is None:
            return "host", _from_dispatch(directory)
    return "control_plane", _from_plane(directory)


def _when(value: Any) -> str:
    if not isinstance(value, int | float) or not value:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(value))


@click.command("sessions")
@state_dir_option
@json_option
def sessions_command(state_dir: Path | None, as_json: bool) -> None:
    """List the host's sessions, newest first: agent, status, title, parent.

    From the embedded control plane (GET /v1/sessions); a host that serves another server
    lists what its dispatch holds (no titles; the agent by its server's id).

    \b
    Example:
        corral sessions --json
    """
    source, rows = list_sessions(state_dir)
    if as_json:
        emit_json({"sessions": rows, "source": source})
        return
    table = Table("session", "agent", "status", "title", "parent", "created")
    for r in rows:
        table.add_row(
            str(r["session_id"]),
            str(r["agent"] or "-"),
            str(r["status"] or "-"),
            str(r["title"] or "-"),
            str(r["parent_session_id"] or "-"),
            _when(r["created_at"]),
        )
    print_table(table, ids=("session", "parent"))
