"""The state every part of the dispatch actor shares, and the helpers they all use.

:class:`~._actor.DispatchActor` is built as a chain of parts, each a class in a module of
its own, each adding one job to the one below it::

    DispatchBase   (_base)    the sessions, the store, the fan-out; saving, the peers
    TurnSetup      (_start)   a turn's spec, history and worker message
    TurnFlow       (_turns)   the life of a turn
    ToolCalls      (_calls)   tool calls through policy and back
    StreamOrder    (_stream)  a turn's worker events in order, sent again after a restart
    SessionRoutes  (_http)    the session routes
    SubagentWork   (_work)    sub-agent work entries and their results' delivery
    DispatchActor  (_actor)   lifecycle, the message handlers, the watchdog

A part calls only what is below it in the chain, so each reads (and type-checks) alone.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from ..._jsonlines import JsonObject
from ...bus import Request
from ...harnesses.protocol import HARNESS_ACTOR, InputAccepted, Output
from ...server_client import ServerClient, pick_server
from .._actor import Actor, ActorContext
from .._crash import crash_point
from .._tally import Tally
from ..policy.messages import PolicyEvaluate, ToolCall, TurnEnded
from ._fanout import Fanout
from ._options import DispatchOptions
from ._session import PendingEvent, Session, SessionRecord
from ._store import EPOCH_SHIFT, SessionStore
from ._subagents import WorkRegistry, turn_result

if TYPE_CHECKING:
    from ._turn import Turn

log = logging.getLogger("corral.actors.dispatch")


class DispatchBase(Actor):
    """The sessions of this host and what every part of dispatch does with them."""

    def __init__(self, ctx: ActorContext, peer: Any) -> None:
        super().__init__(ctx, peer)
        self.options = msgspec.convert(ctx.options, DispatchOptions)
        self.sessions: dict[str, Session] = {}
        self.store = SessionStore(ctx.data_dir)
        #: The sub-agent work registry (``subagents.log``), and the entries being delivered.
        self.work = WorkRegistry(ctx.data_dir)
        self._delivering: set[str] = set()
        self.fanout = Fanout(
            peer,
            subscribers=self.options.subscribers,
            journal=self.options.journal,
            gap_s=self.options.publish_gap_ms / 1000,
        )
        self.server: ServerClient | None = None
        self.servers: dict[str, ServerClient] = {}
        self.epoch = 0
        #: Deleted sessions whose interrupted turn has not ended on its worker yet: the turn
        #: id, and an event set when its terminal arrives.
        self._draining: dict[str, tuple[str, trio.Event]] = {}
        #: The last stream sequence of each session deleted in this incarnation.
        self._deleted_seq: dict[str, int] = {}
        #: Ids of sessions reclaimed from memory while idle (their records are in the store).
        self._reclaimed: set[str] = set()
        #: The host is stopping (:meth:`~._actor.DispatchActor.drain`): no new turn starts; a
        #: message is buffered, durably, for the next host's dispatch to run.
        self.stopping = False
        #: Turns being ended (their edge not yet published and saved), and an event set and
        #: replaced each time one has been: what a drain waits on.
        self.ending = 0
        self.turn_ended = trio.Event()
        self.stats = {
            "turns": 0,
            "buffered": 0,
            "failed": 0,
            "watchdog": 0,
            "reclaimed": 0,
            "revived": 0,
            "duplicates": 0,
        }
        #: What ``/metrics`` shows of the turns (``corral_turns_total``, time to first delta).
        self.tally = Tally()
        self.fanout.on_delivered = self._delivered

    @contextlib.contextmanager
    def _ending(self, turn: Turn, status: str, failure: JsonObject | None) -> Iterator[None]:
        """Around the end of ``turn``: in flight for a drain until its edge is published and
        saved; then counted by outcome (``completed``, ``failed`` with its error code,
        ``interrupted``) and a waiting drain woken."""
        self.ending += 1
        try:
            yield
        finally:
            self.ending -= 1
            if status == "failed":
                self.stats["failed"] += 1
                code = str((failure or {}).get("code") or "unknown")
                self.tally.count("turns", outcome="failed", error=code)
            else:
                outcome = "interrupted" if turn.interrupted else "completed"
                self.tally.count("turns", outcome=outcome)
            self.turn_ended.set()
            self.turn_ended = trio.Event()

    async def _session(self, session_id: str, runner_id: str | None) -> Session | None:
        """The session of this id for a request through ``runner_id``: held, read back from
        the store, or new (bound through ``runner_id``); None if another runner id bound it.
        A session no id has bound yet is bound through this one."""
        session = await self._known(session_id)
        if session is None:
            # Numbered past a deleted session of the same id: the gateway drops events whose
            # sequence it has seen for the id.
            seq = max(self.epoch << EPOCH_SHIFT, self._deleted_seq.pop(session_id, 0))
            session = self.sessions[session_id] = Session(
                SessionRecord(id=session_id, created_at=time.time(), runner_id=runner_id, seq=seq)
            )
        elif not session.record.reachable_by(runner_id):
            return None
        elif session.record.runner_id is None:
            session.record.runner_id = runner_id
        return session

    async def _known_to(self, session_id: str, runner_id: str | None) -> Session | None:
        """The session of this id if it exists and a request through ``runner_id`` may reach
        it (:meth:`SessionRecord.reachable_by`): another runner id's is as unknown."""
        session = await self._known(session_id)
        if session is None or not session.record.reachable_by(runner_id):
            return None
        return session

    async def _known(self, session_id: str) -> Session | None:
        """The session of this id if it exists: held, or read back from the store when it was
        reclaimed while idle (:meth:`_reclaim`)."""
        if session_id in self._reclaimed and session_id not in self.sessions:
            record = await self.store.find(session_id)
            if session_id not in self.sessions:  # nothing brought it back meanwhile
                self._reclaimed.discard(session_id)
                if record is not None:
                    # As at start: above anything published for it since the epoch began.
                    record.seq = max(record.seq, self.epoch << EPOCH_SHIFT)
                    self.sessions[session_id] = Session(record, saved_seq=record.seq)
                    self.stats["revived"] += 1
        session = self.sessions.get(session_id)
        if session is not None:
            session.used = time.monotonic()
        return session

    def _reclaimable(self, session: Session, unused_since: float) -> bool:
        """Idle, unused since ``unused_since``, and nothing in memory only: no turn, nothing
        buffered, queued or draining, no note to post, and a history the server can give
        again (a session with no server keeps its history in memory alone)."""
        return (
            session.turn is None
            and session.used < unused_since
            and not session.record.buffer
            and session.record.note_pending is None
            and not session.record.outbox
            and not self.has_queued(session.id)
            and session.id not in self._draining
            and (session.history is None or self._server(session) is not None)
        )

    async def _reclaim(self, idle_s: float) -> None:
        """Drop the sessions idle for ``idle_s`` from memory (saved first if events were
        numbered since their last save, so that the record read back numbers past them)."""
        cutoff = time.monotonic() - idle_s
        for session in [s for s in self.sessions.values() if self._reclaimable(s, cutoff)]:
            if session.record.seq != session.saved_seq:
                seq = session.record.seq
                await self.store.append(session.record)
                session.saved_seq = seq
            if self.sessions.get(session.id) is session and self._reclaimable(session, cutoff):
                del self.sessions[session.id]
                self._reclaimed.add(session.id)
                self.stats["reclaimed"] += 1

    async def _save(self, session: Session) -> None:
        if self.sessions.get(session.id) is not session:
            return  # deleted (or replaced) meanwhile: a late save must not bring it back
        session.used = time.monotonic()
        seq = session.record.seq
        await self.store.append(session.record)
        session.saved_seq = seq

    def _publish_saved(
        self,
        session: Session,
        event: JsonObject | Output,
        *,
        run_id: str | None = None,
        terminal: bool = False,
        upstream: bool = True,
    ) -> None:
        """Publish an event that is saved before it is sent: called while the session is
        held (``fanout.held``) and before the save that ends the hold. It stays in the
        record's outbox until every receiver has it (:meth:`_delivered`), and an incarnation
        that finds it there sends it again with its own ``seq``."""
        record = session.record
        # In the outbox before it is published: with no receiver at all it is delivered at once.
        record.outbox.append(
            PendingEvent(
                seq=record.seq + 1,
                event=msgspec.to_builtins(event),
                run_id=run_id or record.turn_id,
                terminal=terminal,
                upstream=upstream,
            )
        )
        self.fanout.publish(
            record, event, run_id=run_id, terminal=terminal, upstream=upstream, track=True
        )

    def _delivered(self, session_id: str, seq: int) -> None:
        """Every receiver has the saved event ``seq``: it leaves the outbox. The record is
        saved again (in the background) once a turn's end has left it; until then a crash
        sends it again, which the gateway drops by its ``seq``."""
        session = self.sessions.get(session_id)
        if session is None:
            return
        record = session.record
        left = [p for p in record.outbox if p.seq != seq]
        if len(left) == len(record.outbox):
            return
        record.outbox = left
        if not left and session.turn is None:
            self._crash_point("edge_delivered")
            assert self.nursery is not None
            self.nursery.start_soon(self._save, session)

    def _crash_point(self, step: str) -> None:
        """The crash tests' fault hook (:mod:`corral.actors._crash`)."""
        crash_point(self.ctx.data_dir, step, self.options.crash_at, log)

    async def _child_ended(
        self, session: Session, turn: Turn, status: str, failure: JsonObject | None, edge: bool
    ) -> None:
        """A turn of ``session`` ended ``status``; ``edge``: its chain ended too (no buffered
        continuation, S-18). A sub-agent's result is recorded then, before the end is saved
        (``_subagents`` says why)."""
        if edge and self.work.open_for(session.id):
            await self.work.ended(session.id, turn.turn_id, *turn_result(turn, status, failure))

    async def _elicitation_closed(self, session: Session, elicitation_id: str) -> None:
        if elicitation_id in session.record.elicitations:
            session.record.elicitations.remove(elicitation_id)
            await self._save(session)

    async def _to_harness(
        self, msg: Request[InputAccepted], *, durable: bool = False
    ) -> InputAccepted | None:
        try:
            return await self.peer.call(HARNESS_ACTOR, msg, durable=durable, timeout=15)
        except Exception as exc:
            log.warning("the harness actor did not answer %s: %s", type(msg).__name__, exc)
            return None

    async def _to_policy(self, msg: ToolCall | PolicyEvaluate | TurnEnded) -> None:
        """A durable cast to the policy actor. Called from the session's queue, never from a
        handler: awaiting the broker's acceptance in a handler stalls once the inbox is full
        (the handler is what drains it)."""
        assert self.options.policy is not None
        session = self.sessions.get(msg.session_id)
        if isinstance(msg, PolicyEvaluate) and session is not None and session.turn is not None:
            session.turn.evaluated = True
        await self.peer.cast(self.options.policy, msg, durable=True, session_id=msg.session_id)

    def _server(self, session: Session) -> ServerClient | None:
        """The server client of the session's runner (None: no server, the spec default)."""
        return pick_server(self.server, self.servers, session.record.runner_id)
