"""The conversation store, built from the runner's events (PROTOCOL_FACTS §ii.6).

Runs inside the store's write transactions (see the ``_store`` package). As the real server does
("Server-side consumption"): ``response.output_text.delta`` texts accumulate in the session's
*draft*, which becomes ONE assistant ``message`` item at the response's terminal event
(``response.completed``, ``failed``, ``cancelled``, ``incomplete``) or before a
``function_call`` with status ``completed``; completed function calls, their outputs and
``session.resource.created/deleted`` become items too. The draft is kept in the session's row,
so text streamed before a restart is not lost from the item written after it.

A turn that ends without a terminal event was interrupted (PROTOCOL_0_19 §E.4: the runner goes
``idle`` and posts a ``[System: interrupted]`` note as an ``external_conversation_item``); its
partial text is never persisted. As the real relay does (§D.3), the draft is cleared at the
next ``session.status running``, not at ``idle``: a terminal event that arrives after the
``idle`` still flushes the text, and a second message mid-turn, which the runner runs as its
own turn (``running`` again with no ``idle`` between), starts from an empty draft.

Every stored event gets the session's next event id (the ``id:`` of the client stream).
Heartbeats are liveness only and are not stored.
"""

from __future__ import annotations

import logging
import sqlite3
import time
import uuid
from typing import Any

import msgspec

from .._jsonlines import JsonObject

__all__ = [
    "ELICITATION_EVENTS",
    "HEARTBEATS",
    "TERMINAL_EVENTS",
    "EventLog",
    "UnknownSession",
    "ancestors",
    "append_runner_events",
    "append_server_events",
    "fence",
    "insert_item",
    "new_id",
]

log = logging.getLogger("corral.server.store")

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.decode

#: Runner events that end a response: the draft becomes an item before them.
TERMINAL_EVENTS = frozenset(
    {"response.completed", "response.failed", "response.cancelled", "response.incomplete"}
)
#: Runner stream events that are liveness only and never stored (§ii.6).
HEARTBEATS = frozenset({"session.heartbeat", "response.heartbeat"})
_STATUSES = frozenset({"idle", "running", "waiting", "failed"})
#: Runner events that pass the interrupt fence (see :func:`fence`).
#: Events a sub-agent's ancestors see too (:func:`mirror_to_ancestors`).
ELICITATION_EVENTS = frozenset({"response.elicitation_request", "response.elicitation_resolved"})
_FENCE_EXEMPT = ELICITATION_EVENTS


class UnknownSession(LookupError):
    """The session id is not in the store."""


def new_id() -> str:
    """A fresh 32-hex id, the shape of the server's ids."""
    return uuid.uuid4().hex


def insert_item(con: sqlite3.Connection, session_id: str, fields: JsonObject) -> JsonObject:
    """Store one item in the flattened shape of §iii.6; returns it."""
    item: JsonObject = {
        "id": new_id(),
        "response_id": fields.get("response_id") or f"turn_{new_id()}",
        "type": fields["type"],
        "status": "completed",
        "created_at": int(time.time()),
    }
    item.update({k: v for k, v in fields.items() if k not in item and v is not None})
    con.execute(
        "INSERT INTO items (id, session_id, type, data) VALUES (?,?,?,?)",
        (item["id"], session_id, item["type"], _encode(item).decode()),
    )
    return item


