"""The elicitations the harness actor's workers park: verdicts, cancellation, recovery.

A worker that needs a human's answer parks an elicitation in the broker (durable, until a
verdict or a cancel) and this part remembers it by id (E-01..E-03). A verdict goes to the
worker that parked it; an elicitation of a turn that ends unanswered is cancelled, with its
reason (``turn_ended``, ``harness_restarted``), before the turn's terminal event; and one a
killed predecessor left parked is kept, resolved or cancelled by what the adopted workers
hold. It is apart from :mod:`._turns` because an elicitation outlives the turn's handler
that parked it: the broker holds it across this actor's restarts.
"""

from __future__ import annotations

from ...bus import Incoming
from ...harnesses.protocol import Approval, ElicitationParked, ElicitationResolved, InputAccepted
from .._actor import handles
from .._deferred import Deferred
from ._base import turn_failed
from ._records import ParkedElicitation
from ._workers import WorkerPool


class Elicitations(WorkerPool):
    """The parked elicitations of the harness actor's turns."""

    @handles(ElicitationParked)
    async def elicitation_parked(self, msg: ElicitationParked, incoming: Incoming) -> None:
        await self.defer(incoming).park()
        self.parked[msg.elicitation_id] = ParkedElicitation(incoming, msg)
        turn = self.turns.get(msg.session_id)
        if turn is not None:
            turn.elicitations.add(msg.elicitation_id)

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
            turn_failed(
                msg, "harness_restarted", "the harness restarted while an elicitation was parked"
            ),
            msg.session_id,
        )

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
