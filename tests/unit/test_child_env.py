"""What a child sees of its host (corral._child_env): hidden variables, the host's blanked
environ block, the sandbox a spec asks for, and the bwrap command line (#16)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import corral
from corral._child_env import (
    HIDDEN_ENV,
    Sandbox,
    SandboxRefused,
    hide,
    sandbox_of,
    sandbox_refusal,
    spec_variables,
    split_hidden,
)
from corral.actors._process import spawn
from corral.harnesses.spawn_env import SpawnEnvError, build_spawn_env
from corral.tools.sandbox import wrap

_READ_BACK = (
    "import glob, os; from corral._child_env import take_hidden_env; "
    "block = open('/proc/self/environ', 'rb').read(); take_hidden_env(); "
    "fds = [os.readlink(p) for p in glob.glob('/proc/self/fd/*') if os.path.lexists(p)]; "
    "print(repr((os.environ.get('SECRET'), b'sk-hidden' in block, "
    "any('corral-hidden-env' in f for f in fds))))"
)


def test_spawn_hands_hidden_variables_over_outside_the_environ_block(tmp_path: Path) -> None:
    env = hide({"PATH": os.environ["PATH"], "PYTHONPATH": os.getcwd()}, {"SECRET": "sk-hidden"})
    assert split_hidden(env) == (
        {"PATH": os.environ["PATH"], "PYTHONPATH": os.getcwd()},
        {"SECRET": "sk-hidden"},
    )
    seen = tmp_path / "seen"
    code = _READ_BACK.replace("print(", f"open({str(seen)!r}, 'w').write(")
    assert spawn([sys.executable, "-c", code], env=env).wait(30) == 0
    # The value arrived; the block never held it; the memfd was closed once read.
    assert seen.read_text() == repr(("sk-hidden", False, False))


def test_the_host_blanks_its_own_environ_block() -> None:
    code = (
        "import os; from corral._child_env import blank_environ_block; "
        "blanked = blank_environ_block({'PATH', 'PYTHONPATH'}); "
        "block = open('/proc/self/environ', 'rb').read(); "
        "print(repr((sorted(blanked), b'sk-host' in block, b'PATH=' in block, "
        "os.environ['OPENAI_API_KEY'])))"
    )
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": os.getcwd(), "OPENAI_API_KEY": "sk-host"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == repr((["OPENAI_API_KEY"], False, True, "sk-host"))


def test_a_child_of_a_zygote_without_room_shows_the_entries_that_fit_and_no_more() -> None:
    """A zygote forked from the host has the host's environ block, no reserve: a child whose
    environment is larger shows its first entries that fit, whole, then NULs; the rest is in
    its ``os.environ`` only (``show_environ``, #20)."""
    code = (
        "import os; from corral._zygote._template import show_environ; "
        "show_environ({'A': '1', 'B': 'x' * 40, 'C': 'y' * 5000}); "
        "print(repr(open('/proc/self/environ', 'rb').read().rstrip(b'\\0')))"
    )
    env = {"PYTHONPATH": os.getcwd(), "PAD": "z" * 200}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == repr(b"A=1\0B=" + b"x" * 40)


def test_spec_variables_are_never_corrals_own() -> None:
    host = {"PATH": "/bin", "OPENAI_API_KEY": "k", "CORRAL_RUNNER_TOKEN": "t", "AWS_X": "a"}
    assert spec_variables(host) == {"OPENAI_API_KEY": "k", "AWS_X": "a"}
    spec = {"executor": {"auth": {"api_key": "$CORRAL_RUNNER_TOKEN"}}}
    with pytest.raises(SpawnEnvError, match=r"needs \$CORRAL_RUNNER_TOKEN"):
        build_spawn_env("scripted", spec, host_env=host)


def test_a_workers_key_is_handed_over_hidden() -> None:
    spec = {"executor": {"auth": {"api_key": "$OPENAI_API_KEY"}}}
    env = build_spawn_env("openai", spec, host_env={"PATH": "/bin", "OPENAI_API_KEY": "sk-k"})
    shown, hidden = split_hidden(env)
    assert hidden == {"HARNESS_OPENAI_API_KEY": "sk-k"} and HIDDEN_ENV not in shown


@pytest.mark.parametrize(
    ("sandbox", "expected"),
    [
        (None, None),
        ("none", None),
        ({"type": "none", "allow_network": True}, None),
        ({"type": "linux_bwrap"}, Sandbox()),
        ("bwrap", Sandbox()),
        (
            {"type": "os_sandbox", "allow_network": True, "write_paths": ["."]},
            Sandbox(allow_network=True, write_paths=(".",)),
        ),
    ],
)
def test_the_sandbox_a_spec_asks_for(sandbox: object, expected: Sandbox | None) -> None:
    assert sandbox_of({"sandbox": sandbox}) == expected


@pytest.mark.parametrize(
    ("sandbox", "fragment"),
    [
        ({"type": "darwin_seatbelt"}, "'darwin_seatbelt' is not supported"),
        ({"type": "bwrap", "egress_rules": ["GET x/**"]}, "egress_rules cannot be enforced"),
        ({"type": "bwrap", "read_paths": "/etc"}, "read_paths must be a list"),
    ],
)
def test_a_sandbox_that_cannot_be_enforced_is_refused(sandbox: object, fragment: str) -> None:
    with pytest.raises(SandboxRefused, match=fragment):
        sandbox_of({"sandbox": sandbox})
    assert fragment in (sandbox_refusal({"sandbox": sandbox}) or "")


def test_no_bwrap_on_path_is_a_refusal_and_a_failed_turn_set_up(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    os_env = {"sandbox": {"type": "linux_bwrap"}}
    assert "needs bubblewrap" in (sandbox_refusal(os_env) or "")
    assert sandbox_refusal({"sandbox": "none"}) is None
    with pytest.raises(SpawnEnvError, match="needs bubblewrap"):
        build_spawn_env("scripted", {"os_env": os_env}, host_env={})


def test_the_bwrap_command_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bwrap = tmp_path / "bwrap"
    bwrap.write_text("")
    bwrap.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    cwd = Path("/work/ws")
    argv = wrap(
        ["/bin/bash", "-c", "ls"],
        Sandbox(write_paths=("out",), read_paths=("/data",)),
        cwd=cwd,
        env={"HOME": "/home/me"},
    )
    assert argv[:5] == [str(bwrap), "--die-with-parent", "--unshare-all", "--cap-drop", "ALL"]
    assert "--share-net" not in argv
    pairs = [tuple(argv[i : i + 3]) for i in range(len(argv) - 2)]
    assert argv[argv.index("/home/me") - 1] == "--tmpfs"
    assert ("--ro-bind-try", "/data", "/data") in pairs
    assert ("--bind", "/work/ws", "/work/ws") in pairs
    assert ("--bind-try", "/work/ws/out", "/work/ws/out") in pairs
    assert argv[-6:] == ["TMPDIR", "/tmp", "--", "/bin/bash", "-c", "ls"]
    # The home is the workspace's own when it lies in it; the network when the spec says so.
    inside = wrap(["true"], Sandbox(allow_network=True), cwd=cwd, env={"HOME": "/work/ws/h"})
    assert "/work/ws/h" not in inside and "--share-net" in inside


_AS_NOBODY = [
    "setpriv",
    "--reuid=65534",
    "--regid=65534",
    "--clear-groups",
    "env",
    f"PYTHONPATH={Path(corral.__file__).parent.parent}",
    "SECRET=sk-dump",
    "/usr/bin/python3",
    "-c",
]


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None or not os.path.exists("/usr/bin/python3"),
    reason="needs root (to run two processes as another user), setpriv and /usr/bin/python3",
)
@pytest.mark.parametrize("sealed", [False, True])
def test_a_non_dumpable_process_hides_its_environ_from_its_own_user(sealed: bool) -> None:
    """What the host does for itself: another process of its user cannot read it."""
    seal = "c.non_dumpable(); " if sealed else ""
    code = f"import sys, corral._child_env as c; {seal}print('ready', flush=True); sys.stdin.read()"
    holder = subprocess.Popen(
        [*_AS_NOBODY, code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
        read = f"print(open('/proc/{holder.pid}/environ', 'rb').read().count(b'sk-dump'))"
        reader = subprocess.run([*_AS_NOBODY, read], capture_output=True, text=True, timeout=30)
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(30)
    if sealed:
        assert reader.returncode != 0 and "Permission denied" in reader.stderr
    else:
        assert reader.stdout == "1\n"
