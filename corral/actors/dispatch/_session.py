"""A session as dispatch holds it: the durable `SessionRecord` and the live `Session`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec

from ..._jsonlines import JsonObject
from ._turn import Phase

if TYPE_CHECKING:
    from ._turn import Turn

#: Message keys a session remembers (its newest): a redelivery or a re-POST is of the last
#: message or the last few (the server and the control plane forward a session's messages in
#: order), and every save writes them all (about 90 bytes each).
ACCEPTED_KEPT = 16


class Accepted(msgspec.Struct, array_like=True):
    """A message the session took: its idempotency key, the answer it got (``accepted``: it
    started a turn; ``buffered``: it runs as the next one) and the turn it is (once known)."""

    key: str
    status: str
    turn_id: str | None = None


class PendingEvent(msgspec.Struct, kw_only=True):
    """An event numbered and saved before it is sent (a turn's ``running``, its terminal
    ``response.*`` and its terminal edge): published again, with its own ``seq``, by an
    incarnation that finds it in the record — the gateway drops a ``seq`` it has seen."""

    seq: int
    event: JsonObject
    run_id: str | None = None
    #: The run's last journal event (its durable append).
    terminal: bool = False
    #: It goes to the subscribers (an interrupted turn's cancelled does not, §E.4).
    upstream: bool = True


class SessionRecord(msgspec.Struct, kw_only=True):
    """What survives a dispatch restart (one line of ``sessions.log``)."""

    id: str
    agent_id: str | None = None
    #: The runner id it was bound through, fixed by the first request that carried one: a
    #: request through any other id of this host finds no such session.
    runner_id: str | None = None
    sub_agent_name: str | None = None
    harness_override: str | None = None
    model_override: str | None = None
    created_at: float = 0.0
    turn_id: str | None = None
    #: Wall-clock start of the active turn, and the (reply_to, request_id) of its
    #: ``?stream=true`` POST, if any.
    turn_started_at: float = 0.0
    stream_to: list[str] | None = None
    #: The active turn's stream numbering (``_turn.worker_seq``): the seq of its ``running``.
    turn_base: int = 0
    #: Ids of the active turn's tool calls sent to policy (written before each is sent), and
    #: of those whose outcome went to the worker (written after): what the turn has in flight
    #: after a restart (``Turn.resume``). One write per call and per outcome; none per delta.
    tool_calls: list[str] = []
    answered: list[str] = []
    #: Elicitations the active turn's harness opened and no verdict has closed: the turn
    #: waits on a human. Written when each opens and closes (rare; none per delta).
    elicitations: list[str] = []
    #: The active turn was asked to stop (``Turn.interrupted``); written when asked.
    interrupted: bool = False
    #: The ``cancel_…`` response id of an interrupt note not yet posted to the server: posted
    #: again after a restart, and added to a history rehydrated before it was posted.
    note_pending: str | None = None
    buffer: list[JsonObject] = []
    #: The idempotency keys of the messages it took, newest last (at most ``ACCEPTED_KEPT``):
    #: a message whose key is here is the turn it already is, never run again.
    accepted: list[Accepted] = []
    #: The messages of the active turn until its ``TurnStart`` is with the broker: a crash in
    #: between leaves them here, and the next incarnation sends the start again.
    starting: list[JsonObject] | None = None
    #: Events saved and not yet known to be with every receiver (:class:`PendingEvent`).
    outbox: list[PendingEvent] = []
    seq: int = 0
    status: str = "idle"
    #: From the session-init v2 envelope (PROTOCOL_0_19.md §B.1), kept as the server sent
    #: them. corral takes provider settings from the agent spec only, so ``inference_config``
    #: is stored, warned about, and never claimed verified.
    recovery_id: str | None = None
    resume_interrupted_turn: bool = False
    inference_config: JsonObject | None = None
    #: A tombstone: the session was deleted (``DELETE /v1/sessions/{id}``); it is forgotten
    #: when the log is read, so a restart cannot bring it back.
    deleted: bool = False

    def reachable_by(self, runner_id: str | None) -> bool:
        """Whether a request through ``runner_id`` may reach the session: one bound through
        that id, or through none yet (the first request with an id binds it), or a request
        from inside the host (no id)."""
        return runner_id is None or self.runner_id in (None, runner_id)

    def begin_turn(
        self, turn_id: str, stream_to: list[str] | None, messages: list[JsonObject]
    ) -> None:
        """Record a turn of ``messages`` that starts now (``stream_to``: its ``?stream=true``
        caller); the buffered messages it takes are its turn now."""
        self.turn_id, self.turn_started_at, self.stream_to = turn_id, time.time(), stream_to
        self.starting = messages
        for entry in self.accepted:
            if entry.turn_id is None:
                entry.turn_id = turn_id

    def accepted_as(self, key: str) -> Accepted | None:
        """How the message of idempotency key ``key`` was taken, if it was."""
        return next((a for a in reversed(self.accepted) if a.key == key), None)

    def accept(self, key: str, status: str) -> None:
        """Remember that the message of ``key`` was taken (``accepted`` or ``buffered``)."""
        self.accepted.append(Accepted(key=key, status=status))
        del self.accepted[:-ACCEPTED_KEPT]

    def end_turn(self) -> None:
        """Forget everything of the active turn."""
        self.turn_id, self.turn_started_at, self.stream_to = None, 0.0, None
        self.turn_base = 0
        self.starting = None
        self.tool_calls, self.answered, self.elicitations = [], [], []
        self.interrupted = False


@dataclass
class Session:
    """A session as dispatch holds it."""

    record: SessionRecord
    spec: JsonObject | None = None
    history: list[JsonObject] | None = None
    turn: Turn | None = None
    #: The ``inference_config`` warning was logged (once per session and incarnation).
    warned_inference: bool = False
    #: Last looked up or saved (``time.monotonic``): an idle session unused for
    #: ``session_idle_s`` is reclaimed from memory.
    used: float = field(default_factory=time.monotonic)
    #: The stream sequence ``sessions.log`` holds for it (events published since numbered
    #: past it): a session reclaimed with ``record.seq`` past it is saved first.
    saved_seq: int = -1

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def phase(self) -> Phase:
        """Where its turn stands (:mod:`._turn`)."""
        return Phase.IDLE if self.turn is None else self.turn.phase
