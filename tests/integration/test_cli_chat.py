"""``corral chat`` on a terminal (issue #19 item 5), typed into a real pseudo-terminal against
a real host: line editing and a history kept in the state dir, an approval prompt withdrawn
with a line saying why when its question no longer stands (answered elsewhere, its turn
ended, the host gone) — never a raw HTTP status — and clean lines on Ctrl-C and Ctrl-D."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import HostProcess, corral, kill_host, processes_of
from tests.integration._plane_host import plane_host, start

AGENTS = {
    # A turn that asks a person, then says what it was told.
    "asks": """
        name: asks
        executor:
          harness: scripted
          script:
            turns:
              - - {text: "asking. "}
                - {elicit: {message: "May I deploy?"}}
                - {text: "Deployed.", on_decline: "Not deployed."}
        """,
    # A turn that shows the history it was given: what the user typed, as the agent saw it.
    "echoes": """
        name: echoes
        executor:
          harness: scripted
          script:
            turns:
              - - {echo_history: true}
        """,
}

PROMPT = "you> "
APPROVE = "approve? [y/N] "
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _controlling_terminal() -> None:
    """In the child: a session of its own whose controlling terminal is the pty on stdin,
    so Ctrl-C typed there is a SIGINT, as in a shell."""
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Terminal:
    """``corral chat ARGS`` on a pseudo-terminal: what is typed, and all it shows."""

    def __init__(self, *args: str, state_dir: Path) -> None:
        master, slave = pty.openpty()
        self.fd = master
        env = {**os.environ, "CORRAL_STATE_DIR": str(state_dir), "TERM": "xterm"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "corral", "chat", *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            preexec_fn=_controlling_terminal,  # only setsid and an ioctl: fork-safe
        )
        os.close(slave)
        self.shown = ""

    def type(self, keys: str) -> None:
        os.write(self.fd, keys.encode())

    def until(self, marker: str, count: int = 1, timeout: float = 60) -> str:
        """Read until ``marker`` was shown ``count`` times in all; return what was shown."""
        deadline = time.monotonic() + timeout
        while self.text().count(marker) < count:
            left = deadline - time.monotonic()
            assert left > 0, f"no {marker!r} x{count} in {self.text()!r}"
            if not self._read(left):
                raise AssertionError(f"chat ended before {marker!r} x{count}: {self.text()!r}")
        return self.text()

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return True
        try:
            chunk = os.read(self.fd, 65536)
        except OSError:  # EIO: the other side closed
            return False
        self.shown += chunk.decode(errors="replace")
        return bool(chunk)

    def text(self) -> str:
        """What was shown, with the terminal's control sequences taken out."""
        return ANSI.sub("", self.shown).replace("\r\n", "\n")

    def exit_code(self, timeout: float = 30) -> int:
        """Its exit code, once it ends (what it shows meanwhile is read)."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            assert time.monotonic() < deadline, f"chat did not end: {self.text()!r}"
            if not self._read(0.1):
                break
        code = self.proc.wait(max(deadline - time.monotonic(), 1))
        while self._read(0):
            pass
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        os.close(self.fd)


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostProcess]:
    host = plane_host(tmp_path_factory.mktemp("chat"), AGENTS)
    try:
        yield start(host)
    finally:
        kill_host(host)


@pytest.fixture
def terminals() -> Iterator[list[Terminal]]:
    opened: list[Terminal] = []
    yield opened
    for terminal in opened:
        terminal.close()


def _session_of(terminal: Terminal) -> str:
    match = re.search(r"session (\w+) with agent", terminal.until(" with agent "))
    assert match is not None
    return match.group(1)


def _parked_of(host: HostProcess, session_id: str) -> str:
    """The id of the elicitation parked for ``session_id``, once there is one."""

    def parked(answer: dict[str, Any]) -> str | None:
        return next(
            (
                e["elicitation_id"]
                for e in answer["elicitations"]
                if e["session_id"] == session_id and e["state"] == "parked"
            ),
            None,
        )

    return str(host.wait_for(parked, 30, "a parked elicitation", op="elicitations"))


def _asking(plane: HostProcess, terminals: list[Terminal]) -> tuple[Terminal, str, str]:
    """A chat with ``asks`` whose first turn waits at its approval prompt."""
    terminal = Terminal("--agent", "asks", state_dir=plane.state_dir)
    terminals.append(terminal)
    session_id = _session_of(terminal)
    terminal.until(PROMPT)
    terminal.type("go\r")
    terminal.until(APPROVE)
    return terminal, session_id, _parked_of(plane, session_id)


def _clean(text: str) -> None:
    assert "Traceback" not in text and "HTTP" not in text and "^[[" not in text, text


def test_a_prompt_answered_elsewhere_is_withdrawn_and_the_turn_goes_on(
    plane: HostProcess, terminals: list[Terminal]
) -> None:
    terminal, _, elicitation_id = _asking(plane, terminals)
    out = corral(
        "elicitations", "resolve", elicitation_id, "--accept", "--state-dir", str(plane.state_dir)
    )
    assert out.returncode == 0, out.stderr
    shown = terminal.until(PROMPT, 2)
    assert f"{APPROVE}\napproval withdrawn: it was answered elsewhere\nDeployed.\n" in shown
    terminal.type("\x04")  # Ctrl-D at the prompt: quits on a line of its own
    assert terminal.exit_code() == 0
    assert terminal.text().endswith(PROMPT + "\n")
    _clean(terminal.text())


def test_a_prompt_whose_turn_ends_is_withdrawn_and_typing_after_it_is_no_error(
    plane: HostProcess, terminals: list[Terminal]
) -> None:
    """The worker of the turn dies at the prompt (as it does when its host crashes): the
    turn ends failed and the prompt is withdrawn; what is typed afterwards is the next
    message, at readline's own prompt — never a verdict refused with an HTTP 409."""
    terminal, session_id, _ = _asking(plane, terminals)
    workers = plane.status()["workers"]
    (pid,) = [w["pid"] for w in workers if w["session_id"] == session_id]
    os.kill(pid, signal.SIGKILL)
    shown = terminal.until(PROMPT, 2)
    assert re.search(
        r"approval withdrawn: (the turn ended \(failed\)|it was answered elsewhere)", shown
    ), shown
    assert "turn failed" in shown
    # The next line is readline's again, with its prompt: Up brings back the "go".
    terminal.type("\x1b[A\r")
    assert terminal.until(APPROVE, 2).count(f"{PROMPT}go") == 2
    terminal.type("n\r")
    assert "Not deployed." in terminal.until(PROMPT, 3)
    terminal.type("\x04")
    assert terminal.exit_code() == 0
    _clean(terminal.text())


