"""``corral dead-letters`` and ``corral elicitations``: the two queues that wait on an
operator, listed and acted on.

A dead letter is a durable message the broker gave up on (docs/bus.md); ``requeue`` puts it
back at the end of its recipient's mailbox with a fresh count of attempts (same id, so a
recipient that did handle it before and dedups by id does not handle it twice), ``purge``
drops it for good. Both are durable in the mailbox log, so a restarted host remembers them.

An elicitation is a question a turn waits on (a tool call its policy answered ASK, or a
harness's own approval). ``resolve --accept|--decline`` and ``cancel`` answer it through
the embedded control plane's ``POST .../elicitations/{id}/resolve``, which is what the
server does with a person's verdict: the plane records it (a second verdict is refused,
``already_resolved``) and forwards it to the runner as an ``approval`` event, and the
waiting turn goes on (accept), goes on without the tool (decline), or is told the question
was withdrawn (cancel). A host that serves another server has no plane to answer through:
its sessions' questions are answered on that server.

Every id is taken whole or by a unique prefix (:func:`~._output.pick`); all ids of a command
are checked before anything is done, so a typo changes nothing.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from ..config import resolve_state_dir
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
from ._subagents import parents_of


def _clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))


# --- dead letters ------------------------------------------------------------------------------


def _dead_letters(state_dir: Path | None) -> list[dict[str, Any]]:
    return list(ask_host(state_dir, "dead_letters")["dead_letters"])


@click.group("dead-letters", invoke_without_command=True)
@state_dir_option
@json_option
@click.pass_context
def dead_letters_group(ctx: click.Context, state_dir: Path | None, as_json: bool) -> None:
    """List messages that could not be delivered or handled, with the error; requeue or
    purge them.

    \b
    Example:
        corral dead-letters
        corral dead-letters requeue 3f2a
        corral dead-letters purge 3f2a 9b01
    """
    ctx.obj = (state_dir, as_json)
    if ctx.invoked_subcommand is not None:
        return
    data = {"dead_letters": _dead_letters(state_dir)}
    if as_json:
        emit_json(data)
        return
    table = Table("id", "actor", "type", "attempts", "error", "at")
    for d in data["dead_letters"]:
        table.add_row(
            d["id"], d["actor"], d["type"], str(d["attempts"]), d["error"], _clock(d["at"])
        )
    print_table(table, ids=("id",))


def _pick_dead(state_dir: Path | None, given: tuple[str, ...]) -> list[str]:
    known = [d["id"] for d in _dead_letters(state_dir)]
    return list(dict.fromkeys(pick(g, known, "dead letter") for g in given))


def _given(ctx: click.Context, state_dir: Path | None, as_json: bool) -> tuple[Path | None, bool]:
    """The subcommand's ``--state-dir`` and ``--json``, else the group's
    (``corral dead-letters --json purge ID`` is ``purge ID --json``)."""
    group_dir, group_json = ctx.obj
    return (state_dir if state_dir is not None else group_dir), as_json or group_json


@dead_letters_group.command("requeue")
@click.argument("ids", nargs=-1, required=True, metavar="ID...")
@state_dir_option
@json_option
@click.pass_context
def requeue_command(
    ctx: click.Context, ids: tuple[str, ...], state_dir: Path | None, as_json: bool
) -> None:
    """Deliver dead letters again, each once more with a fresh count of attempts.

    Exit 1 (nothing requeued) if an ID names no dead letter, 2 if a prefix names several;
    exit 1 if one cannot be delivered again (a stream message, or one kept only in part).
    """
    state_dir, as_json = _given(ctx, state_dir, as_json)
    wanted = _pick_dead(state_dir, ids)
    answer = ask_host(state_dir, "requeue_dead_letters", ids=wanted)
    _done(answer, "requeued", as_json)


@dead_letters_group.command("purge")
@click.argument("ids", nargs=-1, required=True, metavar="ID...")
@state_dir_option
@json_option
@click.pass_context
def purge_command(
    ctx: click.Context, ids: tuple[str, ...], state_dir: Path | None, as_json: bool
) -> None:
    """Drop dead letters for good.

    Exit 1 (nothing purged) if an ID names no dead letter, 2 if a prefix names several.
    """
    state_dir, as_json = _given(ctx, state_dir, as_json)
    wanted = _pick_dead(state_dir, ids)
    answer = ask_host(state_dir, "purge_dead_letters", ids=wanted)
    _done({**answer, "refused": []}, "purged", as_json)


def _done(answer: dict[str, Any], verb: str, as_json: bool) -> None:
    """Say what the host did; a dead letter it did not act on is an error (exit 1)."""
    document = {verb: answer[verb], "refused": answer["refused"], "unknown": answer["unknown"]}
    problems = [f"{r['id']}: {r['error']}" for r in answer["refused"]] + [
        f"no dead letter {mid!r} (gone meanwhile)" for mid in answer["unknown"]
    ]
    if problems:
        code = "not_requeued" if answer["refused"] else "not_found"
        raise CliError(f"not {verb}: " + "; ".join(problems), code=code, document=document)
    if as_json:
        emit_json(document)
        return
    for mid in answer[verb]:
        click.echo(f"{verb} {mid}")


# --- elicitations ------------------------------------------------------------------------------


def _elicitations(state_dir: Path | None) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = ask_host(state_dir, "elicitations")["elicitations"]
    parents = _parents(state_dir) if rows else {}
    for e in rows:
        e["parent_session_id"] = parents.get(e["session_id"])
    return rows


def _parents(state_dir: Path | None) -> dict[str, str]:
    """Each sub-agent session's parent, from dispatch's work registry; {} when dispatch does
    not answer (the elicitations are still worth showing without it)."""
    try:
        reply = ask_host(state_dir, "inspect", actor="dispatch")
    except click.ClickException:
        return {}
    return parents_of(list(reply["state"].get("subagents", [])))


@click.group("elicitations", invoke_without_command=True)
@state_dir_option
@json_option
@click.pass_context
def elicitations_group(ctx: click.Context, state_dir: Path | None, as_json: bool) -> None:
    """List elicitations parked by harness workers and the policy actor, and recently
    resolved ones (a sub-agent's shows its parent session); resolve or cancel one.

    \b
    Example:
        corral elicitations
        corral elicitations resolve 7c1e --accept
        corral elicitations cancel 7c1e
    """
    ctx.obj = (state_dir, as_json)
    if ctx.invoked_subcommand is not None:
        return
    data = {"elicitations": _elicitations(state_dir)}
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
            _prompt_of(e["params"]),
            _clock(e["created_at"]),
        )
    print_table(table, ids=("elicitation", "session", "parent", "turn"))


def _prompt_of(params: dict[str, Any]) -> str:
    """What an elicitation asks: its message, or the tool a policy asks about."""
    tool = params.get("tool")
    if params.get("message") or not isinstance(tool, dict):
        return str(params.get("message") or "")
    return f"run the tool {tool.get('name')}?"


@elicitations_group.command("resolve")
@click.argument("elicitation_id", metavar="ID")
@click.option(
    "--accept/--decline",
    "accept",
    default=None,
    help="The verdict: let the agent go on, or refuse (one of them is required).",
)
@state_dir_option
@json_option
@click.pass_context
def resolve_command(
    ctx: click.Context,
    elicitation_id: str,
    accept: bool | None,
    state_dir: Path | None,
    as_json: bool,
) -> None:
    """Answer a parked elicitation, as a person would in the server's UI: the waiting turn
    goes on (--accept) or goes on without what it asked for (--decline).

    Exit 1 if it is already resolved or names none, 2 if the prefix names several.
    """
    if accept is None:
        raise click.UsageError("give --accept or --decline", ctx=ctx)
    state_dir, as_json = _given(ctx, state_dir, as_json)
    _answer(state_dir, elicitation_id, "accept" if accept else "decline", as_json)


@elicitations_group.command("cancel")
@click.argument("elicitation_id", metavar="ID")
@state_dir_option
@json_option
@click.pass_context
def cancel_command(
    ctx: click.Context, elicitation_id: str, state_dir: Path | None, as_json: bool
) -> None:
    """Withdraw a parked elicitation: the waiting turn is told nobody will answer it.

    Exit 1 if it is already resolved or names none, 2 if the prefix names several.
    """
    state_dir, as_json = _given(ctx, state_dir, as_json)
    _answer(state_dir, elicitation_id, "cancel", as_json)


def _answer(state_dir: Path | None, given: str, action: str, as_json: bool) -> None:
    rows = _elicitations(state_dir)
    # The newest row of an id: a resolved one is kept a while beside nothing else.
    by_id = {e["elicitation_id"]: e for e in rows}
    row = by_id[pick(given, list(by_id), "elicitation")]
    eid, session_id = row["elicitation_id"], row["session_id"]
    if row["state"] != "parked":
        raise CliError(f"elicitation {eid} is already {row['state']}", code="already_resolved")
    status = ask_host(state_dir, "status")
    if status.get("server") is None:
        raise CliError(
            f"elicitation {eid} belongs to a session of the server this host serves "
            "(--server or [[runners]]); answer it there",
            code="no_control_plane",
        )
    directory = resolve_state_dir(str(state_dir) if state_dir else None)
    # Imported here: only a verdict talks HTTP (httpx, trio), not the listings.
    import trio

    from ._client import ApiError, ControlPlane
    from ._locate import NoControlPlane, NoCredential

    async def main() -> dict[str, Any]:
        async with ControlPlane(directory) as api:
            return await api.resolve(session_id, eid, action)

    try:
        answer = trio.run(main)
    except NoControlPlane as exc:
        raise NoHost(str(exc)) from None
    except NoCredential as exc:
        raise CliError(str(exc), code="no_credential") from None
    except ApiError as exc:
        if exc.error == "already_resolved":
            raise CliError(f"elicitation {eid} is already resolved", code=exc.error) from None
        raise CliError(
            f"the control plane refused the verdict on {eid}: {exc.detail or exc.error}",
            code=exc.error,
        ) from None
    document = {
        "elicitation_id": eid,
        "session_id": session_id,
        "action": action,
        "runner_status": answer.get("runner_status"),
        "queued": answer.get("queued"),
    }
    if as_json:
        emit_json(document)
        return
    said = {"accept": "accepted", "decline": "declined", "cancel": "cancelled"}[action]
    click.echo(f"{said} {eid} (session {session_id})")
