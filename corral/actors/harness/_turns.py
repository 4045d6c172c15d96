"""The life of a turn in the harness actor: its start, and its one terminal event.

A turn's start is taken once per incarnation (a second copy, dispatch's ``again`` start or a
redelivery, is dropped), waits for a stale turn of its session to end, resolves its harness
and spawn environment, gets a fresh worker (replacing one that dies as it starts) and is
marked started before the worker sees it. However it goes, it ends with exactly one terminal
event sent to its ``reply_to``: the worker's own, or one this actor makes (``harness_*``,
``unknown_harness``, ``turn_setup_failed``, ``superseded``). The start stays unacked until
then (held while the worker runs it).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ..._exceptions import Unreachable
from ...bus import Incoming
from ...harnesses import resolve as resolve_harness
from ...harnesses.protocol import (
    InputAccepted,
    Interrupt,
    Output,
    ResponseCancelled,
    ResponseCompleted,
    ResponseFailed,
    TurnStart,
    worker_address,
)
from ...harnesses.spawn_env import SpawnEnvError, build_spawn_env
from .._actor import handles
from .._deferred import Deferred
from ._adopt import take_back
from ._base import places_of, turn_failed
from ._elicitations import Elicitations
from ._records import OwnedTurn

log = logging.getLogger("corral.actors.harness")

#: How many workers a turn's start tries (each after the first replaces one that died while
#: it started or as the turn reached it, a restart counted against the session's budget).
START_ATTEMPTS = 3

#: Turn ids an incarnation remembers taking a start of (about 40 bytes each): a second start
#: of a turn comes from a dispatch restarted seconds after the first, so thousands are plenty.
TAKEN_KEPT = 4096


class TurnLife(Elicitations):
    """The turns of the harness actor, each from its start to its one terminal event."""

    @handles(TurnStart)
    async def turn_start(self, msg: TurnStart, incoming: Incoming) -> InputAccepted | None:
        if self._taken_here(msg):
            # A second copy of a turn this incarnation holds or ended: dispatch's ``again``
            # start (it crashed before it knew its first one was with the broker), or the
            # first one redelivered after it (the ``again`` copy came first after a restart
            # of this actor). The turn runs, and ends, once: under the copy taken first.
            which = "second" if msg.again else "first"
            log.info("turn %s was taken here before; its %s start is dropped", msg.turn_id, which)
            return None
        deferred = self.defer(incoming)
        self.taken[msg.turn_id] = None
        if len(self.taken) > TAKEN_KEPT:
            self.taken.popitem(last=False)
        held = self.turns.get(msg.session_id)
        if held is not None and held.start.turn_id != msg.turn_id:
            self._supersede(held, msg, deferred)
            return None
        # In flight from this moment: the reaper must not take the worker (H-08).
        turn = self.turns.setdefault(msg.session_id, OwnedTurn(msg, deferred))
        if turn.start.turn_id == msg.turn_id and turn.deferred.resolved:
            turn.deferred = deferred  # redelivered: its start failed, and was nacked
        self.in_order(msg.session_id, lambda: self._start_turn(msg, deferred), deferred)
        return None

    def _supersede(self, held: OwnedTurn, msg: TurnStart, deferred: Deferred) -> None:
        """``msg`` starts a turn of a session whose turn ``held`` this actor still holds.

        Dispatch sends a turn's start only once the session's previous turn is over for it
        (its watchdog or a failed tool call ended it, its end outran this actor's restart):
        ``held`` is stale. Refused, the new turn failed for nothing (``turn_in_flight``, 6
        of 100 turns in a chaos run); run beside it, the worker would hold two. So the new
        start waits here, ``held``'s worker is told to stop (its start, still queued, ends
        it unrun), and ``held``'s end starts it (:meth:`_end`). A start that a previous
        incarnation started is the stale one: its worker is gone, and it ends
        ``harness_restarted`` leaving ``held`` alone.
        """
        session_id = msg.session_id
        if self.started_turns.seen(msg.turn_id):
            failed = turn_failed(msg, "harness_restarted", "the harness restarted during this turn")
            self.in_order(session_id, lambda: self._refuse(msg, deferred, failed), deferred)
            return
        log.info("turn %s waits for stale turn %s to end", msg.turn_id, held.start.turn_id)
        before = self.waiting.pop(session_id, None)
        self.waiting[session_id] = (msg, deferred)
        if before is not None:
            # Over for dispatch too: a newer start came after it.
            failed = turn_failed(before[0], "superseded", "a newer turn of this session started")
            self.in_order(session_id, lambda: self._refuse(*before, failed), before[1])
        stale = held.start.turn_id
        self.in_order(session_id, lambda: self._interrupt_stale(session_id, stale))

    async def _refuse(self, msg: TurnStart, deferred: Deferred, event: ResponseFailed) -> None:
        """End a start this actor never holds (dispatch drops the end of a turn it ended)."""
        await self._emit(msg.reply_to, event, msg.session_id)
        deferred.ack()

    async def _interrupt_stale(self, session_id: str, turn_id: str) -> None:
        """Tell the worker to stop the stale turn ``turn_id``: its ``response.cancelled``
        ends it here. A worker with no such turn has its end on the way, or its exit does."""
        turn = self.turns.get(session_id)
        state = self.workers.get(session_id)
        if turn is None or turn.start.turn_id != turn_id or state is None or state.exited:
            return
        name, interrupt = worker_address(session_id), Interrupt(session_id=session_id)
        try:
            await self._call_worker(name, interrupt, 10)
        except Exception as exc:
            log.warning("could not stop stale turn %s: %s", turn_id, exc)

    def _taken_here(self, msg: TurnStart) -> bool:
        """Whether this incarnation took a start of ``msg``'s turn and holds it or ended it:
        ``msg`` is then another copy, to drop.

        Not the started-turns record: a turn only a previous incarnation started may have
        been started by this very message, redelivered because that incarnation died holding
        it (dispatch's first start was cut off by a crash, and its ``again`` one ran the
        turn). Dropped as "started before", it left the turn with no worker and no end for
        good; taken, it ends ``harness_restarted`` (:meth:`_start_turn`).
        """
        owned = self.turns.get(msg.session_id)
        if owned is not None and owned.start.turn_id == msg.turn_id:
            return not owned.deferred.resolved  # resolved: its start was nacked; this is it again
        return msg.turn_id in self.ended_turns or msg.turn_id in self.taken

    async def _start_turn(self, msg: TurnStart, deferred: Deferred) -> None:
        turn = self.turns.get(msg.session_id)
        if turn is None or turn.start.turn_id != msg.turn_id:
            # Ended meanwhile (its worker's terminal, redelivered, came first); one whose
            # terminal is still on its way is acked by that, once the terminal is out.
            if not deferred.resolved and msg.turn_id not in self.ending:
                deferred.ack()
            return
        if msg.session_id in self.waiting:
            # A newer start came after this one: it is over for dispatch, and runs nothing.
            failed = turn_failed(msg, "superseded", "a newer turn of this session started")
            await self._end(msg.session_id, failed)
            return
        if self.started_turns.seen(msg.turn_id):
            state = self.workers.get(msg.session_id)
            if take_back(turn, self.holdings, state, self.parked):
                await turn.deferred.hold()
                return
            await self._cancel_parked_of(msg.turn_id, "harness_restarted")
            failed = turn_failed(msg, "harness_restarted", "the harness restarted during this turn")
            await self._end(msg.session_id, failed)
            return
        attempt = deferred.incoming.env.attempt
        if 1 < attempt >= self.peer.bus.max_attempts:
            # The broker's last delivery: were it to fail too, the start would be
            # dead-lettered and nothing would ever end the turn.
            tries = "once" if attempt == 2 else f"{attempt - 1} times"
            why = f"the harness failed to start this turn {tries}; it is not tried again"
            await self._end(msg.session_id, turn_failed(msg, "harness_crashed", why))
            return
        harness = msg.harness or msg.harness_override or _spec_harness(msg.spec)
        try:
            target = resolve_harness(harness, self.extra_harnesses)
            env = build_spawn_env(harness, msg.spec, model_override=msg.model_override)
            to_worker = places_of(self, msg)
        except KeyError:
            await self._end(
                msg.session_id, turn_failed(msg, "unknown_harness", f"no harness named {harness!r}")
            )
            return
        except SpawnEnvError as exc:
            await self._end(
                msg.session_id, turn_failed(msg, "turn_setup_failed", f"turn setup failed: {exc}")
            )
            return
        except OSError as exc:
            why = f"turn setup failed: cannot create the session's directories: {exc.strerror}"
            await self._end(msg.session_id, turn_failed(msg, "turn_setup_failed", why))
            return
        self.stats["turns"] += 1
        name = worker_address(msg.session_id)
        # A worker that dies while it starts, or just as the turn reaches it (its exit not
        # yet seen here), is replaced — each replacement a restart the supervisor counts
        # against the session's budget — so the turn still gets a fresh worker.
        for attempt in range(1, START_ATTEMPTS + 1):
            error, died = await self._ensure_worker(msg.session_id, harness, target, env)
            if error is not None and died and attempt < START_ATTEMPTS:
                log.warning("%s; starting another for turn %s", error, msg.turn_id)
                continue
            if error is not None:
                await self._end(msg.session_id, turn_failed(msg, "harness_unavailable", error))
                return
            # Marked only now, with its worker up: a crash before this point (the spawn takes
            # the most time) left nothing of the turn run, and its redelivered start begins
            # it afresh instead of failing it ``harness_restarted``.
            if not self.started_turns.seen(msg.turn_id):
                await self.started_turns.mark(msg.turn_id)
            try:
                reply = await self._call_worker(name, to_worker, self.start_timeout_s)
                break
            except Unreachable as exc:
                if attempt == START_ATTEMPTS:
                    await self._end(msg.session_id, turn_failed(msg, "harness_crashed", str(exc)))
                    return
                await self._await_exit(name)
            except Exception as exc:
                await self._end(
                    msg.session_id,
                    turn_failed(msg, "harness_crashed", f"the worker did not take the turn: {exc}"),
                )
                self.children.kill(name, "did not take a turn")
                return
        if reply.status != 200:
            await self._end(
                msg.session_id,
                turn_failed(msg, "harness_busy", f"the worker refused the turn ({reply.status})"),
            )
            return
        # Its worker runs it now: this actor crashing is no fault of the start's.
        await turn.deferred.hold()

    @handles(ResponseCompleted, ResponseFailed, ResponseCancelled)
    async def terminal(self, msg: Output, incoming: Incoming) -> None:
        session_id = incoming.env.session_id or ""
        turn = self.turns.get(session_id)
        if turn is None or turn.start.turn_id != msg.turn_id:
            # Nothing can answer its elicitations now.
            await self._cancel_parked_of(msg.turn_id, "turn_ended")
            held = self.holdings.get(session_id)
            if held and held.reply_to and msg.turn_id in (held.turn_id, held.ended):
                # An adopted worker's turn whose start was lost (dead-lettered): its end
                # still goes where the start said (dispatch drops one it has had).
                del self.holdings[session_id]
                await self._emit(held.reply_to, msg, session_id)
                return
            log.info("dropping a late terminal event for turn %s", msg.turn_id)
            return
        await self._end(session_id, msg)

    async def _end(self, session_id: str, event: Output) -> None:
        """Send a turn's one terminal event and forget the turn."""
        turn = self.turns.pop(session_id, None)
        if turn is None:
            return
        self.ending.add(turn.start.turn_id)
        try:
            # Nothing can answer an elicitation of an ended turn (an interrupt ends it at an
            # approval): cancelled before the terminal, so that the prompt closes in order
            # and the broker holds nothing parked for it.
            for elicitation_id in sorted(turn.elicitations):
                parked = self.parked.get(elicitation_id)
                if parked is not None and parked.verdict is None:
                    await self._cancel_parked(parked, "turn_ended")
            await self._emit(turn.start.reply_to, event, session_id)
            turn.deferred.ack()
        finally:
            self.ending.discard(turn.start.turn_id)
        state = self.workers.get(session_id)
        if state is not None:
            state.last_active = time.monotonic()
        waiting = self.waiting.pop(session_id, None)
        if waiting is not None:
            # The stale turn is over: the start that waited for it runs (its worker, if it
            # still lives, ended that turn before it said so).
            msg, deferred = waiting
            self.turns[session_id] = OwnedTurn(msg, deferred)
            self.in_order(session_id, lambda: self._start_turn(msg, deferred), deferred)

    async def _worker_died(self, session_id: str, last_exit: dict[str, Any]) -> None:
        turn = self.turns.get(session_id)
        state = self.workers.get(session_id)
        if turn is None or (state is not None and not state.exited):
            return
        code = "harness_crashed"
        for elicitation_id in sorted(turn.elicitations):
            parked = self.parked.get(elicitation_id)
            if parked is not None:
                code = "harness_restarted"
                await self._cancel_parked(parked, "harness_restarted")
        why = f"the harness worker died: {last_exit['reason']}"
        await self._end(session_id, turn_failed(turn.start, code, why))


def _spec_harness(spec: dict[str, Any]) -> str:
    executor = spec.get("executor") or {}
    harness = executor.get("harness") or (executor.get("config") or {}).get("harness")
    return str(harness or "scripted")
