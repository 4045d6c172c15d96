"""Sub-agent work: registering a dispatched child, and delivering its result to the parent.

:class:`SubagentWork` is the part of :class:`~._actor.DispatchActor` on top of the session
routes. The registry itself (what is durable, in which order, and what each crash does) is
:mod:`._subagents`; this part does the I/O a recorded result needs, in the background so
that no turn and no handler waits on it:

* the result into the parent's inbox: :class:`~corral.actors.tools.messages.InboxPush` to
  the tools actor, a durable call asked again (with the same key, which the inbox keeps once)
  until the tools actor answers — it may be restarting;
* ``session.child_session.updated`` on the parent's stream (S-22, S-23);
* the parent's wake, ``POST /v1/sessions/{parent}/events`` with the §J step 7 message, asked
  again while the server is unavailable; a server that refuses it (the parent is gone) ends
  the delivery, logged.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable

import trio

from ..._exceptions import ServerRejected
from ...server_client import pick_server
from ..tools.messages import InboxPush
from ._http import SessionRoutes
from ._subagents import WorkEntry, child_task_status, truncate_preview
from .messages import (
    SubagentCancel,
    SubagentDispatched,
    SubagentDrained,
    SubagentRegistered,
    SubagentTask,
)

log = logging.getLogger("corral.actors.dispatch")

#: Backoff of a delivery step that failed: first wait, and the most it grows to.
RETRY_BASE_S = 0.2
RETRY_CAP_S = 5.0
#: How long one push waits for the tools actor's answer.
PUSH_TIMEOUT_S = 15.0


class SubagentWork(SessionRoutes):
    """Sub-agent work entries and their results: a part of :class:`~._actor.DispatchActor`."""

    async def _register_work(self, msg: SubagentDispatched) -> SubagentRegistered:
        """Record a dispatched child's entry (a redelivered registration is a no-op), or close
        an abandoned one."""
        entry = WorkEntry(
            dispatch_id=msg.dispatch_id,
            parent_id=msg.parent_session_id,
            child_id=msg.child_session_id,
            agent=msg.agent,
            title=msg.title,
            runner_id=msg.runner_id,
        )
        if msg.abandoned:
            await self.work.abandon(entry)
            return SubagentRegistered(dispatch_id=msg.dispatch_id)
        if await self.work.add(entry):
            log.info(
                "session %s: sub-agent %s:%s is child %s (%s)",
                msg.parent_session_id,
                msg.agent,
                msg.title,
                msg.child_session_id,
                msg.dispatch_id,
            )
        return SubagentRegistered(dispatch_id=msg.dispatch_id)

    async def _cancel_work(self, msg: SubagentCancel) -> SubagentTask:
        """The caller's latest work on the child (S-52: only the caller's), ended
        ``cancelled`` first when ``msg.confirm`` and it is still open (S-49)."""
        mine = [
            e
            for e in self.work.entries.values()
            if e.child_id == msg.child_session_id and e.parent_id == msg.parent_session_id
        ]
        if not mine:
            return SubagentTask(found=False)
        if msg.confirm and any(not e.terminal for e in mine):
            await self.work.ended(msg.child_session_id, None, "cancelled", "")
        latest = max(mine, key=lambda e: e.created_at)
        return SubagentTask(found=True, status=latest.status)

    async def _work_drained(self, msg: SubagentDrained) -> None:
        """The parent took these results from its inbox (S-17)."""
        for entry in await self.work.drained(msg.parent_session_id, msg.work_ids):
            log.info("session %s: took sub-agent result %s", entry.parent_id, entry.key)

    def _work_started(self, entry: WorkEntry) -> None:
        """``WorkRegistry.on_started``: the parent's stream sees the child busy (§J step 6)."""
        assert self.nursery is not None
        self.nursery.start_soon(self._tell_parent, entry)

    def _result_recorded(self, entry: WorkEntry) -> None:
        """``WorkRegistry.on_result``: deliver the entry's result in the background."""
        assert self.nursery is not None
        self.nursery.start_soon(self._deliver, entry)

    async def _deliver(self, entry: WorkEntry) -> None:
        """Push, tell and wake, each step marked when done: what a crash cut off is done again
        by the next incarnation (``WorkRegistry.load``)."""
        if entry.dispatch_id in self._delivering:
            return
        self._delivering.add(entry.dispatch_id)
        try:
            if not entry.pushed:
                self._crash_point("subagent_recorded")
                await self._retrying(entry, "push", functools.partial(self._push, entry))
                self._crash_point("subagent_pushed")
                entry.pushed = True
                await self.work.save(entry)
            if not entry.woken:
                await self._tell_parent(entry)
                # Woken even if its running turn took the result already (omnigent's runner
                # wakes at delivery, too): an agent's script counts on one wake per result.
                await self._retrying(entry, "wake", functools.partial(self._wake, entry))
                entry.woken = True
                await self.work.save(entry)
        finally:
            self._delivering.discard(entry.dispatch_id)

    async def _retrying(
        self, entry: WorkEntry, what: str, step: Callable[[], Awaitable[None]]
    ) -> None:
        """``step()`` until it succeeds, with backoff (a result is never given up on while a
        receiver is only away); each failure logged."""
        delay = RETRY_BASE_S
        while True:
            try:
                await step()
                return
            except Exception as exc:
                log.warning(
                    "sub-agent result %s: %s failed (%s: %s); again in %.1fs",
                    entry.key,
                    what,
                    type(exc).__name__,
                    exc,
                    delay,
                )
            await trio.sleep(delay)
            delay = min(delay * 2, RETRY_CAP_S)

    async def _push(self, entry: WorkEntry) -> None:
        if self.options.tools is None:
            raise RuntimeError("this host runs no tools actor to hold the parent's inbox")
        push = InboxPush(session_id=entry.parent_id, key=entry.key, item=entry.inbox_item())
        await self.peer.call(
            self.options.tools,
            push,
            durable=True,
            timeout=PUSH_TIMEOUT_S,
            session_id=entry.parent_id,
        )

    async def _wake(self, entry: WorkEntry) -> None:
        server = pick_server(self.server, self.servers, entry.runner_id)
        if server is None:
            log.warning(
                "sub-agent result %s: no server to wake session %s on; it reads its inbox "
                "at its next turn",
                entry.key,
                entry.parent_id,
            )
            return
        try:
            await server.post_event(
                entry.parent_id, entry.wake_message(), idempotency_key=f"wake-{entry.key}"
            )
        except ServerRejected as exc:
            log.warning(
                "sub-agent result %s: the server refused to wake session %s (%s); the result "
                "waits in its inbox",
                entry.key,
                entry.parent_id,
                exc.status,
            )

    async def _tell_parent(self, entry: WorkEntry) -> None:
        """``session.child_session.updated`` on the parent's stream: the child busy (its work
        began) or done (its result recorded), its status mapped as S-22 says."""
        parent = await self._known(entry.parent_id)
        if parent is None:
            return
        busy = not entry.terminal
        child = await self._known(entry.child_id)
        state: dict[str, object] = {
            "id": entry.child_id,
            "title": f"{entry.agent}:{entry.title}",
            "tool": entry.agent,
            "session_name": entry.title,
            "busy": busy,
        }
        fallback = "running" if busy else "idle"
        status = child_task_status(child.record.status if child is not None else fallback)
        if status is not None:
            state["current_task_status"] = status
        if busy:
            state["last_task_error"] = None
        elif entry.output:
            state["last_message_preview"] = truncate_preview(entry.output)
        event = {
            "type": "session.child_session.updated",
            "conversation_id": entry.parent_id,
            "child_session_id": entry.child_id,
            "child": state,
        }

        async def publish() -> None:
            await self._publish_runner_events(parent, parent.turn, [event])

        # As a tool's events go (``_runner_event``): behind the parent's turn's own events
        # when that turn is not in order yet.
        turn = parent.turn
        if turn is not None and not (turn.in_order and not turn.later):
            turn.later.append((publish, None))
        else:
            self._queue_run(parent, publish, None)
