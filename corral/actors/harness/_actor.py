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

The actor is a chain of parts (see ``_base``): ``_workers`` the session workers,
``_elicitations`` the parked elicitations, ``_turns`` the life of a turn; this module adds
its lifecycle (adopting a predecessor's workers, :mod:`._adopt`), its inspection snapshot and
what a worker's exit does.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ...harnesses.protocol import ElicitationParked, worker_address
from .._actor import ActorContext
from .._children import ChildEvent, Exited, GaveUp
from ._adopt import adopt_workers, ask_holdings
from ._records import ParkedElicitation
from ._turns import TurnLife

log = logging.getLogger("corral.actors.harness")


class HarnessActor(TurnLife):
    """Supervises harness workers and owns the life of every turn."""

    def __init__(self, ctx: ActorContext, peer: Any) -> None:
        super().__init__(ctx, peer)
        # Wired at the top of the chain, where what a worker's exit does is defined.
        self.children.on_event = self._on_worker_event

    async def setup(self) -> None:
        assert self.nursery is not None
        if self.zygote is not None:
            # Started first: it imports while this actor adopts and hears from its workers.
            await self.nursery.start(self.zygote.run)
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
            "zygote": None if self.zygote is None else self.zygote.statistics(),
            # What this actor keeps per session beyond its live workers (bounded: H-08).
            "records": {"workers": len(self.workers), "children": len(self.children.children)},
        }

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