class EventLog:
    """Appends events of one session inside a transaction, numbering them."""

    def __init__(self, con: sqlite3.Connection, session_id: str) -> None:
        row = con.execute(
            "SELECT last_event_id, draft, status FROM sessions WHERE id = ?", (session_id,)
        ).fetchone()
        if row is None:
            raise UnknownSession(session_id)
        self.con = con
        self.session_id = session_id
        self.seq: int = row[0]
        self.draft: JsonObject | None = _decode(row[1]) if row[1] else None
        self.status: str = row[2]
        self.now = time.time()
        #: The ancestors an elicitation event of this session was mirrored to.
        self.mirrored: list[str] = []

    def emit(self, event: JsonObject, *, mirror: bool = True) -> None:
        """Append one event under the next event id; an elicitation's request or resolution
        is mirrored onto the streams of the session's ancestors too (:func:`mirror`)."""
        self.seq += 1
        self.con.execute(
            "INSERT INTO events (session_id, seq, type, data, created_at) VALUES (?,?,?,?,?)",
            (self.session_id, self.seq, str(event["type"]), _encode(event).decode(), self.now),
        )
        if mirror and event["type"] in ELICITATION_EVENTS:
            self.mirrored.extend(mirror_to_ancestors(self.con, self.session_id, event))

    def item(self, fields: JsonObject) -> JsonObject:
        """Persist one item of this session."""
        return insert_item(self.con, self.session_id, fields)

    def save(self) -> int:
        """Write back the session's last event id, draft and status; returns the id."""
        draft = _encode(self.draft).decode() if self.draft else None
        self.con.execute(
            "UPDATE sessions SET last_event_id = ?, draft = ?, status = ?, updated_at = ? "
            "WHERE id = ?",
            (self.seq, draft, self.status, self.now, self.session_id),
        )
        return self.seq

    # -- the conversation store ------------------------------------------------------------

    def flush_draft(self) -> None:
        """The accumulated assistant text becomes one ``message`` item (and its event)."""
        draft = self.draft
        if not draft or not draft.get("text"):
            return
        item = self.item(
            {
                "type": "message",
                "response_id": draft.get("response_id"),
                "role": "assistant",
                "content": [{"type": "output_text", "text": draft["text"]}],
                "model": draft.get("model"),
            }
        )
        draft["text"] = ""
        # As the real server does (Appendix A): clients get the persisted message before the
        # terminal event, so they can show the final text without joining deltas themselves.
        self.emit({"sequence_number": None, "type": "response.output_item.done", "item": item})

    def runner_event(self, event: JsonObject) -> None:
        """Store one runner event, updating items, draft, status and elicitations."""
        kind = event["type"]
        if kind in ("session.status", "session.terminal_pending"):
            event = {**event, "conversation_id": self.session_id}
        if kind == "session.status":
            status = event.get("status")
            if status in _STATUSES:
                self.status = status
            if status == "running" and self.draft is not None:
                if self.draft.get("text"):
                    # Text left from a turn that ended without a terminal event (an interrupt):
                    # the real relay does not persist it, and keeping it would glue it onto
                    # the next answer.
                    log.info("session %s: dropping %d characters of an interrupted answer",
                             self.session_id, len(self.draft["text"]))  # fmt: skip
                self.draft = None
        elif kind in ("response.created", "response.in_progress"):
            # The response names the item's id and agent; text already streamed stays (the
            # real relay keeps its accumulator here too, and flushes it at the terminal).
            response = v if isinstance(v := event.get("response"), dict) else {}
            text = (self.draft or {}).get("text", "")
            self.draft = {
                "text": text,
                "response_id": response.get("id"),
                "model": response.get("model"),
            }
        elif kind == "response.output_text.delta":
            delta = event.get("delta")
            if isinstance(delta, str) and not event.get("message_id"):
                if self.draft is None:
                    self.draft = {"text": "", "response_id": None, "model": None}
                self.draft["text"] += delta
        elif kind == "response.output_item.done":
            self._output_item(event.get("item"))
        elif kind in TERMINAL_EVENTS:
            self.flush_draft()
        elif kind == "response.elicitation_request":
            self._runner_elicitation(event)
        elif kind == "response.elicitation_resolved":
            eid = event.get("elicitation_id")
            if isinstance(eid, str):
                self.con.execute(
                    "UPDATE elicitations SET state = 'resolved', resolved_at = ? "
                    "WHERE id = ? AND session_id = ? AND state = 'pending'",
                    (self.now, eid, self.session_id),
                )
        elif kind in ("session.resource.created", "session.resource.deleted"):
            resource = v if isinstance(v := event.get("resource"), dict) else {}
            self.item(
                {
                    "type": "resource_event",
                    "response_id": self.session_id,
                    "event_type": kind,
                    "resource_id": resource.get("id"),
                    "resource_type": resource.get("type"),
                    "resource": resource,
                }
            )
        self.emit(event)
        if kind in TERMINAL_EVENTS:
            self.draft = None

    def _output_item(self, item: Any) -> None:
        if not isinstance(item, dict):
            return
        kind = item.get("type")
        response_id = (self.draft or {}).get("response_id")
        # The runner writes ``agent`` on its items; the server stores and reads it back as
        # ``model`` (§E.1). The response's model stands in for a runner that leaves it out.
        agent = item.get("agent")
        model = agent if isinstance(agent, str) and agent else (self.draft or {}).get("model")
        if kind == "message":
            # A whole message supersedes any deltas of it that were accumulated.
            if self.draft:
                self.draft["text"] = ""
            fields = {k: v for k, v in item.items() if k not in ("id", "status", "agent")}
            if fields.get("role", "assistant") == "assistant":
                fields.setdefault("model", model)
            self.item({"role": "assistant", "response_id": response_id, **fields})
        elif kind == "function_call" and item.get("status") == "completed":
            self.flush_draft()
            self.item(
                {
                    "type": "function_call",
                    "response_id": response_id,
                    "model": model,
                    "name": item.get("name"),
                    "arguments": item.get("arguments"),
                    "call_id": item.get("call_id"),
                }
            )
        elif kind == "function_call_output":
            self.item(
                {
                    "type": "function_call_output",
                    "response_id": response_id,
                    "call_id": item.get("call_id"),
                    "output": item.get("output"),
                }
            )

    def _runner_elicitation(self, event: JsonObject) -> None:
        eid = event.get("elicitation_id")
        if not isinstance(eid, str) or not eid:
            return
        params = v if isinstance(v := event.get("params"), dict) else {}
        self.con.execute(
            "INSERT OR IGNORE INTO elicitations (id, session_id, source, params, state, "
            "created_at) VALUES (?,?,?,?,?,?)",
            (eid, self.session_id, "runner", _encode(params).decode(), "pending", self.now),
        )


