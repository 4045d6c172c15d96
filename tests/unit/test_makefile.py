"""The Makefile's recipes, read with ``make -n`` (nothing runs): ``make run`` installs corral
without the dev extra, the test and lint targets with it; and the LICENSE file."""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make here")


def _recipe(target: str, venv: Path) -> list[str]:
    # Not as a sub-make of `make test` (MAKELEVEL, MAKEFLAGS), which adds "Entering
    # directory" lines to what it prints.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    out = subprocess.run(
        ["make", "--no-print-directory", "-n", target, f"VENV={venv}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_make_run_installs_without_the_dev_extra(tmp_path: Path) -> None:
    lines = _recipe("run", tmp_path / "venv")
    installs = [line for line in lines if "pip install" in line and "-e" in line]
    assert installs == [f"{tmp_path / 'venv'}/bin/python -m pip install --quiet -e ."]
    assert lines[-1].startswith(f"{tmp_path / 'venv'}/bin/corral up")


@pytest.mark.parametrize("target", ["test", "test-fast", "lint"])
def test_the_test_targets_install_the_dev_extra(tmp_path: Path, target: str) -> None:
    lines = _recipe(target, tmp_path / "venv")
    assert f"{tmp_path / 'venv'}/bin/python -m pip install --quiet -e '.[dev]'" in lines


def test_the_license_file_is_the_license_pyproject_names() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["license"] == "MIT"
    assert (REPO / "LICENSE").read_text().startswith("MIT License\n")
