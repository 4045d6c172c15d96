"""README.md cannot rot: every ``corral`` command in its ``sh`` blocks runs, as written,
against a real host started as the README says (``corral up`` on a fresh state dir, no
config); a command that needs a model, a terminal or another server, or that runs a
benchmark of its own, has its ``--help`` checked instead (its words, its flags)."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import corral, plain_up

REPO = Path(__file__).parents[2]


def readme_commands() -> list[str]:
    """The ``corral ...`` lines of README.md's ``sh`` blocks, comments cut off."""
    text = (REPO / "README.md").read_text()
    lines = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.splitlines():
            command = line.split("  #")[0].strip()
            if "corral " in command and not command.startswith(("make", ".venv", "export")):
                lines.append(command)
    return lines


def _help_only(argv: list[str]) -> bool:
    """Whether only ``--help`` is checked: interactive, a model, another server, a bench."""
    verb = argv[1]
    return verb in ("chat", "up", "bench") or any(a in ("...", "[--runner-id") for a in argv)


@pytest.fixture(scope="module")
def readme_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``corral up`` as the README runs it: no --config (the state dir's fresh one)."""
    state = tmp_path_factory.mktemp("readme") / "state"
    with plain_up(state):
        yield state


def test_the_readme_shows_commands_to_check() -> None:
    commands = readme_commands()
    assert len(commands) >= 15, commands
    assert any(c.startswith("corral logs") for c in commands)


@pytest.mark.parametrize("command", readme_commands())
def test_each_readme_command_runs_as_written(readme_host: Path, command: str) -> None:
    argv = shlex.split(command.replace("CORRAL_RUNNER_TOKEN=... ", ""))
    assert argv[0] == "corral", command
    if _help_only(argv):
        out = corral(*argv[1:3] if argv[1] == "bench" else argv[1:2], "--help")
        assert out.returncode == 0, out
        assert f"corral {argv[1]} " in out.stdout.splitlines()[0]
        for flag in (a.split("=")[0] for a in argv if a.startswith("--") and a != "--help"):
            assert flag.strip("[]") in out.stdout, (command, flag)
        return
    out = corral(*argv[1:], "--state-dir", str(readme_host), timeout=120)
    # send's documented exit is 0/1 (the fresh config asks before the demo's shell command,
    # and send declines it unless told --approve); everything else succeeds.
    allowed = (0, 1) if argv[1] == "send" else (0,)
    assert out.returncode in allowed, (command, out)
    if "--json" in argv:
        json.loads(out.stdout)
    else:
        assert out.stdout.strip(), (command, out)