def ancestors(con: sqlite3.Connection, session_id: str) -> list[str]:
    """The session's parent, its parent's parent, ... up to the root (a loop is cut)."""
    found: list[str] = []
    seen = {session_id}
    current: str | None = session_id
    while current is not None:
        row = con.execute(
            "SELECT parent_session_id FROM sessions WHERE id = ?", (current,)
        ).fetchone()
        current = row[0] if row is not None else None
        if current is None or current in seen:
            break
        seen.add(current)
        found.append(current)
    return found


def mirror_to_ancestors(con: sqlite3.Connection, session_id: str, event: JsonObject) -> list[str]:
    """Append a sub-agent's elicitation event to each ancestor's stream, as the 0.19.1
    server does: a request with ``params.target_session_id`` naming the session that owns
    it (a viewer of the parent answers it there), a resolution as it is. Returns the
    ancestors."""
    found = ancestors(con, session_id)
    if event["type"] == "response.elicitation_request":
        params = v if isinstance(v := event.get("params"), dict) else {}
        event = {**event, "params": {**params, "target_session_id": session_id}}
    for ancestor in found:
        stored = EventLog(con, ancestor)
        stored.emit(event, mirror=False)
        stored.save()
    return found


def fence(events: list[JsonObject]) -> tuple[list[JsonObject], bool]:
    """Drop the trailing output of an interrupted turn, as the real relay does (§D.3).

    Applied to a session's runner events after a client interrupt or stop was delivered:
    ``response.*`` events (but the elicitation ones) are dropped until the next
    ``session.status running`` or a terminal ``response.*`` event, which ends the fence and
    is kept (so the text streamed before the interrupt is still flushed by it). Returns the
    events kept and whether the fence still stands.
    """
    kept: list[JsonObject] = []
    fenced = True
    for event in events:
        kind = event["type"]
        if fenced:
            if (kind == "session.status" and event.get("status") == "running") or (
                kind in TERMINAL_EVENTS
            ):
                fenced = False
            elif kind.startswith("response.") and kind not in _FENCE_EXEMPT:
                continue
        kept.append(event)
    return kept, fenced


def append_runner_events(
    con: sqlite3.Connection,
    session_id: str,
    events: list[JsonObject],
    runner_seq: int | None = None,
) -> list[str]:
    """Store a batch of runner events (heartbeats dropped) and, with ``runner_seq``, the
    runner's seq they reach; returns the sessions given events (this one, and the ancestors
    an elicitation event was mirrored to)."""
    stored = EventLog(con, session_id)
    for event in events:
        if event.get("type") in HEARTBEATS:
            continue
        stored.runner_event(event)
    if runner_seq is not None:
        con.execute(
            "UPDATE sessions SET runner_seq = MAX(runner_seq, ?) WHERE id = ?",
            (runner_seq, session_id),
        )
    stored.save()
    return [session_id, *dict.fromkeys(stored.mirrored)]


def append_server_events(con: sqlite3.Connection, session_id: str, events: list[JsonObject]) -> int:
    """Store events the server publishes itself, as they are; returns the last event id."""
    stored = EventLog(con, session_id)
    for event in events:
        stored.emit(event)
    return stored.save()
