"""Where a state dir's control plane listens, and the client token it takes.

The embedded control plane writes ``<state dir>/server/server.json`` once it listens; that
file is how every client command finds it, as ``corral status`` finds the host through
``host.json``. Every call carries the plane's client token as ``Authorization: Bearer``:
``CORRAL_TOKEN`` if set, else ``<state dir>/server/client_token`` (0600, the plane's owner
only). A user or machine that cannot read the state dir gives both the URL
(``--url``/``CORRAL_URL``) and ``CORRAL_TOKEN`` (docs/security.md). Apart from the HTTP
client (:mod:`._client`) because ``corral token`` reads the same files and calls nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..actors._process import alive
from ..instance import Instance

#: The client token, for a caller that cannot read the state dir (another user, host).
TOKEN_ENV = "CORRAL_TOKEN"
#: Where to send help about the credential.
SECURITY_DOC = "docs/security.md"


class NoControlPlane(Exception):
    """No control plane is found or reachable through the state dir (exit code 3)."""


class NoCredential(Exception):
    """The client token (or the control plane's address) cannot be read (exit code 1)."""


def server_file(state_dir: Path) -> Path:
    """Where the control plane of a state dir writes its address."""
    return state_dir / "server" / "server.json"


def client_token_file(state_dir: Path) -> Path:
    """Where the control plane of a state dir keeps its client token."""
    return state_dir / "server" / "client_token"


def _unreadable(path: Path) -> NoCredential:
    return NoCredential(
        f"cannot read {path}: permission denied. The host runs as another user: ask its "
        f"operator for the token (`corral token`) and set {TOKEN_ENV} and --url/CORRAL_URL "
        f"({SECURITY_DOC})"
    )


def read_client_token(state_dir: Path) -> str:
    """The client token kept in ``state_dir``.

    Raises:
        NoCredential: the file is missing, unreadable or empty.
    """
    path = client_token_file(state_dir)
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        raise NoCredential(
            f"no client token at {path}: no control plane has run on {state_dir} yet "
            f"(`corral up` makes one), or set {TOKEN_ENV}"
        ) from None
    except PermissionError:
        raise _unreadable(path) from None
    except OSError as exc:
        raise NoCredential(f"cannot read {path}: {exc.strerror}") from None
    if not token:
        raise NoCredential(f"{path} holds no client token; make one with `corral token rotate`")
    return token


def locate(state_dir: Path) -> str | None:
    """The control plane's base URL, or None while the host is (re)starting it.

    Raises:
        NoControlPlane: neither a live control plane nor a live host is on ``state_dir``.
        NoCredential: the state dir is another user's.
    """
    path = server_file(state_dir)
    try:
        info = json.loads(path.read_text())
    except PermissionError:
        raise _unreadable(path) from None
    except (OSError, ValueError):
        info = None
    if isinstance(info, dict) and info.get("url"):
        pid = info.get("pid")
        if not isinstance(pid, int) or alive(pid, None):
            return str(info["url"]).rstrip("/")
    try:
        host = Instance(state_dir).read_host()
    except PermissionError:
        raise _unreadable(Instance(state_dir).host_file) from None
    if host and isinstance(host.get("pid"), int) and alive(host["pid"], host.get("start_time")):
        return None
    raise NoControlPlane(
        f"no running host found on {state_dir}: no corral control plane answers there "
        "(start one with `corral up`)"
    )
