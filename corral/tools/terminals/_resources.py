"""A launched terminal as clients see it: a ``session.resource`` (PROTOCOL_FACTS §ii.5)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NotRequired, TypedDict


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


class TerminalMetadata(TypedDict):
    """``metadata`` of a terminal's ``session.resource``."""

    terminal_name: str
    session_key: str
    running: bool
    tmux_socket: str
    tmux_target: str
    terminal_transport: str


class TerminalResource(TypedDict):
    """A terminal's ``session.resource`` object."""

    id: str
    object: Literal["session.resource"]
    type: Literal["terminal"]
    session_id: str
    name: str
    metadata: TerminalMetadata
    environment: str


class ResourceDeleted(TypedDict):
    """The ``session.resource.deleted`` event of a terminal."""

    type: Literal["session.resource.deleted"]
    resource_id: str
    resource_type: Literal["terminal"]
    session_id: str


class Launched(TypedDict):
    """What ``sys_terminal_launch`` answers; ``cwd`` only when it started the command."""

    terminal: str
    session: str
    resource_id: str
    status: Literal["launched", "already_running"]
    cwd: NotRequired[str]


class Screen(TypedDict):
    """What ``sys_terminal_read`` answers."""

    terminal: str
    session: str
    running: bool
    output: str


class ListedSession(TypedDict):
    """A launched session of a terminal in ``sys_terminal_list``."""

    session: str
    running: bool
    resource_id: str


class ListedTerminal(TypedDict):
    """A terminal in ``sys_terminal_list``: declared by the spec, launched, or both."""

    terminal: str
    command: list[str] | None
    declared: bool
    sessions: list[ListedSession]


class Listing(TypedDict):
    """What ``sys_terminal_list`` answers."""

    terminals: list[ListedTerminal]


def resource_view(instance: TerminalInstance) -> TerminalResource:
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


def deleted_event(conversation_id: str, terminal: str, session: str) -> ResourceDeleted:
    """The ``session.resource.deleted`` event of a closed terminal (T-16)."""
    return {
        "type": "session.resource.deleted",
        "resource_id": resource_id(terminal, session),
        "resource_type": "terminal",
        "session_id": conversation_id,
    }
