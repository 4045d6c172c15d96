"""The store's records (a session, an elicitation, an outbox entry) and its two refusals."""

from __future__ import annotations

from typing import Any, Literal, TypedDict

import msgspec

from ..._jsonlines import JsonObject


class UnknownCursor(LookupError):
    """An items ``after`` cursor names no item of the session."""


class NotPending(Exception):
    """The elicitation exists but was already resolved (``state`` says how)."""

    def __init__(self, state: str) -> None:
        super().__init__(f"the elicitation is {state}")
        self.state = state


class SessionRow(msgspec.Struct, kw_only=True):
    """One row of ``sessions``."""

    id: str
    agent: str
    agent_id: str
    agent_yaml: str
    runner_id: str | None
    status: str = "idle"
    title: str | None = None
    labels: JsonObject = {}
    created_at: float = 0.0
    updated_at: float = 0.0
    last_event_id: int = 0
    #: A child session's parent (``sys_session_create``, ``sys_session_send``); None for a
    #: top-level session.
    parent_session_id: str | None = None
    #: The top of a child's spawn tree; None for a top-level session (its own root).
    root_session_id: str | None = None
    #: The sub-agent of the parent's bundle a ``sys_session_send`` child runs (§J).
    sub_agent_name: str | None = None


class ItemsPage(TypedDict):
    """A page of a session's stored items, in the list shape of §iii.6."""

    object: Literal["list"]
    #: The items as stored: each in the server's flattened shape, whatever its type.
    data: list[JsonObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


class PendingElicitation(TypedDict):
    """An entry of a snapshot's ``pending_elicitations``."""

    id: str
    elicitation_id: str
    params: JsonObject
    message: Any
    source: str
    created_at: int


class ElicitationRow(msgspec.Struct, kw_only=True):
    """One row of ``elicitations``: ``source`` is ``runner`` (seen on its stream) or ``policy``
    (asked by this server's ``/mcp``); ``state`` is ``pending``, ``resolved`` or ``consumed``
    (a policy elicitation whose approved call ran)."""

    id: str
    session_id: str
    source: str
    params: JsonObject
    tool: str | None
    arguments: Any
    state: str
    action: str | None
    content: Any
    created_at: float

    def public(self) -> PendingElicitation:
        """The entry of a snapshot's ``pending_elicitations``."""
        params = self.params
        return {
            "id": self.id,
            "elicitation_id": self.id,
            "params": params,
            "message": params.get("message") if isinstance(params, dict) else None,
            "source": self.source,
            "created_at": int(self.created_at),
        }


class OutboxEntry(msgspec.Struct, kw_only=True):
    """A pending forward to the runner: ``kind`` ``message`` or ``approval``, its JSON body."""

    id: int
    session_id: str
    kind: str
    body: bytes
    attempts: int
