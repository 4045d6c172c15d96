"""A turn's worker events published once each, in their worker's order, across restarts.

A worker numbers its events of a turn (``sequence_number``, from 0) and holds each until
dispatch says it is :class:`~corral.harnesses.protocol.Confirmed`: published and with every
subscriber, durably (the broker accepted the batch). Dispatch numbers worker event ``k``
``base + (k + 1) * STRIDE`` (:func:`~._turn.worker_seq`, ``base`` saved when the turn starts),
so whichever incarnation publishes it gives it the same ``seq``, and the gateway drops a
``seq`` it has seen. What this part keeps:

* **Order.** Events are published in their worker's order: one ahead of the next expected
  waits (``Turn.early``), one behind it is a copy and is dropped. A gap that lasts
  (:data:`GAP_S`) asks the worker to send again (:class:`~corral.harnesses.protocol.Resend`).
* **A restart.** A resumed turn does not know where its worker stands: it asks
  (:meth:`StreamOrder._resend`), and publishes nothing of the turn until the answer says
  from where; what its worker sends again keeps its ``seq``.
* **The runner's own events** of a turn (tools' and policy's ``PublishEvents``, the harness
  actor's ``elicitation_resolved``) take the numbers between the worker's and are saved
  before they are sent, so the next incarnation numbers past them; they wait until the turn
  is past everything its worker said it had sent (``Turn.in_order``), and the terminal event
  waits for every worker event before it.
* **The end.** A turn's end is saved once its stream is with every receiver (``_terminal``
  waits for :meth:`~._fanout.Fanout.sent`): a worker forgets a turn's events at its next
  start. An end the harness actor made up (the worker died, ``sequence_number`` 0) numbers
  past any event the worker could have sent (:data:`~._turn.PAST_WORKER`); so do the
  runner's events of a resumed turn whose worker cannot say what it sent (``Turn.unplaced``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from ..._exceptions import CallTimeout
from ..._jsonlines import JsonObject
from ...bus import Incoming
from ...harnesses.protocol import (
    Confirmed,
    ElicitationRequest,
    ElicitationResolved,
    Output,
    OutputItemDone,
    OutputTextDelta,
    PolicyEvaluationRequested,
    Resend,
    Resending,
    ResponseInProgress,
    worker_address,
)
from .._deferred import Deferred
from .._tally import FIRST_DELTA_BUCKETS
from ..policy.messages import PolicyEvaluate
from . import _history as history
from ._calls import ToolCalls
from ._session import Session
from ._turn import Turn, worker_seq

log = logging.getLogger("corral.actors.dispatch")

#: How long a gap in a turn's worker events waits before the worker is asked to resend.
GAP_S = 1.0
#: How long the worker gets to answer a :class:`Resend`.
RESEND_TIMEOUT_S = 5.0
#: Worker events between two confirmations: one message per accepted round would double a
#: streaming worker's inbound traffic (a round can be one delta), and what a worker holds
#: unconfirmed is bounded either way.
CONFIRM_EVERY = 64
#: The worker event after which ``crash_at = "streaming"`` stops dispatch (crash tests).
CRASH_K = 30
#: Events the session stream never carries (PROTOCOL_FACTS.md §ii.6).
_NOT_ON_STREAM = {"response.created", "policy_evaluation.requested"}


class StreamOrder(ToolCalls):
    """A turn's worker events in order: a part of :class:`~._actor.DispatchActor`."""

    async def _worker_event(
        self, session: Session, turn: Turn, msg: Output, incoming: Incoming
    ) -> None:
        """A worker event of the active turn: taken now if it is the next one, kept if it is
        ahead of it, dropped if it is a copy of one already taken."""
        turn.heard()
        k = msg.sequence_number
        if turn.next_k is not None and k < turn.next_k:
            return
        durable = incoming.env.durability == "durable"
        # The lock without its two scheduler trips when it is free, as it nearly always is:
        # this runs once per delta of every streaming turn.
        if turn.lock.locked():
            await turn.lock.acquire()
        else:
            turn.lock.acquire_nowait()
        try:
            if turn.next_k is None or k > turn.next_k:
                if k not in turn.early:
                    deferred = self.defer(incoming) if durable else None
                    turn.early[k] = (msg, incoming.env.created_at, deferred)
                    turn.gap_since = turn.gap_since or time.monotonic()
                return
            if turn.next_k is not None and k < turn.next_k:
                return  # taken meanwhile
            await self._take(
                session,
                turn,
                msg,
                incoming.env.created_at,
                self.defer(incoming) if durable else None,
            )
            turn.next_k = k + 1
            turn.unplaced = False  # the worker lives and goes on from here
            await self._drain(session, turn)
        finally:
            turn.lock.release()

    async def _take(
        self, session: Session, turn: Turn, msg: Output, origin_at: float, d: Deferred | None
    ) -> None:
        """Handle and publish worker event ``msg`` (the next of its turn); ``d``, the handle
        of its durable message, is resolved here or by the tool call it starts."""
        try:
            if isinstance(msg, OutputTextDelta):
                turn.text.append(msg.delta)
                if not turn.first_delta_timed:
                    turn.first_delta_timed = True
                    delay = time.monotonic() - turn.started
                    self.tally.observe("turn_first_delta_seconds", delay, FIRST_DELTA_BUCKETS)
            elif isinstance(msg, OutputItemDone):
                history.take_item(turn.items, turn.text, msg.item)
            elif isinstance(msg, ElicitationRequest):
                turn.wait_on_elicitation(msg.elicitation_id)
                if msg.elicitation_id not in session.record.elicitations:
                    session.record.elicitations.append(msg.elicitation_id)
                    await self._save(session)
            if isinstance(msg, OutputItemDone) and msg.item.get("status") == "action_required":
                # Acked once the call is on its way to policy, not now: a crash in between
                # redelivers the request instead of losing it (the worker would wait for a
                # result that never comes). A copy sent again is not durable: the worker
                # holds it until it is confirmed.
                item, deferred, d = msg.item, d, None
                self.in_order(
                    session.id,
                    lambda: self._tool_call(session, turn, item, deferred),
                    *([deferred] if deferred is not None else []),
                )
                self.fanout.to_stream(
                    turn.stream_to, msg, worker_seq(turn.base, msg.sequence_number)
                )
                return
            if isinstance(msg, PolicyEvaluationRequested) and self.options.policy is not None:
                request = PolicyEvaluate(
                    session_id=session.id,
                    evaluation_id=msg.evaluation_id,
                    phase=msg.phase,
                    data=msg.data,
                    runner_id=session.record.runner_id,
                )
                self.in_order(session.id, lambda: self._to_policy(request))
            if isinstance(msg, ResponseInProgress):
                # As omnigent's runner says it (PROTOCOL_FACTS.md; §D.3a): a foreground,
                # stored response.
                msg.response.setdefault("background", False)
                msg.response.setdefault("store", True)
            self.fanout.to_stream(turn.stream_to, msg, worker_seq(turn.base, msg.sequence_number))
            if msg.__struct_config__.tag not in _NOT_ON_STREAM:
                self.fanout.publish(
                    session.record,
                    msg,
                    run_id=turn.turn_id,
                    origin_at=origin_at,
                    seq=worker_seq(turn.base, msg.sequence_number),
                    k=msg.sequence_number,
                )
                if msg.sequence_number == CRASH_K:
                    self._crash_point("streaming")
        finally:
            if d is not None:
                d.ack()

    async def _harness_event(self, session: Session, turn: Turn, msg: Output) -> None:
        """An event the harness actor made for the turn (``elicitation_resolved``): the
        runner's own, saved before it is sent."""
        if isinstance(msg, ElicitationResolved):
            turn.elicitation_closed(msg.elicitation_id)
            await self._elicitation_closed(session, msg.elicitation_id)
        self.fanout.to_stream(turn.stream_to, msg)
        await self._publish_runner_events(session, turn, [msg])

    async def _runner_event(
        self,
        session: Session,
        turn: Turn,
        run: Callable[[], Awaitable[None]],
        incoming: Incoming,
    ) -> None:
        """Run ``run`` (it publishes the runner's own events of ``turn``) in the session's
        queue once the turn is in order (its durable message in flight until then)."""
        deferred = self.defer(incoming)
        async with turn.lock:
            if turn.in_order and not turn.later:
                self._queue_run(session, run, deferred)
            else:
                turn.later.append((run, deferred))

    def _queue_run(
        self, session: Session, run: Callable[[], Awaitable[None]], deferred: Deferred | None
    ) -> None:
        """``run`` in the session's queue, never in a handler: it waits for acceptances, and
        those can queue behind the handler's inbox."""

        async def job() -> None:
            await run()
            if deferred is not None:
                deferred.ack()

        self.in_order(session.id, job, *([deferred] if deferred is not None else []))

    async def _worker_terminal(
        self, session: Session, turn: Turn, msg: Output, incoming: Incoming
    ) -> None:
        """The turn's terminal event: it ends the turn once every worker event before it is
        taken (the worker's own), or once the turn is in order (one the harness actor made
        up, numbered past anything the worker could have sent)."""
        deferred = self.defer(incoming)
        async with turn.lock:
            if msg.sequence_number == 0 and turn.unplaced:
                turn.ending = (msg, deferred)
                await self._drain(session, turn)
                return
            if not self._ready_to_end(turn, msg):
                turn.ending = (msg, deferred)
                turn.gap_since = turn.gap_since or time.monotonic()
                return
            self._queue_end(session, turn, msg, deferred)

    def _ready_to_end(self, turn: Turn, msg: Output) -> bool:
        if msg.sequence_number == 0:
            return turn.in_order
        return turn.next_k is not None and turn.next_k >= msg.sequence_number

    def _queue_end(
        self, session: Session, turn: Turn, msg: Output, deferred: Deferred | None
    ) -> None:
        """End the turn on ``msg`` in the session's queue (its end waits for its stream)."""

        async def end() -> None:
            if msg.sequence_number == 0:
                turn.number_past_worker(session.record)
            for _, _, held in turn.early.values():
                if held is not None:
                    held.ack()
            turn.early.clear()
            await self._terminal(session, msg)

        self._queue_run(session, end, deferred)

    async def _drain(self, session: Session, turn: Turn) -> None:
        """Take the kept events that are next; then queue what waited for the turn to be in
        order, and its terminal if it is due."""
        if turn.unplaced and turn.ending is not None and turn.ending[0].sequence_number == 0:
            # Made up by the harness actor: the worker is gone. What waited for it (the
            # cancel of a parked elicitation) numbers past all it could have sent.
            turn.number_past_worker(session.record)
        while turn.next_k is not None and turn.next_k in turn.early:
            msg, origin_at, deferred = turn.early.pop(turn.next_k)
            await self._take(session, turn, msg, origin_at, deferred)
            turn.next_k += 1
        if turn.next_k is not None:
            for k in [k for k in turn.early if k < turn.next_k]:
                deferred = turn.early.pop(k)[2]
                if deferred is not None:
                    deferred.ack()
        if turn.in_order:
            for run, deferred in turn.later:
                self._queue_run(session, run, deferred)
            turn.later.clear()
        if turn.ending is not None and self._ready_to_end(turn, turn.ending[0]):
            msg, deferred = turn.ending
            turn.ending = None
            self._queue_end(session, turn, msg, deferred)
        if not turn.early and turn.ending is None:
            turn.gap_since = None

    async def _resend(self, session: Session, turn: Turn) -> None:
        """Ask the turn's worker where it stands and to send again what is not confirmed
        (a resumed turn, or a gap); a worker that cannot answer leaves the gap to the
        events that did come (logged: what it held is lost with it). One that answers late
        is asked again at the next gap check."""
        if turn.resending:
            return
        turn.resending = True
        resumed = turn.next_k is None
        reply: Resending | None = None
        try:
            reply = await self.peer.call(
                worker_address(session.id),
                Resend(session_id=session.id, turn_id=turn.turn_id),
                timeout=RESEND_TIMEOUT_S,
                session_id=session.id,
            )
        except CallTimeout as exc:
            # Late, not gone (a worker's exit fails the call at once): its answer and what it
            # sends again come behind a flood. Skipping the gap now lost them as they came (50
            # floods at once: 1,024 events of three turns); the next gap check asks again.
            log.warning("turn %s: its worker has not answered a resend yet: %s", turn.turn_id, exc)
            return
        except Exception as exc:
            log.warning("turn %s: its worker did not answer a resend: %s", turn.turn_id, exc)
        finally:
            turn.resending = False
        if session.turn is not turn:
            return
        async with turn.lock:
            if reply is not None and reply.known:
                first, turn.resent_upto = reply.first, max(turn.resent_upto, reply.last)
                turn.unplaced = False
            else:
                # A resumed turn's worker that cannot say: whatever of its events the last
                # incarnation published after its last save is unknown (#15).
                turn.unplaced = turn.unplaced or resumed
                # Nothing held of it: the worker has not started it (it starts at 0) or is a
                # new process (the harness actor ends the turn); or it cannot say. What came
                # goes on; what did not is lost with the worker that held it.
                first = min(turn.early, default=turn.next_k or 0)
            if turn.next_k is not None and first > turn.next_k:
                log.warning(
                    "turn %s: worker events %d..%d are lost", turn.turn_id, turn.next_k, first - 1
                )
            if turn.next_k is None or first > turn.next_k:
                if first > 0:
                    # Everything before ``first`` was published: number past it.
                    record = session.record
                    record.seq = max(record.seq, worker_seq(turn.base, first - 1))
                turn.next_k = first
            await self._drain(session, turn)

    def _check_gaps(self, now: float) -> None:
        """Ask the workers of turns whose events wait behind a gap to send again."""
        assert self.nursery is not None
        for session in self.sessions.values():
            turn = session.turn
            if turn is None or turn.resending:
                continue
            # A gap behind kept events or a terminal that waits, or a turn not yet in order.
            stuck = turn.gap_since is not None and now - turn.gap_since > GAP_S
            if stuck or turn.next_k is None:
                self.nursery.start_soon(self._resend, session, turn)

    def _on_sent(self, session_id: str, k: int) -> None:
        """Worker events of the session up to ``k`` are with every subscriber: its active
        turn's worker may forget them."""
        session = self.sessions.get(session_id)
        turn = session.turn if session is not None else None
        if turn is None or k < turn.confirmed + CONFIRM_EVERY:
            return
        turn.confirmed = k
        self.fanout.outbox.put_nowait(
            worker_address(session_id),
            Confirmed(session_id=session_id, turn_id=turn.turn_id, upto=k),
            session_id=session_id,
        )

    async def _publish_runner_events(
        self, session: Session, turn: Turn | None, events: Sequence[JsonObject | Output]
    ) -> None:
        """Publish the runner's own events of ``turn`` (None: of no turn), saved before they
        are sent: what the next incarnation numbers comes after them. Saved once what was
        published before them is with every receiver: the next incarnation sends them again
        first, and a worker event before them it had not sent would then come after them.
        Events published meanwhile wait behind them (the session is held)."""
        if session.turn is not turn:
            turn = None
        with self.fanout.held(session.id):
            for event in events:
                self._publish_saved(session, event, run_id=turn.turn_id if turn else None)
            await self.fanout.sent()
            await self._save(session)
