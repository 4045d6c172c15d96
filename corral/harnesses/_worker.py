"""The harness worker process: one per session, running one agent turn at a time.

``python -m corral.harnesses._worker`` starts here, with its spec in ``CORRAL_WORKER``
(JSON). The process connects to the bus as ``harness/<session_id>`` with its own zmq
context, dies with the host (not with its parent, the harness actor: a crashed harness
actor's next incarnation adopts its workers, and asks each what it holds with
:class:`Inventory`), and serves inputs:

* :class:`TurnStart` starts a turn in a task: ``response.created``, ``response.in_progress``,
  then whatever the worker kind does through its :class:`TurnContext`, then exactly one of
  ``response.completed`` / ``response.failed`` / ``response.cancelled``;
* :class:`ToolResult`, :class:`Approval`, :class:`PolicyVerdict` resolve what the turn
  waits for; :class:`Interrupt` cancels the turn.

Deltas go to the turn's ``reply_to`` as stream messages, in batches (packed in
:class:`~.protocol.Deltas` for a ``reply_to`` that asked); terminal events and
elicitation requests go durably, so a restarting dispatch still gets them. Lifecycle events
are copied to the harness actor, which tracks in-flight turns (H-08) and worker liveness.

Every event of the turn sent to ``reply_to`` is also held until dispatch confirms it, and
sent again when dispatch's next incarnation asks (:mod:`._held`). What the worker kind sees
of its turn is :mod:`._turn`.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from typing import Any

import msgspec
import trio

from .. import logs
from .._child_env import take_hidden_env
from .._heap import release_when_quiet
from .._lifeline import die_with_host, host_lifeline
from .._proctitle import WORKER_TITLE_PREFIX, set_title
from ..bus import Incoming, Message, Outbox, Peer, open_peer
from ..config import BusSettings, LivenessSettings
from ._held import HeldEvents
from ._turn import TurnContext, TurnFailed, Verdict, WorkerKind, final_usage
from .protocol import (
    HARNESS_ACTOR,
    Approval,
    Confirmed,
    ElicitationParked,
    Holdings,
    InputAccepted,
    Interrupt,
    Inventory,
    Output,
    OutputTextDelta,
    PolicyVerdict,
    ReasoningDelta,
    Resend,
    Resending,
    ResponseCancelled,
    ResponseCompleted,
    ResponseCreated,
    ResponseFailed,
    ResponseInProgress,
    RuntimeModel,
    ToolResult,
    TurnStart,
    Warning,
    WorkerAlive,
    WorkerInbound,
    is_terminal,
    pack_deltas,
    worker_address,
)

log = logging.getLogger("corral.harnesses.worker")

#: Room an envelope takes around an event's body at most (ids, addresses, its type).
ENVELOPE_ROOM = 4096


class Worker:
    """The worker process's runtime: bus peer, inputs, the active turn."""

    def __init__(self, peer: Peer, session_id: str, kind: WorkerKind, liveness: LivenessSettings):
        self.peer = peer
        self.session_id = session_id
        self.kind = kind
        self.liveness = liveness
        self.turn: TurnContext | None = None
        #: The last turn this worker ended (its terminal sent or being sent).
        self.ended: str | None = None
        #: Where the events of its latest turn go.
        self.reply_to: str | None = None
        self._turn_scope: trio.CancelScope | None = None
        self._turn_done = trio.Event()
        self._turn_done.set()
        self.outbox = Outbox(peer, pack=self._pack)
        #: Who asked for its deltas packed (``TurnStart.batch``).
        self._packs: set[str] = set()
        self.held = HeldEvents()
        #: The nursery of :meth:`serve` (``TurnContext.services``).
        self.services: trio.Nursery | None = None

    async def send_output(self, to: str, event: Message, *, durable: bool) -> None:
        """Send an output event (durable ones wait until the broker has them).

        Stream events are batched: they queue here and go out together with one checkpoint
        when the turn next yields (a delta per send would cap a worker near 8k/s). Anything
        durable first flushes what is queued, so order holds. Terminal events go to the
        harness actor, which forwards them: it is the one place that ends a turn, so a turn
        never gets two terminal events (or none) whatever dies. A turn that outruns dispatch
        waits here once :data:`~._held.HELD_MAX` of its events are unconfirmed.
        """
        too_large = None
        if isinstance(event, Output):
            if is_terminal(event):
                to = HARNESS_ACTOR
            else:
                too_large = self._too_large(event)
                if too_large is not None:
                    # In its place, with its number (dispatch waits for every number): a
                    # warning that says why the turn fails.
                    log.warning("turn %s: %s", event.turn_id, too_large)
                    event = Warning(
                        turn_id=event.turn_id,
                        sequence_number=event.sequence_number,
                        kind="output_too_large",
                        message=too_large,
                    )
                if self.held.full():
                    # Flow control: dispatch confirms what it has; what is queued here
                    # must reach it first.
                    await self.outbox.flush()
                    await self.held.room()
                self.held.hold(to, event)
        if not durable:
            await self.outbox.put(to, event, session_id=self.session_id)
        else:
            await self.outbox.flush()
            await self.peer.cast(to, event, durable=True, session_id=self.session_id)
        if too_large is not None:
            raise TurnFailed("output_too_large", too_large)

    def _too_large(self, event: Output) -> str | None:
        """Why ``event`` cannot go over the bus (it is larger than a message may be), or
        None. Sent, it would fail in the outbox's task and take the worker down with it."""
        limit = self.peer.bus.max_message_bytes - ENVELOPE_ROOM
        if isinstance(event, OutputTextDelta | ReasoningDelta) and 4 * len(event.delta) < limit:
            return None  # UTF-8 takes 4 bytes a character at most: no encode per delta
        size = len(msgspec.msgpack.encode(event))
        if size <= limit:
            return None
        kind = event.__struct_config__.tag
        return f"a {kind} event of {size} bytes is larger than a bus message may be ({limit})"

    def _pack(self, to: str, msgs: list[Message]) -> list[Message]:
        if to not in self._packs:
            return msgs
        # A pack's text at most an eighth of the bus's limit: room for UTF-8 and the fields.
        return pack_deltas(msgs, self.peer.bus.max_message_bytes // 8)

    def _resend(self, msg: Resend) -> Resending:
        """Queue the held events of ``msg``'s turn again, oldest first; what is sent."""
        answer, events = self.held.again(msg.turn_id)
        for to, event in events:
            self.outbox.put_nowait(to, event, session_id=self.session_id)
        return answer

    async def flush_outputs(self) -> None:
        """Send every queued stream event now, in order."""
        await self.outbox.flush()

    async def park(self, turn: TurnContext, elicitation_id: str, params: dict[str, Any]) -> None:
        """Record a parked elicitation with the harness actor before announcing it."""
        await self.peer.cast(
            HARNESS_ACTOR,
            ElicitationParked(
                session_id=self.session_id,
                turn_id=turn.turn_id,
                elicitation_id=elicitation_id,
                owner=self.peer.name,
                incarnation=self.peer.incarnation,
                params=params,
                reply_to=turn.start.reply_to,
            ),
            durable=True,
            session_id=self.session_id,
        )

    async def serve(self) -> None:
        async with trio.open_nursery() as nursery:
            self.services = nursery
            nursery.start_soon(self._alive_loop)
            nursery.start_soon(self.outbox.run)
            async for incoming in self.peer.inbox:
                reply = await self._on_input(incoming, nursery)
                if reply is not None:
                    await self.peer.reply(incoming, reply)
                self.peer.ack(incoming)

    async def _alive_loop(self) -> None:
        """The worker's one heartbeat, every liveness interval whatever else it sends: the
        harness actor's supervisor kills a worker silent for its liveness window."""
        while True:
            await self.peer.cast(
                HARNESS_ACTOR,
                WorkerAlive(
                    session_id=self.session_id, busy=self.turn is not None, pid=os.getpid()
                ),
            )
            await trio.sleep(self.liveness.interval_s)

    async def _on_input(self, incoming: Incoming, nursery: trio.Nursery) -> Message | None:
        msg = incoming.msg
        turn = self.turn
        if isinstance(msg, TurnStart):
            if turn is not None:
                return InputAccepted(status=409, error={"code": "turn_in_flight"})
            self.turn = TurnContext(self, msg)
            self.reply_to = msg.reply_to
            if msg.batch:
                self._packs.add(msg.reply_to)
            else:
                self._packs.discard(msg.reply_to)
            self._turn_done = trio.Event()
            # From the start: an interrupt that comes before the turn reaches its harness
            # stops it there (the harness actor stops a stale turn as soon as it starts).
            self._turn_scope = trio.CancelScope()
            nursery.start_soon(self._run_turn, self.turn, self._turn_scope)
            return InputAccepted(status=200)
        if isinstance(msg, Confirmed):
            self.held.confirmed(msg)
            return None
        if isinstance(msg, Inventory):
            if turn is None:
                return Holdings(ended=self.ended, reply_to=self.reply_to)
            return Holdings(
                turn_id=turn.turn_id,
                elicitations=turn.elicitations(),
                ended=self.ended,
                reply_to=self.reply_to,
            )
        if isinstance(msg, Resend):
            return self._resend(msg)
        if isinstance(msg, Interrupt):
            if turn is None or self._turn_scope is None:
                return InputAccepted(status=404, error={"code": "no_turn"})
            self._turn_scope.cancel()
            return InputAccepted(status=204)
        key = _wait_key(msg)
        if key is not None:
            value: object = msg
            if isinstance(msg, Approval):
                value = Verdict(msg.action, msg.content or None)
            elif isinstance(msg, ToolResult):
                value = msg.output
            if turn is not None and turn.resolve(key, value):
                return InputAccepted(status=204)
            return InputAccepted(
                status=404,
                error={"code": "not_found", "message": f"nothing outstanding for {key!r}"},
            )
        return InputAccepted(status=422, error={"code": "unsupported", "type": incoming.env.type})

    async def _run_turn(self, turn: TurnContext, scope: trio.CancelScope) -> None:
        failed: tuple[str, str] | None = None
        cancelled = False
        try:
            await turn.emit(ResponseCreated(response=turn.response("queued")))
            await self.peer.cast(
                HARNESS_ACTOR, WorkerAlive(session_id=self.session_id, busy=True, pid=os.getpid())
            )
            await turn.emit(ResponseInProgress(response=turn.response("in_progress")))
            with scope:
                try:
                    await self.kind.run_turn(turn)
                    failed = turn.reported_failure
                except TurnFailed as exc:
                    failed = (exc.code, exc.message)
                except Exception as exc:
                    log.exception("turn %s failed", turn.turn_id)
                    failed = ("harness_error", f"{type(exc).__name__}: {exc}")
            cancelled = scope.cancelled_caught
            if cancelled:
                turn.drop_message()
            else:
                # A failed turn keeps what it said, as the server keeps a failed turn's text.
                try:
                    await turn.end_message()
                except TurnFailed as exc:  # the message is larger than the bus carries
                    failed = failed or (exc.code, exc.message)
            terminal: Output
            if cancelled:
                terminal = ResponseCancelled(response=turn.response("cancelled"))
            elif failed is not None:
                terminal = ResponseFailed(
                    error={"code": failed[0], "message": failed[1]},
                    response=turn.response("failed"),
                )
            else:
                observation = turn.observer.at_completion(failed=False)
                if observation is not None:
                    await turn.emit(RuntimeModel(**observation))
                response = {**turn.response("completed"), "usage": final_usage(turn)}
                terminal = ResponseCompleted(response=response)
            # Over before its terminal goes out: the broker delivers the terminal while its
            # commit runs, so the next turn's start can arrive before this emit returns.
            self._end(turn)
            await turn.emit(terminal, durable=True)
        finally:
            self._end(turn)
            with trio.CancelScope(shield=True), trio.move_on_after(2):
                await self.peer.cast(
                    HARNESS_ACTOR,
                    WorkerAlive(
                        session_id=self.session_id, busy=self.turn is not None, pid=os.getpid()
                    ),
                )

    def _end(self, turn: TurnContext) -> None:
        """Forget ``turn`` as the active one (unless a newer turn already replaced it)."""
        if self.turn is turn:
            self._turn_scope = None
            self.turn = None
            self.ended = turn.turn_id
            self._turn_done.set()


def _wait_key(msg: Message) -> str | None:
    if isinstance(msg, ToolResult):
        return f"tool:{msg.call_id}"
    if isinstance(msg, Approval):
        return f"elicit:{msg.elicitation_id}"
    if isinstance(msg, PolicyVerdict):
        return f"policy:{msg.evaluation_id}"
    return None


def load_kind(target: str, options: dict[str, Any]) -> WorkerKind:
    """Import ``module:Class`` and build the worker kind."""
    import importlib

    module_name, _, attr = target.partition(":")
    cls = getattr(importlib.import_module(module_name), attr)
    return cls(options)


async def run_worker(spec: dict[str, Any], host: int) -> None:
    """Connect and serve until SIGTERM, the harness actor's Stop, or the death of the host
    (``host``: a pidfd on it)."""
    bus = msgspec.convert(spec["bus"], BusSettings)
    liveness = msgspec.convert(spec["liveness"], LivenessSettings)
    kind = load_kind(spec["target"], spec.get("options", {}))
    name = worker_address(spec["session_id"])
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:

            async def stop_on_signal() -> None:
                async for _ in signals:
                    nursery.cancel_scope.cancel()

            nursery.start_soon(stop_on_signal)
            # From the first moment: a host that dies while the worker connects has no
            # broker left to connect to.
            nursery.start_soon(die_with_host, host)
            # One heartbeat: the WorkerAlive the worker sends the harness actor every
            # interval (``Worker._alive_loop``), which the broker sees as traffic too.
            async with open_peer(
                name,
                spec["endpoint"],
                bus=bus,
                liveness=liveness,
                heartbeat=False,
                accepts=WorkerInbound,
            ) as peer:
                nursery.start_soon(release_when_quiet, peer.traffic)
                await Worker(peer, spec["session_id"], kind, liveness).serve()
            nursery.cancel_scope.cancel()


def main() -> None:
    """Entry point of a harness worker process."""
    take_hidden_env()  # its API key, which its environ block must not show
    spec = json.loads(os.environ.pop("CORRAL_WORKER"))
    # Not PR_SET_PDEATHSIG: the kernel sends it when the parent dies, and the harness actor's
    # crash must leave its workers to its next incarnation (they are reparented to the host).
    host = host_lifeline(int(spec["host_pid"]), spec["host_start"])
    set_title(f"{WORKER_TITLE_PREFIX}{spec['session_id']}")
    logs.setup("worker", session=spec["session_id"])
    try:
        load_kind(spec["target"], spec.get("options", {}))
    except Exception:
        log.exception("cannot load harness %s", spec["target"])
        sys.exit(78)
    trio.run(run_worker, spec, host)


if __name__ == "__main__":
    # Run the imported module's main, not this __main__ copy: one copy of the worker's
    # classes in the process, the one that corral.harnesses._worker names.
    from corral.harnesses._worker import main as real_main

    real_main()
