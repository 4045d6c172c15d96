"""``corral journal ls|show|tail|summary``: read the run journal straight from its files.

The commands work the same with or without a running host: they read the files under
``<state dir>/journal`` and never modify them, so they are safe next to the journal actor
appending to the same files. A torn or in-progress last line is left alone (``show`` reports
it as ``incomplete_tail``); only the journal's own appender repairs a torn tail.

Exit codes: 0 success, 1 an unknown session or run (or an unreadable file), 2 an invalid id
or cursor.
"""

from __future__ import annotations

import heapq
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import click
import msgspec
from rich.console import Console
from rich.table import Table

from .._jsonlines import JsonObject
from ..config import resolve_state_dir
from ..instance import Instance
from ..journal import InvalidCursorError, InvalidIdError, RunJournal
from ._output import (
    CliError,
    corral_errors,
    emit_json,
    json_option,
    pick,
    print_table,
    state_dir_option,
)

_decoder = msgspec.json.Decoder()
# A payload wider than this is cut in tables and human `tail` lines.
_PAYLOAD_WIDTH = 100


def _open(state_dir: Path | None) -> RunJournal:
    # RunJournal only creates files when appending; listing and reading never write.
    return RunJournal(
        Instance(resolve_state_dir(str(state_dir) if state_dir else None)).journal_dir
    )


def _check_ids(journal: RunJournal, session_id: str, run_id: str | None = None) -> None:
    """Exit 2 for an id that is not a safe file name (it is never joined to a path)."""
    try:
        journal.path(session_id, run_id if run_id is not None else "_")
    except InvalidIdError as exc:
        hint = "SESSION" if exc.field == "session_id" else "RUN"
        raise click.BadParameter(str(exc), param_hint=hint) from None


def _require_session(journal: RunJournal, session_id: str) -> str:
    """The session ``session_id`` names (whole, or a unique prefix of a journal's)."""
    _check_ids(journal, session_id)
    if not (journal.root / session_id).is_dir():
        known = (
            [p.name for p in journal.root.iterdir() if p.is_dir()] if journal.root.is_dir() else []
        )
        if not any(k.startswith(session_id) for k in known):
            raise CliError(
                f"no journal for session {session_id!r} in {journal.root}", code="not_found"
            )
        session_id = pick(session_id, known, "session")
    return session_id


def _require_run(journal: RunJournal, session_id: str, run_id: str) -> tuple[str, str]:
    """The session and run the ids name (each whole, or a unique prefix)."""
    _check_ids(journal, session_id, run_id)
    session_id = _require_session(journal, session_id)
    if not journal.path(session_id, run_id).is_file():
        runs = [p.name.removesuffix(".jsonl") for p in (journal.root / session_id).glob("*.jsonl")]
        if not any(r.startswith(run_id) for r in runs):
            raise CliError(
                f"no journal for run {run_id!r} of session {session_id!r} in {journal.root}",
                code="not_found",
            )
        run_id = pick(run_id, runs, "run")
    return session_id, run_id


def _when(value: Any) -> str:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "-"
    clock = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(value))
    return f"{clock}.{int(value * 1000) % 1000:03d}"


def _compact(value: Any, width: int = _PAYLOAD_WIDTH) -> str:
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return text if len(text) <= width else text[: width - 1] + "…"


def _cursor(value: str | None) -> int | str:
    # A plain number is a seq; anything else must be an event id "<run_id>:<seq>".
    if value is None:
        return 0
    return int(value) if value.isascii() and value.isdigit() else value


@click.group("journal")
def journal_group() -> None:
    """Read the run journal: list sessions and runs, show, follow and summarise a run."""


@journal_group.command("ls")
@click.argument("session", required=False)
@state_dir_option
@json_option
@corral_errors
def ls_command(session: str | None, state_dir: Path | None, as_json: bool) -> None:
    """List the sessions with journals, or the runs of SESSION."""
    journal = _open(state_dir)
    if session is not None:
        session = _require_session(journal, session)
    data = journal.listing(session)
    if as_json:
        emit_json(data)
        return
    if session is None:
        table = Table("session", "runs", "bytes", "modified")
        for row in data["sessions"]:
            table.add_row(
                row["session_id"], str(row["runs"]), str(row["bytes"]), _when(row["modified_at"])
            )
    else:
        table = Table("run", "events", "last seq", "state", "runtime model", "updated")
        for run in data["runs"]:
            model = run["runtime_model"]
            table.add_row(
                run["run_id"],
                str(run["event_count"]),
                str(run["last_seq"]),
                run["terminal_state"],
                str(model.get("model")) if isinstance(model, dict) else "-",
                _when(run["updated_at"]),
            )
    print_table(table, ids=("session", "run"))


@journal_group.command("show")
@click.argument("session")
@click.argument("run")
@click.option(
    "--after",
    metavar="SEQ",
    default=None,
    help="Only records after this seq or event id '<run>:<seq>'.",
)
@click.option("--limit", type=click.IntRange(min=0), default=None, help="At most N records.")
@click.option("--strict", is_flag=True, help="Stop at the first non-contiguous seq.")
@state_dir_option
@json_option
@corral_errors
def show_command(
    session: str,
    run: str,
    after: str | None,
    limit: int | None,
    strict: bool,
    state_dir: Path | None,
    as_json: bool,
) -> None:
    """Show the records of RUN in SESSION (the library's read result with --json)."""
    journal = _open(state_dir)
    session, run = _require_run(journal, session, run)
    try:
        data = journal.read(session, run, after_seq=_cursor(after), limit=limit, strict=strict)
    except InvalidCursorError as exc:
        raise click.BadParameter(str(exc), param_hint="--after") from None
    if as_json:
        emit_json(data)
        return
    table = Table("seq", "time", "event", "terminal", "payload")
    for record in data["events"]:
        table.add_row(
            str(record["seq"]),
            _when(record.get("created_at")),
            str(record.get("event")),
            record.get("terminal_state") or "",
            _compact(record.get("payload")),
        )
    Console().print(table)
    err = Console(stderr=True, soft_wrap=True)
    for bad in data["malformed"]:
        err.print(f"line {bad['line']}: {bad['reason']}")
    if data["incomplete_tail"]:
        err.print("the last line is incomplete (a write in progress, or a torn tail)")
    if not data["complete"]:
        err.print(
            f"stopped by {data['limit_reason']}; continue with --after {data['next_after_seq']}"
        )