def test_ctrl_c_at_a_prompt_interrupts_with_clean_lines_and_twice_quits(
    plane: HostProcess, terminals: list[Terminal]
) -> None:
    terminal, _, _ = _asking(plane, terminals)
    # Ctrl-C at the approval prompt (the terminal echoes ^C): the turn is interrupted.
    terminal.type("\x03")
    shown = terminal.until(PROMPT, 2)
    assert (
        f"{APPROVE}^C\ninterrupting the turn (Ctrl-C again to quit)\n"
        "approval withdrawn: the turn is being interrupted\n"
    ) in shown
    terminal.type("\x03")  # Ctrl-C at you>: quits, the shell's prompt on a line of its own
    assert terminal.exit_code() == 0
    assert terminal.text().endswith(f"\n{PROMPT}\n")
    _clean(terminal.text())


def test_lines_are_edited_and_kept_in_the_state_dir_s_history(
    plane: HostProcess, terminals: list[Terminal]
) -> None:
    history = plane.state_dir / "chat_history"
    history.unlink(missing_ok=True)
    first = Terminal("--agent", "echoes", state_dir=plane.state_dir)
    terminals.append(first)
    first.until(PROMPT)
    # Left x3, Backspace, Right, r: the arrows and Backspace edit the line.
    first.type("hello wrold\x1b[D\x1b[D\x1b[D\x7f\x1b[Cr\r")
    shown = first.until(PROMPT, 2)
    assert json.dumps([["user", "hello world"]]) in shown.replace("\n", "")
    first.type("\x04")
    assert first.exit_code() == 0
    assert history.read_text().splitlines()[-1] == "hello world"
    assert history.stat().st_mode & 0o777 == 0o600

    again = Terminal("--agent", "echoes", state_dir=plane.state_dir)
    terminals.append(again)
    again.until(PROMPT)
    again.type("\x1b[A\r")  # Up: the line of the last chat
    shown = again.until(PROMPT, 2)
    assert json.dumps([["user", "hello world"]]) in shown.replace("\n", "")
    again.type("\x04")
    assert again.exit_code() == 0
    _clean(again.text())


def test_a_prompt_is_withdrawn_when_the_host_goes_away(tmp_path: Path) -> None:
    """The host is killed while the prompt waits: after the 30 s the client waits for a
    control plane to come back, the prompt is withdrawn saying so and the chat ends
    control_plane_unreachable (exit 1)."""
    host = start(plane_host(tmp_path, AGENTS))
    terminal = None
    try:
        terminal, _, _ = _asking(host, [])
        for pid in processes_of(host.state_dir):  # the host and its children, not the chat
            if pid != terminal.proc.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        shown = terminal.until("approval withdrawn", timeout=90)
        assert "approval withdrawn: the host went away" in shown
        assert terminal.exit_code(timeout=30) == 1
        assert "control_plane_unreachable" in terminal.text()
        _clean(terminal.text())
    finally:
        kill_host(host)
        if terminal is not None:
            terminal.close()
