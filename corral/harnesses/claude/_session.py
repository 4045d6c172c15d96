"""The Claude Code process a worker keeps across turns, and the CLI session it resumes.

One ``claude -p --input-format stream-json`` runs per worker, started by the first turn and
kept in the worker's :attr:`TurnContext.services` nursery, so later turns skip its start
(~0.5 s) and its MCP handshake. It is started again — with ``--resume`` and the session id
its ``system/init`` line reported, so the conversation goes on — when it died, when a turn
left it in an unknown state (an interrupt it did not finish, a failure), or when a turn
needs other settings (model, instructions, tools).

The session id is kept in the session's ``cli_home`` (:data:`STATE_FILE`), beside Claude
Code's own transcript under ``$HOME/.claude``, so a restarted worker resumes it too. A
session Claude Code cannot find any more (a home wiped) is not resumed: the turn starts a
new one and seeds it with the history (:mod:`._harness`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import trio

from .._cli_process import CliError, CliProcess, open_cli
from .._turn import TurnFailed
from ._settings import Settings

log = logging.getLogger("corral.harnesses.claude")

#: In the session's ``cli_home``: the Claude Code session to resume.
STATE_FILE = "claude-sdk.json"
#: How long the CLI may write nothing while it starts (~0.5 s on an idle machine; its
#: ``initialize`` answer ends the start).
START_TIMEOUT_S = 60.0


class ControlError(Exception):
    """The CLI answered a control request with an error."""


class ClaudeSession:
    """A running Claude Code and what it was started with."""

    def __init__(self, cli: CliProcess, scope: trio.CancelScope, key: tuple[Any, ...]) -> None:
        self.cli = cli
        self.key = key
        #: Not initialized yet: the first turn sends ``initialize`` before its message.
        self.fresh = True
        self._scope = scope
        self._answers: dict[str, tuple[trio.Event, list[dict[str, Any]]]] = {}

    @property
    def alive(self) -> bool:
        return self.cli.proc.poll() is None and not self._scope.cancel_called

    def stop(self) -> None:
        """End the CLI (its group too); a later turn starts another."""
        self._scope.cancel()

    async def request(self, subtype: str, **fields: Any) -> dict[str, Any]:
        """Send a control request; its answer once a reader of the CLI's output routed it
        (:meth:`answered`).

        Raises:
            ControlError: the CLI answered with an error.
        """
        request_id = f"corral_{uuid.uuid4().hex[:12]}"
        event, box = trio.Event(), list[dict[str, Any]]()
        self._answers[request_id] = (event, box)
        try:
            await self.cli.send(
                {
                    "type": "control_request",
                    "request_id": request_id,
                    "request": {"subtype": subtype, **fields},
                }
            )
            await event.wait()
        finally:
            self._answers.pop(request_id, None)
        response = box[0]
        if response.get("subtype") == "error":
            raise ControlError(str(response.get("error") or "no reason given"))
        return dict(response.get("response") or {})

    def answered(self, message: dict[str, Any]) -> None:
        """A ``control_response`` line: hand it to the request waiting for it."""
        response = message.get("response")
        if not isinstance(response, dict):
            return
        waiting = self._answers.get(str(response.get("request_id")))
        if waiting is None:
            log.info("an answer to no request of ours: %.200r", message)
            return
        waiting[1].append(response)
        waiting[0].set()


async def start(
    nursery: trio.Nursery, argv: list[str], env: dict[str, str], cwd: Path, settings: Settings
) -> ClaudeSession:
    """Start Claude Code in ``nursery`` (the worker's), where it lives until stopped.

    Raises:
        TurnFailed: ``harness_unavailable`` when it cannot be started.
    """

    async def hold(task_status: trio.TaskStatus[ClaudeSession]) -> None:
        with trio.CancelScope() as scope:
            async with open_cli(argv, env=env, cwd=cwd) as cli:
                task_status.started(ClaudeSession(cli, scope, settings.key))
                # Its exit is seen by the turn reading its output; this task only keeps it.
                await trio.sleep_forever()

    try:
        with collapsed():
            session: ClaudeSession = await nursery.start(hold)
    except CliError as exc:
        raise TurnFailed("harness_unavailable", f"cannot start Claude Code: {exc}") from exc
    return session


@contextlib.contextmanager
def collapsed() -> Iterator[None]:
    """Raise what a nursery wrapped as one exception.

    trio wraps whatever leaves a nursery in an exception group, even one exception; the
    worker reads a :class:`TurnFailed` (and trio a ``Cancelled``) only unwrapped. A group of
    ``Cancelled`` only (the body and its tasks, all cancelled) is one cancellation; an error
    beside cancellations (a task that failed cancels the others) is that error; a group of
    several errors is left as it is.
    """
    try:
        yield
    except BaseExceptionGroup as group:
        cancelled, errors = group.split(trio.Cancelled)
        leaves = _leaves(errors) if errors is not None else _leaves(cancelled)
        if errors is not None and len(leaves) > 1:
            raise
        raise leaves[0] from None


def _leaves(error: BaseException | None) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [] if error is None else [error]


def load_state(home: Path) -> dict[str, Any]:
    """What :func:`save_state` kept (nothing when there is no readable state)."""
    try:
        state = json.loads((home / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def save_state(home: Path, session_id: str) -> None:
    """Keep the CLI's session id (atomically: a worker killed mid-write leaves the old one)."""
    path = home / STATE_FILE
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps({"session_id": session_id}))
    temporary.replace(path)


def resumable(home: Path, state: dict[str, Any]) -> str | None:
    """The session id to ``--resume``, if Claude Code still has its transcript."""
    session_id = state.get("session_id")
    if not isinstance(session_id, str) or not session_id or "/" in session_id:
        return None
    projects = home / ".claude" / "projects"
    with contextlib.suppress(OSError):
        if any(projects.glob(f"*/{session_id}.jsonl")):
            return session_id
    return None


def deadline(limit: float) -> float:
    """A trio deadline ``limit`` seconds from now (none for 0 or infinity)."""
    return trio.current_time() + limit if limit and math.isfinite(limit) else math.inf
