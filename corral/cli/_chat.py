"""``corral send``, and what ``corral chat`` (:mod:`._repl`) and ``corral agents`` share with
it: talk to the embedded control plane.

The commands are thin: finding the control plane and following a turn live in
:mod:`._client`, and how a turn looks on a terminal lives in :func:`describe` and
:class:`TurnView` here — plain code over recorded events, testable without a TTY or a host.

Approvals. ``corral send`` runs in scripts, where nobody can answer a prompt, so an approval
request is answered by a flag: ``--decline`` (the default — a script should not let an agent
act on something nobody approved) or ``--approve``. ``corral chat`` asks inline (``y``/``n``).
Nothing waits forever: ``send --timeout`` (300 s by default) interrupts the turn and exits 1.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click
import trio
from rich.console import Console
from rich.text import Text

from .._jsonlines import JsonObject
from ..config import resolve_state_dir
from ._client import ApiError, ControlPlane, run_turn
from ._locate import NoControlPlane, NoCredential
from ._output import (
    EXIT_FAILURE,
    CliError,
    NoHost,
    emit_json,
    json_option,
    pick,
    state_dir_option,
)
from ._sse import StreamEvent
from ._turn_follower import TurnFollower

T = TypeVar("T")

DEFAULT_AGENT = "demo"
DEFAULT_TIMEOUT_S = 300.0
#: Tool arguments and outputs are cut to this many characters on screen.
SHOW_CHARS = 160


# --- how events look -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Line:
    """What one event shows: ``kind`` is text, tool, output, approval, error or note.

    ``key`` identifies the thing shown (a tool call's ``call_id``) so that a view shows it
    once even when the stream reports it twice (``in_progress``, then ``completed``).
    """

    kind: str
    text: str
    key: str | None = None


def _clip(text: str, limit: int = SHOW_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def format_arguments(arguments: Any) -> str:
    """A tool call's arguments on one line (they arrive as a JSON string, or a mapping)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return _clip(arguments)
    return _clip(json.dumps(arguments, ensure_ascii=False, separators=(", ", ": ")))


def summarize_output(output: Any) -> str:
    """A tool output in a few words: a shell result as ``exit N: stdout``, else clipped text."""
    value = output
    if isinstance(output, str):
        try:
            value = json.loads(output)
        except ValueError:
            value = output
    if isinstance(value, dict) and ("stdout" in value or "exit_code" in value):
        streams = str(value.get("stdout") or "") + str(value.get("stderr") or "")
        return _clip(f"exit {value.get('exit_code')}: {streams.strip() or '(no output)'}")
    if isinstance(value, dict) and "error" in value:
        return _clip(f"error: {value['error']}")
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return _clip(text) or "(empty)"


def describe(event: StreamEvent) -> Line | None:
    """What a chat shows for one session event, or None for events it keeps quiet about."""
    data = event.data
    if event.type == "response.output_text.delta":
        delta = str(data.get("delta") or "")
        return Line("text", delta) if delta else None
    if event.type == "response.output_item.done":
        item = v if isinstance(v := data.get("item"), dict) else {}
        if item.get("type") == "function_call":
            call = f"{item.get('name')} {format_arguments(item.get('arguments') or {})}"
            return Line("tool", call, key=str(item.get("call_id") or item.get("id")))
        if item.get("type") == "function_call_output":
            return Line("output", summarize_output(item.get("output")))
        return None
    if event.type == "response.elicitation_request":
        params = v if isinstance(v := data.get("params"), dict) else {}
        return Line("approval", str(params.get("message") or "The agent asks for approval."))
    if event.type == "session.status":
        if data.get("status") == "failed":
            error = v if isinstance(v := data.get("error"), dict) else {}
            code = error.get("code") or "failed"
            return Line("error", f"turn failed: {code}: {error.get('message') or ''}".rstrip(": "))
        if data.get("status") == "waiting":
            return Line("note", "waiting…")
    if event.type == "response.retry":
        # The provider failed in a way worth another try: say so, or the pause looks hung.
        error = v if isinstance(v := data.get("error"), dict) else {}
        attempt, most, delay = (
            data.get("attempt"),
            data.get("max_attempts"),
            data.get("delay_seconds"),
        )
        why = f": {error.get('message')}" if error.get("message") else ""
        return Line(
            "note", f"retrying the model call in {delay}s (attempt {attempt} of {most}){why}"
        )
    if event.type == "session.delivery_failed":
        # The message POST was answered before the runner saw it: this is the only word of
        # a refusal (the turn it would have started never runs).
        what = "verdict" if data.get("kind") == "approval" else "message"
        detail = data.get("detail") or f"HTTP {data.get('status')}"
        return Line("error", f"the runner did not take the {what}: {detail}")
    return None


_STYLES = {
    "tool": ("  tool: ", "cyan"),
    "output": ("  output: ", "dim"),
    "approval": ("  approval requested: ", "yellow"),
    "error": ("", "red"),
    "note": ("", "dim"),
}


class TurnView:
    """Shows a turn as it happens: text streamed to ``out``, everything else as lines on
    ``notes`` (``out`` too by default; ``corral send`` keeps stdout for the text alone)."""

    def __init__(
        self, out: Console, notes: Console | None = None, *, show_failure: bool = True
    ) -> None:
        self.out = out
        self.notes = notes if notes is not None else out
        #: Whether a failed turn's edge is shown (``send`` tells it once, as its error).
        self.show_failure = show_failure
        self._mid_line = False
        self._shown: set[str] = set()

    def show(self, event: StreamEvent) -> None:
        """Show one event (each tool call once)."""
        line = describe(event)
        if line is None:
            return
        if not self.show_failure and event.data.get("status") == "failed":
            return
        if line.key is not None:
            if line.key in self._shown:
                return
            self._shown.add(line.key)
        if line.kind == "text":
            self.out.print(line.text, end="", markup=False, highlight=False, soft_wrap=True)
            self.out.file.flush()
            self._mid_line = not line.text.endswith("\n")
            return
        self.note(line.text, kind=line.kind)

    def note(self, text: str, *, kind: str = "note") -> None:
        """A line of its own (after ending streamed text, if it shares the console)."""
        if self._mid_line and self.notes is self.out:
            self.out.print()
            self._mid_line = False
        prefix, style = _STYLES.get(kind, ("", ""))
        self.notes.print(Text(prefix + text, style=style), soft_wrap=True)

    def prompted(self) -> None:
        """A prompt was written on ``out`` and waits for its answer: a line shown meanwhile
        starts on a line of its own."""
        self._mid_line = True

    def answered(self) -> None:
        """The prompt's answer ended its line (echoed by the terminal with the Enter)."""
        self._mid_line = False

    def new_turn(self) -> None:
        """Forget the tool calls shown: a new turn starts (call ids are per turn)."""
        self._shown.clear()

    def end_text(self) -> None:
        """End the streamed text's line, if one is open."""
        if self._mid_line:
            self.out.print()
            self._mid_line = False


# --- plumbing --------------------------------------------------------------------------------


def _cursor(value: Any) -> str | None:
    return None if value is None else str(value)


def _client_call(
    state_dir: Path | None,
    work: Callable[[ControlPlane], Awaitable[T]],
    *,
    url: str | None = None,
    document: JsonObject | None = None,
) -> T:
    """Run ``work`` against the state dir's control plane (or the one at ``url``), mapping
    errors to exit codes; ``document``: the fields of the verb's ``--json`` error document
    besides ``error`` (:mod:`._errors`)."""

    async def main() -> T:
        directory = resolve_state_dir(str(state_dir) if state_dir else None)
        async with ControlPlane(directory, url=url) as api:
            return await work(api)

    try:
        return trio.run(main)
    except NoControlPlane as exc:
        raise NoHost(str(exc), document=document) from None
    except NoCredential as exc:
        raise CliError(str(exc), code="no_credential", document=document) from None
    except ApiError as exc:
        if exc.status == 401:
            message = (
                f"the control plane refused the client token: {exc.detail} (was it rotated? "
                "`corral token` prints the current one; docs/security.md)"
            )
            raise CliError(message, code="unauthorized", document=document) from None
        raise CliError(str(exc), code=exc.error, document=document) from None
    except CliError as exc:
        exc.document = {**(document or {}), **exc.document}
        raise


async def _open_session(api: ControlPlane, session_id: str | None, agent: str | None) -> JsonObject:
    """The given session (its id, or a unique prefix of it), or a new one of ``agent``
    (default ``demo``), with a clear error."""
    if session_id is not None:
        try:
            return await api.session(session_id)
        except ApiError as exc:
            if exc.status not in (400, 404):
                raise
        # Not a whole id: a unique prefix of one names it.
        try:
            page = await api.call("GET", "/v1/sessions?limit=1000", idempotent=True)
        except ApiError:
            page = {}  # a server that lists none: the id is taken whole only
        ids = [str(s.get("id")) for s in page.get("data", [])]
        if not any(i.startswith(session_id) for i in ids):
            raise CliError(f"unknown session {session_id!r}", code="not_found")
        return await api.session(pick(session_id, ids, "session"))
    name = agent or DEFAULT_AGENT
    try:
        return await api.create_session(name)
    except ApiError as exc:
        if exc.status != 404:
            raise
        if "was not loaded" in exc.detail:  # its file is invalid: the plane says where, why
            raise CliError(exc.detail, code="invalid_agent") from None
        names = ", ".join(str(a.get("name")) for a in await api.agents()) or "none"
        raise CliError(f"unknown agent {name!r} (agents here: {names})", code="not_found") from None


#: The error code of a turn whose control plane went away and did not come back in time.
UNREACHABLE = "control_plane_unreachable"


def _control_plane_lost(message: str) -> CliError:
    """``corral chat`` lost its control plane during a turn (exit 1, as a failed turn of
    ``send``; exit 3 is for "no host here" before any session)."""
    return CliError(message, code=UNREACHABLE)


def _lost(exc: NoControlPlane, turn: TurnFollower) -> JsonObject:
    """The error of a turn whose control plane went away and did not come back in time."""
    if turn.item_id is None:
        fate = "it did not answer the message's POST, which may or may not have stored it"
    else:
        fate = f"the message was stored as {turn.item_id} and may still run"
    return {"code": UNREACHABLE, "message": f"{exc}; {fate}"}


def url_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--url``: reach a control plane whose state dir this user cannot read."""
    return click.option(
        "--url",
        envvar="CORRAL_URL",
        metavar="URL",
        help="The control plane's URL, instead of the state dir's server.json (env "
        "CORRAL_URL); the token then comes from env CORRAL_TOKEN, else the state dir.",
    )(fn)


def _session_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option(
        "--session", "session_id", metavar="ID", help="Talk in this session (else a new one)."
    )(fn)
    return click.option(
        "--agent", metavar="NAME", help=f"The agent of a new session (default {DEFAULT_AGENT})."
    )(fn)


def _check_session_options(session_id: str | None, agent: str | None) -> None:
    if session_id is not None and agent is not None:
        raise click.UsageError("give --session or --agent, not both")


# --- commands --------------------------------------------------------------------------------


@click.command("send")
@click.argument("text")
@_session_options
@click.option(
    "--approve/--decline",
    default=None,
    help="Accept, or decline, every approval the turn asks for, its sub-agents' too. Neither: "
    "the turn's own are declined and a sub-agent's are left for whoever watches them.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_TIMEOUT_S,
    show_default=True,
    help="Seconds to wait for the turn to end; past it the turn is interrupted (exit 1).",
)
@state_dir_option
@url_option
@json_option
def send_command(
    text: str,
    session_id: str | None,
    agent: str | None,
    approve: bool | None,
    timeout: float,
    state_dir: Path | None,
    url: str | None,
    as_json: bool,
) -> None:
    """Post one message and wait for the turn to end (exit 0 idle, 1 failed).

    Creates a session of --agent (default demo) unless --session is given. TEXT `-` reads
    the message from stdin. With --json prints {session_id, status, text, error, events};
    without, streams the text to stdout and tool calls and approvals to stderr.

    \b
    Example:
        corral send --agent demo --approve "hi" --json
    """
    _check_session_options(session_id, agent)
    if text == "-":
        text = sys.stdin.read()
    out = Console(highlight=False)
    # A failed turn is told once, by the error line at the end.
    view = TurnView(out, Console(stderr=True, highlight=False), show_failure=False)

    async def work(api: ControlPlane) -> TurnFollower:
        session = await _open_session(api, session_id, agent)
        # A session that runs a turn runs this message as its own turn after that one (§E.3).
        turn = TurnFollower(str(session["id"]), busy=session.get("status") == "running")

        async def decide(event: StreamEvent) -> str | None:
            # A sub-agent's approval, mirrored onto this stream, belongs to the child's own
            # turn, which may outlive this one: only an explicit flag answers it; by default
            # it is left for whoever watches it (`corral chat`, `corral elicitations resolve`).
            params = event.data.get("params")
            target = params.get("target_session_id") if isinstance(params, dict) else None
            if approve is None and isinstance(target, str) and target != turn.session_id:
                if not as_json:
                    view.note(f"left for its own session: sub-agent {target} asks for approval")
                return None
            action = "accept" if approve else "decline"
            if not as_json:
                view.note("accepted (--approve)" if approve else "declined (--decline)")
            return action

        with trio.move_on_after(timeout) as scope:
            try:
                await run_turn(
                    api,
                    turn.session_id,
                    _cursor(session.get("last_event_id")),
                    text,
                    on_event=(lambda e: None) if as_json else view.show,
                    decide=decide,
                    follower=turn,
                )
            except NoControlPlane as exc:
                # The session exists: this is a turn that failed, told as one (exit 1, the
                # JSON document), not "no host" (exit 3) with nothing on stdout.
                turn.status, turn.error = "failed", _lost(exc, turn)
                return turn
        if scope.cancelled_caught:
            # Nobody is waiting any more: stop the agent rather than let it act unobserved.
            with trio.move_on_after(5), contextlib.suppress(ApiError, NoControlPlane):
                await api.interrupt(turn.session_id)
            turn.status = "failed"
            turn.error = {
                "code": "client_timeout",
                "message": f"the turn did not end within {timeout:g}s; it was interrupted",
            }
        return turn

    document: JsonObject = {"session_id": session_id, "status": "failed", "text": "", "events": []}
    turn = _client_call(state_dir, work, url=url, document=document)
    view.end_text()
    if as_json:
        emit_json(turn.result())
    if turn.status != "idle":
        error = turn.error or {}
        view.notes.print(
            Text(
                f"error: session {turn.session_id}: {error.get('code')}: {error.get('message')}",
                style="red",
            ),
            soft_wrap=True,
        )
        raise SystemExit(EXIT_FAILURE)
