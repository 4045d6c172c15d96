"""The harness actor: one supervised worker process per session, and the turns they run.

What it handles and answers is the table in :mod:`corral.actors.harness.messages`.

Every turn ends with exactly one terminal event sent to its ``reply_to``: the worker's own,
or — when the worker exits or stops heartbeating mid-turn — ``response.failed`` with code
``harness_crashed`` (``harness_restarted`` when it had parked an elicitation, which is then
resolved ``cancel`` with that reason). The TurnStart message stays unacked in this actor's
mailbox until then, and turn ids are recorded as started (fsynced) before a worker sees
them. If this actor itself is killed, its workers live on (they die with the host) and its
next incarnation adopts them (:mod:`._adopt`): the redelivered TurnStart of a turn an
adopted worker still runs, or has just ended, is owned again without being sent again, and
the worker's terminal ends it; that of a started turn no live worker holds ends ``failed``
(``harness_restarted``) instead of running twice.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import Any

import msgspec
import trio

from ..._exceptions import BusError, RestartIntensityExceeded, Unreachable
from ...bus import Dedup, Incoming, Message, Request
from ...harnesses import resolve as resolve_harness
from ...harnesses.protocol import (
    Approval,
    ElicitationParked,
    ElicitationResolved,
    Holdings,
    InputAccepted,
    Interrupt,
    Output,
    PolicyVerdict,
    ResponseCancelled,
    ResponseCompleted,
    ResponseFailed,
    ToolResult,
    TurnStart,
    WorkerAlive,
    worker_address,
)
from ...harnesses.spawn_env import SpawnEnvError, build_spawn_env
from .._actor import Actor, ActorContext, every, handles
from .._children import ChildEvent, ChildSupervisor, Exited, GaveUp
from .._deferred import Deferred
from .._specs import Backoff, Liveness, SupFlags
from ._adopt import (
    adopt_workers,
    ask_holdings,
    host_record,
    take_back,
    worker_record,
    worker_spec,
)
from ._options import HarnessOptions
from ._records import OwnedTurn, ParkedElicitation, WorkerState

log = logging.getLogger("corral.actors.harness")

#: The inputs this actor passes on to the session's worker as they are.
Forwarded = ToolResult | PolicyVerdict | Interrupt

#: Exit code of a worker that could not load its harness implementation.
EXIT_CANNOT_LOAD = 78

#: How many workers a turn's start tries (each after the first replaces one that died while
#: it started or as the turn reached it, a restart counted against the session's budget).
START_ATTEMPTS = 3

#: Turn ids an incarnation remembers taking a start of (about 40 bytes each): a second start
#: of a turn comes from a dispatch restarted seconds after the first, so thousands are plenty.
TAKEN_KEPT = 4096


class HarnessActor(Actor):
    """Supervises harness workers and owns the life of every turn."""

    def __init__(self, ctx: ActorContext, peer: Any) -> None:
        super().__init__(ctx, peer)
        opts = msgspec.convert(ctx.options, HarnessOptions)
        self.idle_timeout_s = opts.idle_timeout_s
        self.start_timeout_s = opts.start_timeout_s
        live = peer.liveness
        self.liveness_s = opts.worker_liveness_s or live.interval_s * live.liveness
        self.crash_backoff_s = opts.crash_backoff_s
        self.extra_harnesses: dict[str, str] = dict(opts.harnesses)
        self.run_dir = ctx.data_dir / "workers"
        self.started_turns = Dedup(ctx.data_dir / "started-turns")
        # A worker is needed again only by its session's next turn: after a crash it is
        # restarted then (on demand), backed off and counted per session like any restart.
        self.children = ChildSupervisor(
            SupFlags(
                intensity=opts.worker_intensity,
                period_s=opts.worker_period_s,
                intensity_per="child",
                # Every wait is capped at 10 s, the first one too.
                backoff=Backoff(first_s=min(opts.crash_backoff_s, 10.0), max_s=10.0),
                liveness=Liveness(window_s=self.liveness_s, check_s=0.25),
            ),
            run_dir=self.run_dir,
            on_event=self._on_worker_event,
            record=host_record(),
        )
        self.workers: dict[str, WorkerState] = {}
        self.turns: dict[str, OwnedTurn] = {}
        #: A session's newest start, waiting for the stale turn this actor still holds to
        #: end (:meth:`_supersede`).
        self.waiting: dict[str, tuple[TurnStart, Deferred]] = {}
        self.parked: dict[str, ParkedElicitation] = {}
        #: What the workers adopted from a previous incarnation hold, by session, until
        #: their turns' redelivered starts are owned again (:func:`._adopt.take_back`).
        self.holdings: dict[str, Holdings] = {}
        #: Turns whose terminal is being sent (their start is acked once it is out).
        self.ending: set[str] = set()
        #: Turns a previous incarnation left behind and this one already ended.
        self.ended_turns: set[str] = set()
        #: Turns this incarnation took a start of (held now, or ended), newest last, bounded.
        self.taken: OrderedDict[str, None] = OrderedDict()
        self.stats = {"spawned": 0, "crashed": 0, "reaped": 0, "turns": 0}

    # --- lifecycle -------------------------------------------------------------------------

    async def setup(self) -> None:
        assert self.nursery is not None
        await self.nursery.start(self.children.run)
        # A killed predecessor's workers live on: adopted, each says what it holds.
        self.workers.update(adopt_workers(self.children, self.run_dir))
        self.holdings = await ask_holdings(self.peer, self.children, self.workers, self.liveness_s)
        for session_id in self.workers.keys() - self.holdings.keys():
            self.children.kill(worker_address(session_id), "did not say what it holds")
        self.nursery.start_soon(self.children.watch_liveness, self._last_seen)
        for incoming, _age in await self.peer.parked():
            if isinstance(incoming.msg, ElicitationParked):
                await self._recover_parked(ParkedElicitation(incoming, incoming.msg))

    async def _recover_parked(self, parked: ParkedElicitation) -> None:
        """An elicitation a previous incarnation left parked: kept while its adopted worker
        waits on it (the turn's redelivered start ties it to the turn again); resolved if
        that worker's turn went past it (its verdict arrived, its unpark was lost); cancelled
        otherwise — and then, with no worker to end it, its turn ends ``harness_restarted``."""
        msg = parked.msg
        held = self.holdings.get(msg.session_id)
        if held is not None and held.turn_id == msg.turn_id:
            if msg.elicitation_id in held.elicitations:
                self.parked[msg.elicitation_id] = parked
            else:
                await self.peer.unpark(parked.incoming.env.id, "resolved")
            return
        if held is not None and held.ended == msg.turn_id:
            # The worker's terminal is on its way; an ended turn's elicitations close first.
            await self._cancel_parked(parked, "turn_ended")
            return
        await self._cancel_parked(parked, "harness_restarted")
        if msg.turn_id in self.ended_turns:
            return
        # Its TurnStart will be redelivered too; it must not end the turn again.
        self.ended_turns.add(msg.turn_id)
        await self._emit(
            msg.reply_to,
            _failed(
                msg, "harness_restarted", "the harness restarted while an elicitation was parked"
            ),
            msg.session_id,
        )

    async def terminate(self) -> None:
        await self.children.stop_all()

    def snapshot(self) -> dict[str, Any]:
        now = time.monotonic()
        return {
            **super().snapshot(),
            **self.stats,
            "workers": [
                {
                    "session_id": w.session_id,
                    "harness": w.harness,
                    "in_flight": w.session_id in self.turns,
                    "idle_s": round(now - w.last_active, 3),
                    "crashes": c.restarts if c else 0,
                    "pid": c.pid if c else None,
                }
                for w in self.workers.values()
                if not w.exited
                for c in [self.children.children.get(worker_address(w.session_id))]
            ],
            "parked": sorted(self.parked),
            # What this actor keeps per session beyond its live workers (bounded: H-08).
            "records": {"workers": len(self.workers), "children": len(self.children.children)},
        }

    # --- turns -----------------------------------------------------------------------------

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
            failed = _failed(msg, "harness_restarted", "the harness restarted during this turn")
            self.in_order(session_id, lambda: self._refuse(msg, deferred, failed), deferred)
            return
        log.info("turn %s waits for stale turn %s to end", msg.turn_id, held.start.turn_id)
        before = self.waiting.pop(session_id, None)
        self.waiting[session_id] = (msg, deferred)
        if before is not None:
            # Over for dispatch too: a newer start came after it.
            failed = _failed(before[0], "superseded", "a newer turn of this session started")
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
            failed = _failed(msg, "superseded", "a newer turn of this session started")
            await self._end(msg.session_id, failed)
            return
        if self.started_turns.seen(msg.turn_id):
            state = self.workers.get(msg.session_id)
            if take_back(turn, self.holdings, state, self.parked):
                await turn.deferred.hold()
                return
            await self._cancel_parked_of(msg.turn_id, "harness_restarted")
            failed = _failed(msg, "harness_restarted", "the harness restarted during this turn")
            await self._end(msg.session_id, failed)
            return
        attempt = deferred.incoming.env.attempt
        if 1 < attempt >= self.peer.bus.max_attempts:
            # The broker's last delivery: were it to fail too, the start would be
            # dead-lettered and nothing would ever end the turn.
            tries = "once" if attempt == 2 else f"{attempt - 1} times"
            why = f"the harness failed to start this turn {tries}; it is not tried again"
            await self._end(msg.session_id, _failed(msg, "harness_crashed", why))
            return
        harness = msg.harness or msg.harness_override or _spec_harness(msg.spec)
        try:
            target = resolve_harness(harness, self.extra_harnesses)
            env = build_spawn_env(harness, msg.spec, model_override=msg.model_override)
        except KeyError:
            await self._end(
                msg.session_id, _failed(msg, "unknown_harness", f"no harness named {harness!r}")
            )
            return
        except SpawnEnvError as exc:
            await self._end(
                msg.session_id, _failed(msg, "turn_setup_failed", f"turn setup failed: {exc}")
            )
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
                await self._end(msg.session_id, _failed(msg, "harness_unavailable", error))
                return
            # Marked only now, with its worker up: a crash before this point (the spawn takes
            # the most time) left nothing of the turn run, and its redelivered start begins
            # it afresh instead of failing it ``harness_restarted``.
            if not self.started_turns.seen(msg.turn_id):
                await self.started_turns.mark(msg.turn_id)
            try:
                reply = await self._call_worker(name, msg, self.start_timeout_s)
                break
            except Unreachable as exc:
                if attempt == START_ATTEMPTS:
                    await self._end(msg.session_id, _failed(msg, "harness_crashed", str(exc)))
                    return
                await self._await_exit(name)
            except Exception as exc:
                await self._end(
                    msg.session_id,
                    _failed(msg, "harness_crashed", f"the worker did not take the turn: {exc}"),
                )
                self.children.kill(name, "did not take a turn")
                return
        if reply.status != 200:
            await self._end(
                msg.session_id,
                _failed(msg, "harness_busy", f"the worker refused the turn ({reply.status})"),
            )
            return
        # Its worker runs it now: this actor crashing is no fault of the start's.
        await turn.deferred.hold()

    async def _call_worker(
        self, name: str, msg: Request[InputAccepted], timeout: float
    ) -> InputAccepted:
        """Call a worker, giving up at once if its process exits meanwhile.

        Raises:
            Unreachable: the worker is gone (or went while the call was under way).
        """
        child = self.children.children.get(name)
        reply: InputAccepted | None = None
        error: BusError | None = None
        async with trio.open_nursery() as nursery:

            async def watch_exit() -> None:
                if child is not None:
                    await child.exited.wait()
                    nursery.cancel_scope.cancel()

            async def call() -> None:
                nonlocal reply, error
                try:
                    reply = await self.peer.call(name, msg, timeout=timeout)
                except BusError as exc:
                    error = exc
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch_exit)
            nursery.start_soon(call)
        if error is not None:
            raise error
        if reply is None:
            raise Unreachable(f"the worker {name!r} exited")
        return reply

    async def _await_exit(self, name: str) -> None:
        child = self.children.children.get(name)
        if child is not None:
            with trio.move_on_after(5):
                await child.exited.wait()
        state = self.workers.get(name.removeprefix("harness/"))
        if state is not None and not state.exited:
            state.exited = True
            state.exited_at = time.monotonic()

    async def _ensure_worker(
        self, session_id: str, harness: str, target: str, env: dict[str, str]
    ) -> tuple[str | None, bool]:
        """Spawn the session's worker if needed and wait until it is up: an error or None,
        and whether the worker died while it started (a kill, a crash: another may start;
        not one that cannot load its harness or did not start in time)."""
        name = worker_address(session_id)
        state = self.workers.get(session_id)
        child = self.children.children.get(name)
        alive = state is not None and not state.exited and child is not None and child.pid
        if alive and state is not None and state.harness == harness:
            return None, False
        if child is not None and child.state.up:
            # A worker on its way out (reaped, or another harness): let it finish first.
            await self.children.stop_child(name)
        new = WorkerState(session_id=session_id, harness=harness)
        self.workers[session_id] = new
        record = self.children.record
        spec = {
            "session_id": session_id,
            "target": target,
            "endpoint": self.peer.endpoint,
            "host_pid": record["host_pid"],
            "host_start": record["host_start"],
            "bus": msgspec.to_builtins(self.peer.bus),
            "liveness": msgspec.to_builtins(self.peer.liveness),
            "options": {},
        }
        child_env = {**env, "CORRAL_WORKER": msgspec.json.encode(spec).decode()}
        try:
            # A crashed worker's restart waits out its backoff here: the first crash in the
            # period respawns at once, each further one doubles the wait.
            child = await self.children.start_child(
                worker_spec(session_id, harness, child_env),
                record=worker_record(session_id, harness),
            )
        except RestartIntensityExceeded as exc:
            new.exited = True
            return str(exc), False
        except OSError as exc:
            new.exited = True
            return f"the {harness!r} harness could not start: {exc}", False
        new.pid = child.pid
        self.stats["spawned"] += 1
        with trio.move_on_after(self.start_timeout_s):
            await child.settled()
        if child.ready.is_set():
            return None, False
        exit_info = child.last_exit if child.exited.is_set() else None
        if exit_info and exit_info["code"] == EXIT_CANNOT_LOAD:
            return f"the {harness!r} harness could not be loaded ({target})", False
        if exit_info:
            why = f"the {harness!r} harness worker exited at start: {exit_info['reason']}"
            return why, True
        self.children.kill(name, "did not start in time")
        late = f"the {harness!r} harness worker did not start within {self.start_timeout_s:g}s"
        return late, False

    # --- inputs forwarded to workers -------------------------------------------------------

    @handles(Forwarded)
    async def forward(self, msg: Forwarded, incoming: Incoming) -> None:
        deferred = self.defer(incoming)
        self.in_order(msg.session_id, lambda: self._forward(msg, deferred), deferred)

    async def _forward(self, msg: Forwarded, deferred: Deferred) -> None:
        incoming = deferred.incoming
        state = self.workers.get(msg.session_id)
        if state is None or state.exited:
            await self.peer.reply(incoming, InputAccepted(status=404, error={"code": "no_worker"}))
            deferred.ack()
            return
        try:
            reply = await self._call_worker(worker_address(msg.session_id), msg, 10)
        except Exception as exc:
            reply = InputAccepted(
                status=503, error={"code": "worker_unreachable", "message": str(exc)}
            )
        await self.peer.reply(incoming, reply)
        deferred.ack()

    @handles(Approval)
    async def approval(self, msg: Approval, incoming: Incoming) -> InputAccepted | None:
        parked = self.parked.get(msg.elicitation_id)
        if parked is None or parked.msg.session_id != msg.session_id:
            return InputAccepted(
                status=404,
                error={
                    "code": "not_found",
                    "message": f"no outstanding elicitation {msg.elicitation_id!r}",
                },
            )
        deferred = self.defer(incoming)
        self.in_order(
            msg.session_id, lambda: self._deliver_verdict(msg, deferred, parked), deferred
        )
        return None

    async def _deliver_verdict(
        self, msg: Approval, deferred: Deferred, parked: ParkedElicitation
    ) -> None:
        parked.verdict = msg.action
        try:
            reply = await self._call_worker(parked.msg.owner, msg, 10)
        except Exception as exc:
            reply = InputAccepted(
                status=503, error={"code": "worker_unreachable", "message": str(exc)}
            )
        if reply.status == 204:
            self.parked.pop(msg.elicitation_id, None)
            await self.peer.unpark(parked.incoming.env.id, "resolved", msg.action)
            turn = self.turns.get(msg.session_id)
            if turn is not None:
                turn.elicitations.discard(msg.elicitation_id)
        else:
            parked.verdict = None
            turn = self.turns.get(msg.session_id)
            ended = turn is None or msg.elicitation_id not in turn.elicitations
            if ended and self.parked.get(msg.elicitation_id) is parked:
                # Its turn ended while the verdict was on its way: nothing can answer it now.
                await self._cancel_parked(parked, "turn_ended")
        await self.peer.reply(deferred.incoming, reply)
        deferred.ack()

    @handles(ElicitationParked)
    async def elicitation_parked(self, msg: ElicitationParked, incoming: Incoming) -> None:
        await self.defer(incoming).park()
        self.parked[msg.elicitation_id] = ParkedElicitation(incoming, msg)
        turn = self.turns.get(msg.session_id)
        if turn is not None:
            turn.elicitations.add(msg.elicitation_id)

    # --- outputs: terminal events and liveness ---------------------------------------------

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

    @handles(WorkerAlive)
    async def alive(self, msg: WorkerAlive, incoming: Incoming) -> None:
        state = self.workers.get(msg.session_id)
        if state is None or state.exited:
            return
        child = self.children.children.get(worker_address(msg.session_id))
        if child is None or child.pid != msg.pid:
            return
        now = time.monotonic()
        state.last_seen = now
        self.children.mark_ready(worker_address(msg.session_id))
        if msg.busy or msg.session_id in self.turns:
            state.last_active = now

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

    async def _emit(self, to: str, event: Message, session_id: str) -> None:
        try:
            await self.peer.cast(to, event, durable=True, session_id=session_id)
        except Exception:
            log.exception("could not deliver %s to %s", type(event).__name__, to)

    def _last_seen(self, name: str) -> float | None:
        """A worker's last heartbeat (its WorkerAlive), for the supervisor's liveness."""
        state = self.workers.get(name.removeprefix("harness/"))
        return state.last_seen if state is not None and not state.exited else None

    def _on_worker_event(self, event: ChildEvent) -> None:
        match event:
            case Exited(name, last_exit):
                self._on_worker_exit(name, last_exit)
            case GaveUp(name):
                log.warning("%s", event.message(f"the worker {name!r}"))

    def _on_worker_exit(self, name: str, last_exit: dict[str, Any]) -> None:
        session_id = name.removeprefix("harness/")
        state = self.workers.get(session_id)
        if state is not None and state.pid not in (None, last_exit.get("pid")):
            return  # an earlier worker of the session; its successor is already up
        self.holdings.pop(session_id, None)
        if state is not None:
            state.exited = True
            state.exited_at = time.monotonic()
        if last_exit["code"] != 0:
            self.stats["crashed"] += 1
        if session_id in self.turns:
            self.in_order(session_id, lambda: self._worker_died(session_id, last_exit))

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
        await self._end(session_id, _failed(turn.start, code, why))

    async def _cancel_parked_of(self, turn_id: str, reason: str) -> None:
        """Cancel what ``turn_id`` has parked and is not being answered."""
        for parked in [p for p in self.parked.values() if p.msg.turn_id == turn_id]:
            if parked.verdict is None:
                await self._cancel_parked(parked, reason)

    async def _cancel_parked(self, parked: ParkedElicitation, reason: str) -> None:
        msg = parked.msg
        self.parked.pop(msg.elicitation_id, None)
        await self.peer.unpark(parked.incoming.env.id, "cancelled", reason)
        await self._emit(
            msg.reply_to,
            ElicitationResolved(
                turn_id=msg.turn_id,
                elicitation_id=msg.elicitation_id,
                action="cancel",
                reason=reason,
            ),
            msg.session_id,
        )

    @every(0.25)
    async def _reap_workers(self) -> None:
        """Stop idle workers (H-08) and forget exited ones that nothing needs any more.

        Liveness is not checked here: the supervisor does it (``watch_liveness``), from the
        workers' heartbeats, as the host does for actors.
        """
        now = time.monotonic()
        for session_id, state in list(self.workers.items()):
            name = worker_address(session_id)
            child = self.children.children.get(name)
            if state.exited:
                period = self.children.flags.period_s
                if session_id not in self.turns and state.reclaimable(child, now, period):
                    if child is not None:
                        self.children.forget(name)
                    del self.workers[session_id]
                continue
            if child is None or not child.ready.is_set():
                continue
            if (
                self.idle_timeout_s > 0
                and session_id not in self.turns
                and now - state.last_active > self.idle_timeout_s
            ):
                log.info("reaping idle worker %s", name)
                self.stats["reaped"] += 1
                state.exited = True
                state.exited_at = now
                self.nursery.start_soon(self.children.stop_child, name)  # type: ignore[union-attr]


def _spec_harness(spec: dict[str, Any]) -> str:
    executor = spec.get("executor") or {}
    harness = executor.get("harness") or (executor.get("config") or {}).get("harness")
    return str(harness or "scripted")


def _failed(msg: TurnStart | ElicitationParked, code: str, message: str) -> ResponseFailed:
    return ResponseFailed(turn_id=msg.turn_id, error={"code": code, "message": message})
