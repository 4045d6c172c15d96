"""``.ci/find-python``: the interpreter ``make`` builds corral's venv with and the one the
omnigent venv is built with, chosen by running each candidate. Stub interpreters on a PATH of
their own stand for the machine's: each answers the probe as its version would."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

FIND = Path(__file__).resolve().parents[2] / ".ci" / "find-python"


#: Interpreters the script probes by absolute path, which no PATH can hide from it.
_SYSTEM = [Path(d) / f"python3.{m}" for d in ("/usr/bin", "/usr/local/bin") for m in (12, 13)]


def _stub(bin_dir: Path, name: str, minor: int | None) -> None:
    """An executable ``name`` that answers the probe (``-c "...(3, MIN) <= ... <= (3, MAX)..."``)
    as Python 3.``minor`` would, or fails as a broken pyenv shim does (``minor`` None)."""
    script = bin_dir / name
    if minor is None:
        script.write_text("#!/bin/sh\necho 'pyenv: command not found' >&2\nexit 127\n")
    else:
        script.write_text(
            "#!/bin/sh\n"
            "low=${2#*(3, }\n"
            "low=${low%%)*}\n"
            "high=${2##*(3, }\n"
            "high=${high%%)*}\n"
            f'[ {minor} -ge "$low" ] && [ {minor} -le "$high" ]\n'
        )
    script.chmod(0o755)


def _find(bin_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": str(bin_dir), "HOME": str(bin_dir)}
    return subprocess.run(
        ["/bin/bash", str(FIND), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    if any(path.exists() for path in _SYSTEM):
        pytest.skip("this machine has a system Python >= 3.12, which the stubs cannot hide")
    path = tmp_path / "bin"
    path.mkdir()
    return path


def test_it_prefers_3_12_to_newer_and_older_interpreters(bin_dir: Path) -> None:
    _stub(bin_dir, "python3.13", 13)
    _stub(bin_dir, "python3.12", 12)
    _stub(bin_dir, "python3.11", 11)
    out = _find(bin_dir)
    assert (out.returncode, out.stdout.strip()) == (0, "python3.12"), out.stderr


def test_a_broken_shim_is_passed_over_for_the_next_that_runs(bin_dir: Path) -> None:
    _stub(bin_dir, "python3.12", None)
    _stub(bin_dir, "python3.13", 13)
    _stub(bin_dir, "python3.11", 11)
    assert _find(bin_dir).stdout.strip() == "python3.13"
    assert _find(bin_dir, "12").stdout.strip() == "python3.13"


def test_below_the_minimum_it_finds_nothing_and_exits_3(bin_dir: Path) -> None:
    _stub(bin_dir, "python3.11", 11)
    assert _find(bin_dir).stdout.strip() == "python3.11"
    out = _find(bin_dir, "12")
    assert out.returncode == 3
    assert out.stdout == ""
    assert "no Python >= 3.12" in out.stderr


def test_a_maximum_keeps_newer_interpreters_out(bin_dir: Path) -> None:
    _stub(bin_dir, "python3.12", 12)
    _stub(bin_dir, "python3.11", 11)
    assert _find(bin_dir, "11", "11").stdout.strip() == "python3.11"
    (bin_dir / "python3.12").unlink()
    _stub(bin_dir, "python3.13", 13)
    _stub(bin_dir, "python3", 13)
    out = _find(bin_dir, "12", "12")
    assert out.returncode == 3
    assert "no Python 3.12 to 3.12" in out.stderr


def test_what_it_finds_here_runs_and_is_recent_enough() -> None:
    out = subprocess.run(
        [str(FIND)], capture_output=True, text=True, timeout=60, check=False, env=os.environ
    )
    assert out.returncode == 0, out.stderr
    version = subprocess.run(
        [out.stdout.strip(), "-c", "import sys; print(sys.version_info[:2] >= (3, 11))"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert version.stdout.strip() == "True"
