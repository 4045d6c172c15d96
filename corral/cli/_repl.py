"""``corral chat``: the interactive loop — line editing, history, approvals asked inline.

Lines are read with the standard library's ``readline`` when stdin is a terminal (arrows,
Ctrl-R, the usual Emacs keys), in a worker thread. Each line sent is kept in
``<state dir>/chat_history`` (the newest :data:`HISTORY_LINES`), so Up brings back what was
typed in an earlier chat. An approval's answer is read without readline and without a
thread (:meth:`LineReader.answer`): a prompt withdrawn mid-read leaves nothing blocked
behind it, and is kept in no history.

An approval is asked while the turn's stream goes on being read, so the prompt can be
withdrawn, with a line saying why, when the question no longer stands: its turn ended (it
was interrupted, failed, or its worker restarted), someone else answered it (another
client, ``corral elicitations resolve``), or the host went away. An answer that arrives too
late is told in words (``it was already answered``), never as an HTTP status.

Ctrl-C interrupts the running turn (a second one quits); Ctrl-C or Ctrl-D at ``you>`` quits.
Each ends its line first, so the shell's prompt starts on a line of its own, and the
terminal is left as it was found (readline changes its modes while it reads).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click
import trio
from rich.console import Console

from ..config import resolve_state_dir
from ._chat import (
    DEFAULT_AGENT,
    UNREACHABLE,
    TurnView,
    _check_session_options,
    _client_call,
    _control_plane_lost,
    _cursor,
    _lost,
    _open_session,
    _session_options,
    url_option,
)
from ._client import ApiError, ControlPlane, run_turn
from ._locate import NoControlPlane
from ._output import state_dir_option
from ._sse import StreamEvent
from ._turn_follower import TurnFollower

#: How many lines ``chat_history`` keeps.
HISTORY_LINES = 1000
APPROVE_PROMPT = "approve? [y/N] "


class LineReader:
    """Reads input lines in a worker thread, one at a time, on request.

    A read abandoned half-way (Ctrl-C interrupted the turn while an approval prompt waited)
    keeps its thread; the line typed next goes to the next :meth:`read` rather than being
    lost, and no second thread competes for stdin.

    Args:
        input_fn: reads one line after writing a prompt (``input``, with readline's editing
            where stdin is a terminal).
        history: where the lines read are kept across chats, if anywhere (needs readline).
    """

    def __init__(
        self, input_fn: Callable[[str], str] = input, *, history: Path | None = None
    ) -> None:
        self._input = input_fn
        self._pending: _PendingRead | None = None
        self._lock = trio.Lock()
        self._history = _History(history) if history is not None else None
        #: Answers are read from the terminal itself, without a thread (:meth:`answer`).
        self._tty = input_fn is input and sys.stdin.isatty()

    @property
    def busy(self) -> bool:
        """Whether a thread is still blocked reading a line nobody waits for any more."""
        return self._pending is not None and not self._pending.done.is_set()

    async def read(self, prompt: str, *, remember: bool = True) -> str:
        """The next line (without its newline); one caller at a time (others wait their
        turn). ``remember``: keep it in the history (not an approval's ``y``).

        Raises:
            EOFError: input ended (Ctrl-D).
        """
        async with self._lock:
            pending = self._pending
            if pending is None:
                pending = self._pending = _PendingRead()
                trio.lowlevel.spawn_system_task(self._read_one, pending, prompt)
            else:
                sys.stdout.write(prompt)  # the abandoned read printed an older prompt
                sys.stdout.flush()
            await pending.done.wait()
            self._pending = None
        if pending.error is not None:
            raise pending.error
        if self._history is not None:
            self._history.took(pending.line, remember=remember)
        return pending.line

    async def answer(self, prompt: str) -> str:
        """The answer to a question (an approval): a line that is kept in no history.

        On a terminal it is read from the terminal's own line discipline (which edits and
        echoes it), waiting for input without a thread, so a cancelled question leaves
        nothing blocked: the next ``you>`` prompt is readline's again, shown as it should
        be. From a pipe it is the next line, as :meth:`read` gives it.

        Raises:
            EOFError: input ended (Ctrl-D).
        """
        if not self._tty or self.busy:
            return await self.read(prompt, remember=False)
        async with self._lock:
            sys.stdout.write(prompt)
            sys.stdout.flush()
            fd = sys.stdin.fileno()
            data = b""
            while not data.endswith(b"\n"):
                await trio.lowlevel.wait_readable(fd)
                chunk = os.read(fd, 4096)
                if not chunk:
                    raise EOFError
                data += chunk
        return data.decode(errors="replace").rstrip("\n")

    async def _read_one(self, pending: _PendingRead, prompt: str) -> None:
        try:
            pending.line = await trio.to_thread.run_sync(
                self._input, prompt, abandon_on_cancel=True
            )
        except (EOFError, OSError, ValueError) as exc:  # ValueError: stdin was closed
            pending.error = exc if isinstance(exc, EOFError) else EOFError(str(exc))
        pending.done.set()


class _PendingRead:
    def __init__(self) -> None:
        self.done = trio.Event()
        self.line = ""
        self.error: EOFError | None = None


class _History:
    """readline's history, loaded from a file and each line appended to it as it is sent
    (when readline is there and stdin is a terminal: a pipe's lines are no history)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._readline = _readline() if sys.stdin.isatty() else None
        rl = self._readline
        if rl is None:
            return
        try:
            rl.read_history_file(path)
        except OSError:
            return
        rl.set_history_length(HISTORY_LINES)
        if rl.get_current_history_length() >= HISTORY_LINES:
            with contextlib.suppress(OSError):
                rl.write_history_file(path)  # trimmed to the newest, now and then

    def took(self, line: str, *, remember: bool) -> None:
        """``input`` has put ``line`` in readline's history (a non-empty one): append it
        to the file too, or take it back out."""
        rl = self._readline
        if rl is None or not line.strip():
            return
        if not remember:
            length = rl.get_current_history_length()
            if length and rl.get_history_item(length) == line:
                rl.remove_history_item(length - 1)
            return
        try:
            if not self.path.exists():
                self.path.touch(mode=0o600)
            rl.append_history_file(1, self.path)
        except OSError:
            pass  # a history that cannot be written is no reason to stop the chat


def _readline() -> Any:
    """The readline module, imported for its side effect on ``input`` (line editing)."""
    try:
        import readline
    except ImportError:
        return None
    return readline


@contextlib.contextmanager
def _terminal_kept() -> Iterator[None]:
    """Put the terminal's modes back as they were on the way out: a read abandoned inside
    readline (Ctrl-C at a prompt) would leave it without echo."""
    try:
        import termios

        fd = sys.stdin.fileno()
        saved = termios.tcgetattr(fd) if os.isatty(fd) else None
    except (ImportError, OSError, ValueError):
        saved = None
    try:
        yield
    finally:
        if saved is not None:
            with contextlib.suppress(OSError):
                termios.tcsetattr(fd, termios.TCSADRAIN, saved)


class _Asker:
    """Asks the approvals of one turn, one prompt at a time, while the stream goes on; each
    prompt is withdrawn (with a line saying why) when its question no longer stands."""

    def __init__(
        self, api: ControlPlane, reader: LineReader, view: TurnView, session_id: str
    ) -> None:
        self.api, self.reader, self.view, self.session_id = api, reader, view, session_id
        #: The open prompt of each question asked and not answered yet.
        self.open: dict[str, trio.CancelScope] = {}
        self.answered: set[str] = set()

    async def ask(self, event: StreamEvent) -> None:
        """Ask about ``event`` (an ``elicitation_request``) and send the verdict."""
        elicitation_id = str(event.data.get("elicitation_id") or "")
        if elicitation_id in self.answered:
            return  # answered elsewhere before its prompt came up
        # A sub-agent's prompt, mirrored onto this stream, is answered where it lives.
        params = event.data.get("params")
        target = params.get("target_session_id") if isinstance(params, dict) else None
        owner = target if isinstance(target, str) and target else self.session_id
        scope = self.open[elicitation_id] = trio.CancelScope()
        with scope:
            try:
                self.view.prompted()
                answer = await self.reader.answer(APPROVE_PROMPT)
            except EOFError:
                answer = ""
            self.view.answered()
        self.open.pop(elicitation_id, None)
        if scope.cancelled_caught or elicitation_id in self.answered:
            return
        action = "accept" if answer.strip().lower() in ("y", "yes") else "decline"
        try:
            await self.api.resolve(owner, elicitation_id, action)
        except ApiError as exc:
            if exc.status not in (404, 409, 410):
                self.view.note(f"the verdict was not taken: {exc.detail or exc}", kind="error")
            else:
                self.view.note("the verdict was not taken: it was already answered", kind="note")
        except NoControlPlane:
            self.view.note("the verdict was not sent: the host went away", kind="error")

    def seen(self, event: StreamEvent) -> None:
        """Withdraw the prompt of a question someone else answered."""
        if event.type == "response.elicitation_resolved":
            elicitation_id = str(event.data.get("elicitation_id"))
            self.answered.add(elicitation_id)
            self.withdraw(elicitation_id, "it was answered elsewhere")

    def withdraw(self, elicitation_id: str | None, why: str) -> None:
        """Withdraw one open prompt (None: every one), saying ``why``."""
        for eid in [elicitation_id] if elicitation_id is not None else list(self.open):
            scope = self.open.pop(eid, None)
            if scope is not None:
                scope.cancel()
                self.view.note(f"approval withdrawn: {why}")
                self.view.answered()


async def chat_turn(
    api: ControlPlane,
    reader: LineReader,
    view: TurnView,
    session_id: str,
    after: str | None,
    text: str,
) -> tuple[TurnFollower, bool]:
    """One turn of ``corral chat``; returns it and whether the user asked to quit.

    Ctrl-C interrupts the turn (the turn still ends with its own edge, which is awaited);
    a second Ctrl-C quits. Approval prompts are answered inline, while the stream is read.
    """
    turn = TurnFollower(session_id)
    view.new_turn()
    quit_chat = False
    error: Exception | None = None
    asker = _Asker(api, reader, view, session_id)

    async def decide(event: StreamEvent) -> None:
        nursery.start_soon(asker.ask, event)
        return None  # the asker sends the verdict itself, once there is one

    def on_event(event: StreamEvent) -> None:
        view.show(event)
        asker.seen(event)

    async def interrupt() -> None:
        try:
            await api.interrupt(session_id)
        except (ApiError, NoControlPlane) as exc:
            view.note(f"could not interrupt: {exc}", kind="error")

    async def watch_ctrl_c(*, task_status: trio.TaskStatus[None]) -> None:
        nonlocal quit_chat
        with trio.open_signal_receiver(signal.SIGINT) as signals:
            task_status.started()
            interrupted = False
            async for _ in signals:
                if interrupted:
                    quit_chat = True
                    asker.withdraw(None, "quitting")
                    nursery.cancel_scope.cancel()
                    return
                interrupted = True
                view.note("interrupting the turn (Ctrl-C again to quit)")
                asker.withdraw(None, "the turn is being interrupted")
                nursery.start_soon(interrupt)

    async with trio.open_nursery() as nursery:
        await nursery.start(watch_ctrl_c)
        try:
            await run_turn(
                api, session_id, after, text, on_event=on_event, decide=decide, follower=turn
            )
        except NoControlPlane as exc:
            # The turn failed, told as send tells it (control_plane_unreachable, exit 1),
            # not as "no host" (exit 3): the session exists and its message may still run.
            turn.status, turn.error = "failed", _lost(exc, turn)
            asker.withdraw(None, "the host went away")
        except Exception as exc:  # re-raised below, unwrapped from the nursery's group
            error = exc
        asker.withdraw(None, f"the turn ended ({turn.status or 'stopped'})")
        nursery.cancel_scope.cancel()
    view.end_text()
    if error is not None:
        raise error
    return turn, quit_chat


async def chat_loop(
    api: ControlPlane,
    reader: LineReader,
    view: TurnView,
    *,
    session_id: str | None,
    agent: str | None,
) -> None:
    """The REPL: prompt, run the turn, repeat until EOF or a double Ctrl-C."""
    session = await _open_session(api, session_id, agent)
    sid = str(session["id"])
    cursor = _cursor(session.get("last_event_id"))
    view.note(
        f"session {sid} with agent {session.get('agent') or agent or DEFAULT_AGENT}: "
        "Ctrl-C interrupts a turn; Ctrl-D (or Ctrl-C at the prompt) quits"
    )
    while True:
        line = await _prompt(reader)
        if line is None:
            view.out.print()
            return
        if not line.strip():
            continue
        turn, quit_chat = await chat_turn(api, reader, view, sid, cursor, line)
        cursor = turn.last_id or cursor
        if turn.error is not None and turn.error.get("code") == UNREACHABLE:
            # No control plane to send the next line to: the chat ends here.
            raise _control_plane_lost(f"session {sid}: {UNREACHABLE}: {turn.error['message']}")
        if quit_chat:
            view.out.print()
            return


async def _prompt(reader: LineReader) -> str | None:
    """The next line at the ``you>`` prompt, or None when the user quits there (Ctrl-D, or
    Ctrl-C).

    Ctrl-C is received here, as during a turn, rather than left to trio's KeyboardInterrupt:
    that one is raised wherever the main thread happens to be, and a quit at the prompt once
    went unnoticed for 20 s under load. The abandoned read keeps its thread
    (:attr:`LineReader.busy`), which :func:`chat_command` leaves without waiting for.
    """
    line: str | None = None
    with trio.open_signal_receiver(signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:

            async def quit_on_ctrl_c() -> None:
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(quit_on_ctrl_c)
            # Ctrl-D is a quit as well; raised from here it would reach the caller in a group.
            with contextlib.suppress(EOFError):
                line = await reader.read("you> ")
            nursery.cancel_scope.cancel()
    return line


@click.command("chat")
@_session_options
@state_dir_option
@url_option
def chat_command(
    session_id: str | None, agent: str | None, state_dir: Path | None, url: str | None
) -> None:
    """Talk to an agent: streamed text, tool calls as they happen, approvals inline.

    Lines are edited as in a shell (arrows, Ctrl-R) and kept in <state dir>/chat_history.
    Ctrl-C interrupts the running turn (twice quits); Ctrl-D or Ctrl-C at the prompt quits.
    An approval prompt is withdrawn, saying why, when its turn ends, someone else answers
    it, or the host goes away. A control plane that goes away during a turn and is not back
    within 30 s ends the chat with control_plane_unreachable (exit 1).

    \b
    Example:
        corral chat --agent demo
    """
    _check_session_options(session_id, agent)
    view = TurnView(Console(highlight=False))
    directory = resolve_state_dir(str(state_dir) if state_dir else None)
    reader = LineReader(history=directory / "chat_history" if directory.is_dir() else None)

    async def work(api: ControlPlane) -> None:
        await chat_loop(api, reader, view, session_id=session_id, agent=agent)

    code = 0
    with _terminal_kept():
        try:
            _client_call(state_dir, work, url=url)
        except KeyboardInterrupt:
            view.out.print()
        except click.ClickException as exc:
            if not reader.busy:
                raise
            exc.show()
            code = exc.exit_code
    if reader.busy:
        # A thread still blocks in input(), holding stdin's lock: interpreter shutdown would
        # abort on that lock, so leave without waiting for it (nothing else is pending).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
