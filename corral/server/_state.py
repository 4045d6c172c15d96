"""The control plane's files in ``DIR/server/``: the runner token, ``server.json``, the port.

``runner_token`` is created once (0600) and never changes, so the runner id derived from it
(PROTOCOL_FACTS §i.1) is stable for the life of the state dir. ``server.json`` is what other
processes read to find the server; it is written atomically (temporary file, fsync, rename)
once the server listens, so a reader sees either the previous file or the whole new one.

The port is chosen so that a restarted server keeps its URL: the runner's tunnel reconnects to
the address it already knows, and clients' saved URLs stay valid.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import secrets
import socket
from pathlib import Path

import msgspec

from .._exceptions import ConfigError, CorralError
from .._jsonlines import JsonObject, create_once, fsync_dir_quietly
from ..server_client import runner_id_for_token

__all__ = [
    "ServerInfo",
    "StateDirBusy",
    "choose_port",
    "ensure_runner_token",
    "lock_server_dir",
    "read_server_json",
    "server_dir",
]

log = logging.getLogger("corral.server")


class ServerInfo(msgspec.Struct, frozen=True, kw_only=True):
    """The content of ``server.json``: how to reach this control plane and who may connect."""

    url: str
    port: int
    pid: int
    runner_token: str
    runner_id: str
    started_at: float


class StateDirBusy(CorralError):
    """Another control plane is running on the same state dir."""


def lock_server_dir(directory: Path) -> int:
    """Take ``server.lock`` for this process; returns the fd that holds it (close to release).

    Two servers on one database would both relay and both rewrite ``server.json``; the lock
    makes the second one refuse to start instead. The kernel drops it when the process dies,
    however it dies, so a crash never leaves a stale lock.

    Raises:
        StateDirBusy: another process holds it.
    """
    fd = os.open(directory / "server.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise StateDirBusy(
            f"another control plane (pid {holder}) is running on {directory}"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def server_dir(state_dir: Path) -> Path:
    """``DIR/server``, created (0700) if missing."""
    path = state_dir / "server"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    # The directory holds the runner token and the conversations: owner only, even when it
    # was created earlier with a looser umask.
    path.chmod(0o700)
    return path


def ensure_runner_token(directory: Path) -> tuple[str, str]:
    """The runner token (created on first use) and the runner id derived from it.

    A new token is written to a temporary file, fsynced, then hard-linked into place, which
    fails if the file already exists: two processes racing on a fresh state dir agree on one
    token, and a crash never leaves an empty or partial one.

    Raises:
        ConfigError: the file exists but holds no usable token.
    """
    path = directory / "runner_token"
    if not path.exists():
        create_once(path, secrets.token_urlsafe(32).encode() + b"\n")
    token = path.read_text().strip()
    if not token or any(c.isspace() for c in token):
        raise ConfigError(f"{path} holds no usable runner token; remove it to make a new one")
    return token, runner_id_for_token(token)


def read_server_json(directory: Path) -> JsonObject | None:
    """The last ``server.json`` written here, or None when absent or unreadable."""
    try:
        data = json.loads((directory / "server.json").read_text())
    except (FileNotFoundError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_server_json(directory: Path, info: ServerInfo) -> Path:
    """Write ``server.json`` atomically (0600): temporary file, fsync, rename, fsync the dir."""
    path = directory / "server.json"
    tmp = directory / f".server.json.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, msgspec.json.format(msgspec.json.encode(info), indent=1) + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir_quietly(directory)
    return path


def choose_port(host: str, configured: int, directory: Path) -> int:
    """The port to listen on: the configured one, else the previous run's, else 0 (any).

    The previous port (from ``server.json``) is only reused when it can be bound right now;
    a configured port that cannot be bound is an error, since the user asked for it.

    Raises:
        ConfigError: ``configured`` is non-zero and cannot be bound.
    """
    if configured:
        error = _bind_error(host, configured)
        if error is not None:
            raise ConfigError(
                f"cannot listen on {host}:{configured}: {error}", key="server.port"
            ) from None
        return configured
    previous = (read_server_json(directory) or {}).get("port")
    if isinstance(previous, int) and 0 < previous < 65536:
        error = _bind_error(host, previous)
        if error is None:
            return previous
        log.warning("the previous port %d is taken (%s); picking a new one", previous, error)
    return 0


def _bind_error(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be bound now (None when it can).

    SO_REUSEADDR matches what the HTTP server sets, so a port left in TIME_WAIT by the previous
    run counts as free, exactly as it will be for the real listener.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        return str(exc)
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            return os.strerror(exc.errno) if exc.errno else str(exc)
    return None
