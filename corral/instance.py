"""Where a host keeps its state, and how other commands find a running host.

Layout under the state dir (versioned by ``host.json``'s ``layout``)::

    host.json          the running host: pid, start time, version, endpoints (removed on stop)
    control.sock       the CLI's control socket (0600)
    bus/mailbox.log    the broker's durable mailbox log
    run/children/      pid files of child processes, for the start-up sweep
    actors/<name>/     each actor's own durable files
    journal/           the run journal: <session_id>/<run_id>.jsonl (docs/journal.md)

Unix socket paths are limited to 107 bytes; when the state dir is too deep for that, the
sockets live in a short directory under ``/tmp`` named after a hash of the state dir.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LAYOUT = 1
_SOCKET_PATH_MAX = 100


@dataclass(frozen=True, slots=True)
class Instance:
    """The paths of one state dir."""

    state_dir: Path

    @property
    def host_file(self) -> Path:
        return self.state_dir / "host.json"

    @property
    def socket_dir(self) -> Path:
        """The state dir, or a short stand-in when socket paths would be too long."""
        if len(str(self.state_dir / "control.sock")) <= _SOCKET_PATH_MAX:
            return self.state_dir
        digest = hashlib.sha256(str(self.state_dir).encode()).hexdigest()[:16]
        return Path("/tmp") / f"corral-{os.getuid()}" / digest

    @property
    def control_path(self) -> Path:
        return self.socket_dir / "control.sock"

    @property
    def bus_endpoint(self) -> str:
        return f"ipc://{self.socket_dir / 'bus.sock'}"

    @property
    def mailbox_log(self) -> Path:
        return self.state_dir / "bus" / "mailbox.log"

    @property
    def children_dir(self) -> Path:
        return self.state_dir / "run" / "children"

    @property
    def journal_dir(self) -> Path:
        """The run journal's root (``RunJournal(journal_dir)``), shared by actor and CLI."""
        return self.state_dir / "journal"

    def actor_dir(self, name: str) -> Path:
        """An actor's own durable directory."""
        return self.state_dir / "actors" / name.replace("/", "__")

    def read_host(self) -> dict[str, Any] | None:
        """The running host's record, or None."""
        try:
            return json.loads(self.host_file.read_text())
        except (FileNotFoundError, ValueError):
            return None

    def prepare(self) -> None:
        """Create the directories (0700: they hold sockets and message logs)."""
        for d in (self.state_dir, self.socket_dir, self.children_dir, self.mailbox_log.parent):
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