@journal_group.command("summary")
@click.argument("session")
@click.argument("run")
@state_dir_option
@json_option
@corral_errors
def summary_command(session: str, run: str, state_dir: Path | None, as_json: bool) -> None:
    """Summarise RUN: cursor, terminal state and the observed runtime model."""
    journal = _open(state_dir)
    session, run = _require_run(journal, session, run)
    data = journal.summary(session, run)
    if as_json:
        emit_json(data)
        return
    table = Table("field", "value")
    for key, value in data.items():
        shown = _when(value) if key.endswith("_at") else _compact(value, 200)
        table.add_row(key, value if isinstance(value, str) else shown)
    Console().print(table)


@journal_group.command("tail")
@click.argument("session")
@click.argument("run", required=False)
@click.option(
    "-n",
    "--lines",
    type=click.IntRange(min=0),
    default=10,
    show_default=True,
    help="Records already in the journal to print first.",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.01),
    default=0.2,
    show_default=True,
    help="Seconds between looks at the files.",
)
@click.option("--wait", is_flag=True, help="Wait for the session or run to appear.")
@state_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON record per line (NDJSON).")
@corral_errors
def tail_command(
    session: str,
    run: str | None,
    lines: int,
    interval: float,
    wait: bool,
    state_dir: Path | None,
    as_json: bool,
) -> None:
    """Follow SESSION's runs (or just RUN) as records are appended, until Ctrl-C.

    Prints the last N records first, then every new one; without RUN, runs that start
    later are followed too, from their first record.
    """
    journal = _open(state_dir)
    _check_ids(journal, session, run)
    if not wait:
        if run is None:
            session = _require_session(journal, session)
        else:
            session, run = _require_run(journal, session, run)
    show = _printer(as_json, with_run=run is None)
    # SIGTERM ends a follow as cleanly as Ctrl-C does.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        for batch in _follow(journal, session, run, lines, interval):
            for record in batch:
                show(record)
            sys.stdout.flush()
    except KeyboardInterrupt:
        pass
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, with nothing left to flush.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _printer(as_json: bool, *, with_run: bool) -> Callable[[JsonObject], None]:
    def show(record: JsonObject) -> None:
        if as_json:
            sys.stdout.write(json.dumps(record) + "\n")
            return
        place = f"{record.get('run_id')}:{record['seq']}" if with_run else str(record["seq"])
        state = f" [{record['terminal_state']}]" if record.get("terminal_state") else ""
        sys.stdout.write(
            f"{_when(record.get('created_at'))}  {place}  {record.get('event')}{state}  "
            f"{_compact(record.get('payload'))}\n"
        )

    return show


class _RunFollower:
    """Reads one run file incrementally: only the bytes appended since the last look.

    Only complete lines are consumed, so a write in progress is picked up on a later look.
    If the file was replaced (retention compacts by rename) or cut below what was read, it
    is read again from the start and only records past the last seq seen are returned.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.inode: int | None = None
        self.last_seq = 0

    def poll(self) -> list[JsonObject]:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return []
        try:
            stat = os.fstat(fd)
            if stat.st_ino != self.inode or stat.st_size < self.offset:
                self.inode = stat.st_ino
                self.offset = 0
            if stat.st_size == self.offset:
                return []
            data = os.pread(fd, stat.st_size - self.offset, self.offset)
        finally:
            os.close(fd)
        end = data.rfind(b"\n") + 1
        self.offset += end
        records = []
        for line in data[:end].split(b"\n"):
            record = _decode(line)
            if record is not None and record["seq"] > self.last_seq:
                records.append(record)
                self.last_seq = record["seq"]
        return records


def _decode(line: bytes) -> JsonObject | None:
    if not line.strip():
        return None
    try:
        value = _decoder.decode(line)
    except msgspec.DecodeError:
        return None
    if not isinstance(value, dict) or type(value.get("seq")) is not int or value["seq"] < 1:
        return None
    return value


def _follow(
    journal: RunJournal, session_id: str, run_id: str | None, backlog: int, interval: float
) -> Iterator[list[JsonObject]]:
    """Yield batches of new records forever: first the backlog, then each look's finds."""
    followers: dict[str, _RunFollower] = {}

    def discover() -> list[str]:
        if run_id is not None:
            return [run_id]
        try:
            return journal.runs(session_id)
        except OSError:
            return []

    def look() -> list[JsonObject]:
        found = []
        for rid in discover():
            follower = followers.get(rid)
            if follower is None:
                follower = followers[rid] = _RunFollower(journal.path(session_id, rid))
            found.append(follower.poll())
        # Interleave runs by time; each run's records keep their own (seq) order.
        return list(heapq.merge(*found, key=_created_at))

    first = look()
    yield first[-backlog:] if backlog else []
    while True:
        time.sleep(interval)
        batch = look()
        if batch:
            yield batch


def _created_at(record: JsonObject) -> float:
    value = record.get("created_at")
    return float(value) if isinstance(value, int | float) else 0.0
