"""A launched terminal as clients see it: a ``session.resource`` (PROTOCOL_FACTS §ii.5)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


def resource_id(terminal: str, session: str) -> str:
    """The session-resource id of a terminal: ``terminal_<terminal>_<session>``."""
    return f"terminal_{terminal}_{session}"


@dataclass(frozen=True, slots=True)
class TerminalInstance:
    """A launched terminal as tmux reports it now (the result of one lookup)."""

    conversation_id: str
    terminal: str
    session: str
    socket_path: Path
    tmux_target: str
    #: Whether its command is still running (False once it exited; the screen stays).
    running: bool
    #: The effective web-attach transport (the spec's, else the manager's default).
    transport: str


def resource_view(instance: TerminalInstance) -> dict[str, Any]:
    """The ``session.resource`` object of a terminal, as REST lists and events carry it."""
    t, s = instance.terminal, instance.session
    return {
        "id": resource_id(t, s),
        "object": "session.resource",
        "type": "terminal",
        "session_id": instance.conversation_id,
        "name": f"{t}:{s}",
        "metadata": {
            "terminal_name": t,
            "session_key": s,
            "running": instance.running,
            "tmux_socket": str(instance.socket_path),
            "tmux_target": instance.tmux_target,
            "terminal_transport": instance.transport,
        },
        "environment": f"env_terminal_{t}_{s}",
    }


def deleted_event(conversation_id: str, terminal: str, session: str) -> dict[str, Any]:
    """The ``session.resource.deleted`` event of a closed terminal (T-16)."""
    return {
        "type": "session.resource.deleted",
        "resource_id": resource_id(terminal, session),
        "resource_type": "terminal",
        "session_id": conversation_id,
    }
