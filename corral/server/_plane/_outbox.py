"""Forwards to the runner through the durable outbox (messages and verdicts).

:class:`OutboxDelivery` is the part of :class:`ControlPlane` that sends each session's
outbox, in order, while the session's stream is open: a forward the runner could not take
(offline, tunnel dropped, a 5xx) stays and goes again, up to ``max_delivery_attempts``; its
outcome is stored with a ``session.input.consumed`` or ``session.delivery_failed`` event, and
handed to a request handler that waits for it.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
import trio

from ..._jsonlines import JsonObject
from .._mcp import error_detail
from .._tunnel import RunnerGone, RunnerLink, TunnelResponse
from ._binding import _Binding
from ._parts import PlaneParts

log = logging.getLogger("corral.server")


#: Delivery outcomes kept for request handlers that have not looked yet.
_KEPT_DELIVERIES = 1024


class _Delivery:
    """The outcome of one outbox entry, for a request handler waiting on it."""

    def __init__(self) -> None:
        self.done = trio.Event()
        self.status: int | None = None
        self.body: Any = None


class OutboxDelivery(PlaneParts):
    """The outbox of a :class:`ControlPlane`: delivering each session's forwards, in order."""

    async def _await_delivery(self, session_id: str, entry_id: int) -> _Delivery | None:
        """Wake the session's deliverer and wait (bounded) for entry ``entry_id``'s answer."""
        delivery = self._deliveries.setdefault(entry_id, _Delivery())
        self._wake_outbox(session_id)
        try:
            if self.link is not None:
                with trio.move_on_after(self.options.deliver_wait_s):
                    await delivery.done.wait()
        finally:
            self._deliveries.pop(entry_id, None)
        return delivery if delivery.done.is_set() else None

    def _wake_outbox(self, session_id: str) -> None:
        event = self._outbox_wake.pop(session_id, None)
        if event is not None:
            event.set()

    async def _deliver_loop(self, link: RunnerLink, session_id: str, binding: _Binding) -> None:
        """Send the session's outbox to the runner, in order, while its stream is open."""
        with binding.scope():
            await self._deliver_outbox(link, session_id, binding)

    async def _deliver_outbox(self, link: RunnerLink, session_id: str, binding: _Binding) -> None:
        while not link.closed.is_set():
            await binding.wait_ready()
            wake = self._outbox_wake.setdefault(session_id, trio.Event())
            entry = await self.store.next_outbox(session_id)
            if entry is None:
                await wake.wait()
                continue
            try:
                await self._deliver(link, entry)
            except Exception:
                log.exception(
                    "session %s: forwarding %s %d failed", session_id, entry.kind, entry.id
                )
                await trio.sleep(self.options.retry_cap_s)

    async def _deliver(self, link: RunnerLink, entry: Any) -> None:
        opts = self.options
        path = f"/v1/sessions/{entry.session_id}/events"
        answer: TunnelResponse | None
        try:
            answer = await link.request(
                "POST", path, body=entry.body, timeout_s=opts.request_timeout_s
            )
        except RunnerGone as exc:
            if link.closed.is_set():
                return  # sent again when the runner is back
            status, detail, answer = None, str(exc), None
        else:
            status, detail = answer.status, error_detail(answer.json(), answer.body)
        if answer is None or status is None or status >= 500:
            attempts = await self.store.count_attempt(entry.id)
            if attempts < opts.max_delivery_attempts:
                delay = min(opts.retry_base_s * 2 ** (attempts - 1), opts.retry_cap_s)
                log.warning(
                    "session %s: forwarding %s %d failed (%s); attempt %d/%d again in %.1fs",
                    entry.session_id, entry.kind, entry.id, detail, attempts,
                    opts.max_delivery_attempts, delay,
                )  # fmt: skip
                await trio.sleep(delay)
                return
            log.error(
                "session %s: giving up on %s %d: %s", entry.session_id, entry.kind, entry.id, detail
            )
            await self._finish(entry, "failed", status, answer, detail)
            return
        await self._finish(entry, "delivered", status, answer, detail)

    async def _finish(
        self, entry: Any, state: str, status: int | None, answer: Any, detail: str
    ) -> None:
        body = msgspec.json.decode(entry.body)
        events: list[JsonObject] = []
        refused = state == "failed" or (
            entry.kind == "message" and status is not None and status >= 400
        )
        if entry.kind == "message" and not refused:
            runner = answer.json() if answer is not None else None
            events.append(
                {
                    "sequence_number": None,
                    "type": "session.input.consumed",
                    "data": {
                        "item_id": body.get("persisted_item_id"),
                        "type": "message",
                        "data": {"role": "user", "content": body.get("content")},
                        # "accepted" (it started a turn) or "buffered" (it runs as the
                        # next turn, §E.3): how a client finds the turn of its message.
                        "runner_status": runner.get("status") if isinstance(runner, dict) else None,
                    },
                }
            )
        elif refused:
            # The runner will not act on this; say so on the stream, or the client waits for
            # a turn that never starts.
            events.append(
                {
                    "type": "session.delivery_failed",
                    "kind": entry.kind,
                    "item_id": body.get("persisted_item_id"),
                    "elicitation_id": (body.get("data") or {}).get("elicitation_id"),
                    "status": status,
                    "detail": detail,
                }
            )
        await self.store.finish_outbox(
            entry.id, state, status, answer.body if answer else None, events
        )
        if events:
            self.notify(entry.session_id)
        # Recorded even when nobody waits yet: the request that stored the entry may resume
        # only after its delivery finished. Old outcomes nobody asked for are dropped.
        delivery = self._deliveries.setdefault(entry.id, _Delivery())
        delivery.status = status
        delivery.body = answer.json() if answer is not None else None
        delivery.done.set()
        while len(self._deliveries) > _KEPT_DELIVERIES:
            self._deliveries.popitem(last=False)
