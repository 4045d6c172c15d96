"""The dispatch actor: sessions and turns, end to end (BEHAVIOURS.md D-01..D-33, E-04).

What it handles and answers, with its error codes, is the table in
:mod:`corral.actors.dispatch.messages`.

The actor is a chain of parts (see ``_base``), with helpers of their own:

    _base       the state every part shares: sessions, store, fan-out, saving, the peers
    _routes     the route table and the answers routes share
    _http       the session routes (create, read, delete, events)
    _events     the typed union of session events, parsed strictly
    _turn       the turn state machine, pure: phases, transitions, how a turn ends
    _start      setting a turn up: its spec, its history, the worker's message
    _turns      the life of a turn: start or buffer, end, continuation, interrupt note
    _history    the history a harness sees: rehydration, dedup, media (pure, plus a fetch)
    _calls      tool calls: a worker's through policy and back, and ``mcp/execute``
    _stream     a turn's worker events in their order, numbered by the worker's own
                sequence, confirmed to it and asked again after a restart
    _subagents  the durable sub-agent work registry (``subagents.log``)
    _work       registering dispatched children, delivering their results to the parents
    _fanout     events to the subscribers (durable batches), the journal, a streaming caller
    _store      ``sessions.log``: fsynced records, tombstones, compaction, the epoch
    _watchdog   the per-turn watchdog's verdict

Crash safety. Sessions (agent, overrides, the active turn's id, start and streaming caller,
whether it was interrupted, the tool calls it sent and got answered, buffered messages, the
stream sequence) are written to ``sessions.log`` (fsynced) before a request is answered; a
deleted session leaves a tombstone there, so it stays deleted. After a restart the state is
rebuilt from it; an active turn **resumes**: its worker keeps streaming to the new dispatch,
and its terminal event — durable, from the harness actor — still ends it. The resumed turn
knows what it has in flight (:meth:`Turn.resume`): it still tells policy when it ends, and
the idle watchdog still spares it while a call waits on a tool or a human. A turn whose
worker died with it ends ``failed`` by the harness actor (``harness_restarted``); one that
hears nothing at all is ended ``failed`` by the watchdog. Never two terminal edges for one
turn: edges are published only for the turn id that is active, and a turn's ``running``, its
terminal event and its edge are saved before they are sent (the record's outbox), so the
next incarnation sends what a crash may have cut off again, with the same ``seq``.

Exactly-once turns: each message's idempotency key (the server's ``persisted_item_id``, else
the request id the broker redelivers it with) is kept with the session, so a message taken
before is answered as it was and never run again; a turn whose start a crash may have cut
off (its messages still in the record) is started again, and the harness actor ignores a
start it has seen.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import trio

from ..._exceptions import BadInput
from ..._input import check_session_id
from ...bus import Incoming
from ...harnesses.protocol import (
    HARNESS_ACTOR,
    Deltas,
    Output,
    ProgressOutput,
    TerminalOutput,
)
from ...routes import HttpRequest, HttpResponse
from .._actor import every, handles
from .._deferred import Deferred
from ._routes import GENERIC_DETAIL, NO_HARNESS_DETAIL, ROUTES, error, match, no_route, refused
from ._session import Session
from ._store import EPOCH_SHIFT
from ._subagents import truncate_preview
from ._turn import Turn
from ._watchdog import overdue, watchdog_error
from ._work import SubagentWork
from .messages import (
    PublishEvents,
    SubagentCancel,
    SubagentDispatched,
    SubagentDrained,
    SubagentRegistered,
    SubagentTask,
)

log = logging.getLogger("corral.actors.dispatch")


class DispatchActor(SubagentWork):
    """Owns every session of this host."""

    # --- lifecycle -------------------------------------------------------------------------

    async def setup(self) -> None:
        assert self.nursery is not None
        self.fanout.start(self.nursery)
        from ...server_client import ServerClient

        if self.options.server_url:
            self.server = ServerClient(self.options.server_url, token=self.options.token)
        for runner in self.options.runners:
            assert runner.id is not None
            self.servers[runner.id] = ServerClient(runner.server, token=runner.token)
        self.epoch = await self.store.next_epoch()
        self.fanout.on_sent = self._on_sent
        for record in await self.store.load():
            if not record.turn_id:
                # A new epoch starts above anything the previous incarnation numbered. An
                # active turn's numbers are its own (``_stream``): its worker's events keep
                # theirs, and the runner's own were saved before they were sent.
                record.seq = max(record.seq, self.epoch << EPOCH_SHIFT)
            session = Session(record, saved_seq=record.seq)
            if record.turn_id:
                session.turn = Turn.resume(record)  # its terminal still comes
                # What its worker sent the killed incarnation may be lost: asked again.
                self.nursery.start_soon(self._resend, session, session.turn)
            self.sessions[record.id] = session
            if record.outbox:  # saved, and maybe never sent: again, with their own seqs
                self.fanout.republish(record, record.outbox)
            if record.turn_id and record.starting is not None:
                # Its start may never have reached the harness actor.
                self.in_order(record.id, functools.partial(self._restart, session))
            elif record.turn_id is None and record.buffer:
                # Its turn ended before the buffered messages' turn began.
                self.in_order(record.id, functools.partial(self._continue, session))
            if record.note_pending:  # the previous incarnation died before posting it
                self.nursery.start_soon(self._post_note, session, record.note_pending)
        if self.sessions:
            log.info("recovered %d sessions", len(self.sessions))
        self.work.on_result = self._result_recorded
        self.work.on_started = self._work_started
        for entry in await self.work.load():  # results a crash kept from their parents
            self.nursery.start_soon(self._deliver, entry)

    async def drain(self, wait_s: float) -> int:
        """The host is stopping: start no new turn (a message is buffered, durably, and the
        next host's dispatch runs it at start) and wait up to ``wait_s`` for the active turns
        to end; the number still active. One that is still active when the host stops ends
        ``failed`` (``harness_restarted``) once the next host runs, as after a crash."""
        self.stopping = True
        active = self._active_turns()
        if active:
            log.info("draining: waiting up to %.0fs for %d active turns", wait_s, active)
        with trio.move_on_after(wait_s):
            while self._active_turns() or self.ending:
                await self.turn_ended.wait()
            # Their edges are with the broker before the answer: the host asks the gateway
            # to drain next, and it then has them to send.
            await self.fanout.sent()
        return self._active_turns() + self.ending

    def _active_turns(self) -> int:
        return sum(1 for s in self.sessions.values() if s.turn)

    async def terminate(self) -> None:
        await self.fanout.aclose()
        for client in {id(c): c for c in (self.server, *self.servers.values()) if c}.values():
            await client.aclose()

    def snapshot(self) -> dict[str, Any]:
        return {
            **super().snapshot(),
            **self.stats,
            "sessions": len(self.sessions),
            # ``corral sessions`` on a host with no control plane: what dispatch holds.
            "session_list": [
                {
                    "id": s.record.id,
                    "agent_id": s.record.agent_id,
                    "runner_id": s.record.runner_id,
                    "status": s.record.status,
                    "turn_id": s.record.turn_id,
                    "created_at": s.record.created_at,
                }
                for s in self.sessions.values()
            ],
            "active_turns": self._active_turns(),
            "stopping": self.stopping,
            "tally": self.tally.snapshot(),
            # ``corral subagents``: every work entry, its output cut as a parent's preview is.
            "subagents": [
                {**msgspec.to_builtins(e), "output": truncate_preview(e.output)}
                for e in self.work.entries.values()
            ],
        }

    # --- the HTTP surface ------------------------------------------------------------------

    @handles(HttpRequest)
    async def http(self, msg: HttpRequest, incoming: Incoming) -> HttpResponse | None:
        found = match(ROUTES, msg.method, msg.path)
        if found is None:
            return no_route(msg.method, msg.path)
        route, params = found
        session_id = params.get("session_id", "")
        if "session_id" in params:
            try:
                check_session_id(session_id)
            except BadInput as exc:
                return refused(msg, exc)
        if route.needs_harness and not self.options.harness_actor:
            return error(501, "not_implemented", NO_HARNESS_DETAIL.format(session_id))
        handler = functools.partial(getattr(self, route.handler), msg, **params)
        if route.runs == "inline":
            return await handler()
        deferred = self.defer(incoming)
        if route.runs == "background":
            assert self.nursery is not None
            self.nursery.start_soon(self._reply, deferred, handler)
        else:
            key = session_id if route.runs == "session" else "init"
            self.in_order(key, lambda: self._reply(deferred, handler), deferred)
        return None

    async def _reply(
        self, deferred: Deferred, handler: Callable[[], Awaitable[HttpResponse | None]]
    ) -> None:
        incoming = deferred.incoming
        try:
            response = await handler()
        except BadInput as exc:  # a BadEvent too
            assert isinstance(incoming.msg, HttpRequest)
            response = refused(incoming.msg, exc)
        except Exception:
            log.exception("request %s failed", incoming.env.id)
            response = error(500, "runner_error", GENERIC_DETAIL)
        if response is not None:
            await self.peer.reply(incoming, response)
        deferred.ack()

    # --- sessions --------------------------------------------------------------------------

    # --- harness output --------------------------------------------------------------------

    @handles(ProgressOutput)
    async def output(self, msg: Output, incoming: Incoming) -> None:
        session = self.sessions.get(incoming.env.session_id or "")
        if session is None or session.turn is None or session.turn.turn_id != msg.turn_id:
            return
        turn = session.turn
        if incoming.env.sender == HARNESS_ACTOR:  # its own events, not its worker's
            turn.heard()
            run = functools.partial(self._harness_event, session, turn, msg)
            await self._runner_event(session, turn, run, incoming)
            return
        await self._worker_event(session, turn, msg, incoming)

    @handles(Deltas)
    async def deltas(self, msg: Deltas, incoming: Incoming) -> None:
        """A worker's run of deltas (``TurnStart.batch``), each taken as if it came alone."""
        session = self.sessions.get(incoming.env.session_id or "")
        if session is None:
            return
        for event in msg.events:
            turn = session.turn
            if turn is not None and turn.turn_id == event.turn_id:
                await self._worker_event(session, turn, event, incoming)

    @handles(PublishEvents)
    async def publish_events(self, msg: PublishEvents, incoming: Incoming) -> None:
        session = await self._known(msg.session_id)
        if session is None:
            log.info("dropping %d events of unknown session %s", len(msg.events), msg.session_id)
            return
        turn = session.turn
        run = functools.partial(self._publish_runner_events, session, turn, msg.events)
        if turn is None:
            self._queue_run(session, run, self.defer(incoming))
            return
        await self._runner_event(session, turn, run, incoming)

    @handles(SubagentDispatched)
    async def subagent_dispatched(
        self, msg: SubagentDispatched, incoming: Incoming
    ) -> SubagentRegistered:
        return await self._register_work(msg)

    @handles(SubagentCancel)
    async def subagent_cancel(self, msg: SubagentCancel, incoming: Incoming) -> SubagentTask:
        return await self._cancel_work(msg)

    @handles(SubagentDrained)
    async def subagent_drained(self, msg: SubagentDrained, incoming: Incoming) -> None:
        await self._work_drained(msg)

    @handles(TerminalOutput)
    async def terminal(self, msg: Output, incoming: Incoming) -> None:
        session_id = incoming.env.session_id or ""
        draining = self._draining.get(session_id)
        if draining is not None and draining[0] == msg.turn_id:
            del self._draining[session_id]
            draining[1].set()
        session = self.sessions.get(session_id)
        if session is None or session.turn is None or session.turn.turn_id != msg.turn_id:
            log.info("ignoring a terminal event for turn %s, which is not active", msg.turn_id)
            return
        await self._worker_terminal(session, session.turn, msg, incoming)

    # --- the watchdog ----------------------------------------------------------------------

    @every(1.0)
    async def _reclaim_idle(self) -> None:
        if self.options.session_idle_s > 0:
            await self._reclaim(self.options.session_idle_s)

    @every(1.0)
    async def _watchdog(self) -> None:
        now = time.monotonic()
        self._check_gaps(now)
        for session in list(self.sessions.values()):
            turn = session.turn
            if turn is None:
                continue
            why = overdue(
                turn,
                now,
                turn_timeout_s=self.options.turn_timeout_s,
                idle_timeout_s=self.options.turn_idle_timeout_s,
            )
            if why is not None:
                self.stats["watchdog"] += 1
                log.warning("turn %s %s; ending it", turn.turn_id, why)
                await self._fail(session, turn, watchdog_error(why))
