"""The clients' credential: ``DIR/server/client_token``, sent as ``Authorization: Bearer``.

Every client call of the control plane needs it, on loopback too: the agents run shell
commands as the user who runs corral, and a loopback port is open to every local user. The
file is created on the plane's first start (0600, in the 0700 server dir, written to a
temporary file, fsynced and hard-linked into place, so two processes racing on a fresh state
dir agree on one token and a crash never leaves a partial one). :func:`rotate_client_token`
replaces it (temporary file, fsync, rename), and :class:`ClientToken` notices the new file
at the next request: the old token is refused from then on, without a restart.

It is not the runner's tunnel token (``runner_token``): that one is handed to the actors
that talk to the server, and the runner id is derived from it. A client token that could
open the tunnel would let whoever holds it pose as the runner (take its tool calls and
verdicts); a runner token that could act as a client would let a process holding it approve
its own tool calls. So each credential opens only its own routes, and the client one can be
rotated without changing the runner id.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

from ..._exceptions import ConfigError
from ..._jsonlines import create_once, fsync_dir_quietly, private_tmp

__all__ = ["CLIENT_TOKEN_FILE", "ClientToken", "ensure_client_token", "rotate_client_token"]

log = logging.getLogger("corral.server")

#: The file's name in ``DIR/server`` (the CLI reads it there).
CLIENT_TOKEN_FILE = "client_token"


def _new_secret(directory: Path) -> Path:
    """A new token in a temporary file of ``directory`` (0600, fsynced)."""
    return private_tmp(directory, CLIENT_TOKEN_FILE, secrets.token_urlsafe(32).encode() + b"\n")


def ensure_client_token(directory: Path) -> Path:
    """Create ``directory/client_token`` unless it exists; return its path."""
    path = directory / CLIENT_TOKEN_FILE
    if path.exists():
        return path
    create_once(path, secrets.token_urlsafe(32).encode() + b"\n")
    return path


def rotate_client_token(directory: Path) -> str:
    """Replace the client token with a new one (atomically); return the new token."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = _new_secret(directory)
    token = tmp.read_text().strip()
    os.replace(tmp, directory / CLIENT_TOKEN_FILE)
    fsync_dir_quietly(directory)
    return token


class ClientToken:
    """The current client token of ``directory``, read again whenever its file changes.

    Checked on every request, so a rotation takes effect at the next one, which also calls
    ``on_rotate``. A file that is gone is created again (a new token); one that others may
    read is made 0600 again.
    """

    def __init__(self, directory: Path, *, on_rotate: Callable[[], None] | None = None) -> None:
        self.path = directory / CLIENT_TOKEN_FILE
        self._on_rotate = on_rotate
        self._seen: tuple[int, int, int, int] | None = None
        self._token = b""

    def load(self) -> None:
        """Create the file if missing and read it.

        Raises:
            ConfigError: it holds no usable token.
        """
        ensure_client_token(self.path.parent)
        self._current()

    def matches(self, presented: str) -> bool:
        """Whether ``presented`` is the current token (compared in constant time)."""
        try:
            token = self._current()
        except (OSError, ConfigError) as exc:
            # Fail closed: no client is let in while the file cannot be read.
            log.warning("the client token in %s cannot be read: %s", self.path, exc)
            return False
        return hmac.compare_digest(presented.encode(), token)

    def _current(self) -> bytes:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            log.warning("%s is gone; a new client token is made", self.path)
            ensure_client_token(self.path.parent)
            st = os.stat(self.path)
        seen = (st.st_ino, st.st_mtime_ns, st.st_size, st.st_mode)
        if seen != self._seen:
            if stat.S_IMODE(st.st_mode) & 0o077:
                log.warning("%s was readable by others; it is made 0600", self.path)
                os.chmod(self.path, 0o600)
            token = self.path.read_bytes().strip()
            if not token or any(c.isspace() for c in token.decode(errors="replace")):
                raise ConfigError(
                    f"{self.path} holds no usable client token; run `corral token rotate`"
                )
            rotated = bool(self._token) and token != self._token
            self._token, self._seen = token, seen
            if rotated:
                log.info("the client token in %s was replaced; the old one is refused", self.path)
                if self._on_rotate is not None:
                    self._on_rotate()
        return self._token
