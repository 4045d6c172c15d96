"""The control plane's client token file (``corral/server/_plane/_credential.py``), on disk."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from corral.server._plane._credential import (
    ClientToken,
    ensure_client_token,
    rotate_client_token,
)


def _token(directory: Path) -> str:
    return (directory / "client_token").read_text().strip()


def test_made_once_0600_and_kept(tmp_path: Path) -> None:
    path = ensure_client_token(tmp_path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    first = _token(tmp_path)
    ensure_client_token(tmp_path)
    assert _token(tmp_path) == first and len(first) >= 40
    assert [p.name for p in tmp_path.iterdir()] == ["client_token"], "no temporary file left"


def test_a_rotation_refuses_the_old_token_at_the_next_check_and_says_so(tmp_path: Path) -> None:
    rotations: list[None] = []
    token = ClientToken(tmp_path, on_rotate=lambda: rotations.append(None))
    token.load()
    old = _token(tmp_path)
    assert token.matches(old) and not token.matches(old + "x") and not token.matches("")
    new = rotate_client_token(tmp_path)
    assert new == _token(tmp_path) != old
    assert stat.S_IMODE(os.stat(tmp_path / "client_token").st_mode) == 0o600
    assert not token.matches(old)
    assert token.matches(new)
    assert len(rotations) == 1, "woken once, for the one rotation"


def test_a_file_others_may_read_is_made_0600_again(tmp_path: Path) -> None:
    token = ClientToken(tmp_path)
    token.load()
    path = tmp_path / "client_token"
    path.chmod(0o644)
    assert token.matches(_token(tmp_path))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_a_deleted_file_is_made_again_and_an_unusable_one_lets_no_client_in(
    tmp_path: Path,
) -> None:
    token = ClientToken(tmp_path)
    token.load()
    old = _token(tmp_path)
    (tmp_path / "client_token").unlink()
    assert not token.matches(old)
    assert token.matches(_token(tmp_path))
    (tmp_path / "client_token").write_text("\n")
    assert not token.matches(""), "fail closed"
