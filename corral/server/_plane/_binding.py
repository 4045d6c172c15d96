"""The runner link and the sessions bound on it (PROTOCOL_FACTS §v.6, PROTOCOL_0_19 §B).

:class:`RunnerBinding` is the part of :class:`ControlPlane` that serves a connected runner:
each session bound to it is initialised (``POST /v1/sessions``, the ``session_init`` v2
envelope) one after the other, then keeps one ``GET .../stream`` open, whose events are
stored as they arrive; a stream that ends is opened again, with backoff.
"""

from __future__ import annotations

import codecs
import logging
from collections.abc import Callable
from typing import Any

import msgspec
import trio

from .._conversation import UnknownSession, fence
from .._mcp import error_detail
from .._store import SessionRow
from .._tunnel import RunnerGone, RunnerLink, SseParser
from ._options import SERVER_VERSION
from ._parts import PlaneParts

log = logging.getLogger("corral.server")
_encode = msgspec.json.Encoder().encode
#: Parents walked up to find a session's root, at most (sub-agents do not nest deeper).
_MAX_DEPTH = 32


class _Binding:
    """A session's state on the current tunnel: whether its stream is open, and the cancel
    scopes of its tasks (a deleted session's tasks stop at once)."""

    def __init__(self) -> None:
        self.ready = False
        self.stopped = False
        self.scopes: list[trio.CancelScope] = []
        self._changed = trio.Event()

    def scope(self) -> trio.CancelScope:
        """A cancel scope for one of the session's tasks, cancelled by :meth:`stop`."""
        scope = trio.CancelScope()
        if self.stopped:
            scope.cancel()
        self.scopes.append(scope)
        return scope

    def stop(self) -> None:
        """Cancel every task of the session."""
        self.stopped = True
        for scope in self.scopes:
            scope.cancel()

    def set_ready(self, ready: bool) -> None:
        """Mark the stream open (or closed) and wake waiters."""
        if ready != self.ready:
            self.ready = ready
            self._changed.set()
            self._changed = trio.Event()

    async def wait_ready(self) -> None:
        """Return once the stream is open."""
        while not self.ready:
            await self._changed.wait()


class _InitFailed(Exception):
    pass


class RunnerBinding(PlaneParts):
    """The runner link of a :class:`ControlPlane`: binding its sessions, relaying their streams."""

    async def run_link(self, link: RunnerLink) -> None:
        """Serve a connected runner until its tunnel closes (replacing an older tunnel)."""
        old = self.link
        self.link = link
        # Until this link's nursery exists, new sessions wait for _bind_all to pick them up
        # (never a task in the old link's nursery, which is about to be cancelled).
        self._link_nursery = None
        self._bindings = {}
        self._link_changed.set()
        self._link_changed = trio.Event()
        if old is not None:
            log.info("runner %s: a new tunnel replaces the old one", link.runner_id)
            await old.close(4000, "tunnel replaced")
        log.info(
            "runner %s connected (version %s, harnesses %s, capabilities %s, connection %s)",
            link.runner_id,
            link.hello.get("runner_version"),
            link.hello.get("harnesses"),
            link.capabilities,
            link.connection_id,
        )
        try:
            await link.ready()  # before any request, as the real server (§A.3)
            async with trio.open_nursery() as nursery:
                self._link_nursery = nursery
                nursery.start_soon(self._bind_all, link, nursery)
                nursery.start_soon(self._close_on_shutdown, link)
                await link.serve()
                nursery.cancel_scope.cancel()
        finally:
            if self.link is link:
                self.link = None
                self._link_nursery = None
                self._bindings = {}
                self._link_changed.set()
                self._link_changed = trio.Event()
            log.info("runner %s disconnected (code %s)", link.runner_id, link.close_code or "none")

    async def _close_on_shutdown(self, link: RunnerLink) -> None:
        await self.closing.wait()
        # 1012 "service restart": the runner reconnects at once instead of backing off.
        await link.close(1012, "service restart")

    async def wait_link(self, timeout: float) -> RunnerLink | None:
        """The connected runner, waiting up to ``timeout`` for one (None if none came)."""
        with trio.move_on_after(timeout):
            while self.link is None and not self.closing.is_set():
                await self._link_changed.wait()
        return self.link

    def bind_child(self, session_id: str) -> None:
        """Bind a child session a runner just created (``_children``): at once, as the real
        server binds it while the runner's create is still open (PROTOCOL_0_19.md §J)."""
        self._bind(session_id)

    async def root_of(self, row: SessionRow) -> str:
        """The id of the top session of ``row``'s tree (itself for a top-level session)."""
        current = row
        for _ in range(_MAX_DEPTH):
            if current.parent_session_id is None:
                return current.id
            parent = await self.store.get_session(current.parent_session_id)
            if parent is None:
                return current.parent_session_id
            current = parent
        return current.id

    def _bind(self, session_id: str) -> None:
        """Start binding a session on the current tunnel, unless it is bound already."""
        link, nursery = self.link, self._link_nursery
        if link is None or nursery is None or session_id in self._bindings:
            return
        binding = self._bindings[session_id] = _Binding()
        nursery.start_soon(self._session_task, link, session_id, binding, nursery)

    async def _bind_all(self, link: RunnerLink, nursery: trio.Nursery) -> None:
        # One session at a time, the next after the previous init answered (§ii.2).
        for session_id in await self.store.sessions_for_runner(link.runner_id):
            if session_id in self._bindings or self.link is not link:
                continue
            binding = self._bindings[session_id] = _Binding()
            await nursery.start(self._session_task, link, session_id, binding, nursery)

    async def _session_task(
        self,
        link: RunnerLink,
        session_id: str,
        binding: _Binding,
        nursery: trio.Nursery,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Init the session on the runner and relay its stream, again whenever it ends."""
        started = False

        def announce() -> None:
            # Once: after the first init answered, or when the task ends without one.
            nonlocal started
            if not started:
                started = True
                task_status.started()

        with binding.scope():
            await self._bind_session(link, session_id, binding, nursery, announce)
        announce()

    async def _bind_session(
        self,
        link: RunnerLink,
        session_id: str,
        binding: _Binding,
        nursery: trio.Nursery,
        announce: Callable[[], None],
    ) -> None:
        opts = self.options
        delivering = False
        delay = opts.retry_base_s
        while not link.closed.is_set():
            try:
                await self._init_session(link, session_id)
                announce()
                # The runner's seq of the last event stored: the runner sends every later
                # one, also those it wrote to a tunnel that died before they were stored.
                cursor = await self.store.runner_seq(session_id)
                async with link.open(
                    "GET",
                    f"/v1/sessions/{session_id}/stream",
                    head_timeout_s=opts.request_timeout_s,
                    headers=[("last-event-id", str(cursor))],
                ) as call:
                    if call.status != 200:
                        raise _InitFailed(f"GET .../stream answered {call.status}")
                    binding.set_ready(True)
                    if not delivering:
                        nursery.start_soon(self._deliver_loop, link, session_id, binding)
                        delivering = True
                    delay = opts.retry_base_s
                    why = await self._relay(session_id, call, cursor)
                log.info("session %s: the runner stream %s; opening it again", session_id, why)
            except UnknownSession:
                log.warning("session %s vanished from the store; not binding it", session_id)
                break
            except RunnerGone as exc:
                if link.closed.is_set():
                    break
                log.warning("session %s: %s", session_id, exc)
            except _InitFailed as exc:
                log.warning("session %s: binding to the runner failed: %s", session_id, exc)
            except Exception:
                # A bug here must not take the whole tunnel (and every other session) down.
                log.exception("session %s: relaying from the runner failed", session_id)
            finally:
                binding.set_ready(False)
            announce()
            await trio.sleep(delay)
            delay = min(delay * 2, opts.retry_cap_s)

    async def _init_session(self, link: RunnerLink, session_id: str) -> None:
        """``POST /v1/sessions`` with the ``session_init`` v2 envelope (§B.1)."""
        row = await self.store.get_session(session_id)
        if row is None:
            raise UnknownSession(session_id)
        pending = await self.store.has_pending_message(session_id)
        snapshot = {
            "created_at": int(row.created_at),
            "updated_at": int(row.updated_at),
            "workspace": None,
            "labels": row.labels,
            "reasoning_effort": None,
            "model_override": None,
            "harness_override": None,
            "cost_control_mode_override": None,
            "terminal_launch_args": None,
            "external_session_id": None,
            "parent_session_id": row.parent_session_id,
            "root_session_id": row.root_session_id or await self.root_of(row),
            "inference_config": None,
        }
        body = {
            "session_id": row.id,
            "agent_id": row.agent_id,
            "sub_agent_name": row.sub_agent_name,
            "session_init": {
                "protocol_version": 2,
                "server_version": SERVER_VERSION,
                "session_id": row.id,
                "agent_id": row.agent_id,
                "sub_agent_name": row.sub_agent_name,
                "snapshot": snapshot,
                # A message is about to be forwarded: the runner must not also start a
                # recovery turn from the history.
                "suppress_recovery_turn": pending,
                "resume_interrupted_turn": False,
                "recovery_id": None,
            },
        }
        timeout = self.options.request_timeout_s
        answer = await link.request("POST", "/v1/sessions", body=_encode(body), timeout_s=timeout)
        if not 200 <= answer.status < 300:
            detail = error_detail(answer.json(), answer.body)
            raise _InitFailed(f"POST /v1/sessions answered {answer.status}: {detail}")

    async def _relay(self, session_id: str, call: Any, cursor: int) -> str:
        """Store every event of an open runner stream after the runner's seq ``cursor``
        (an event at or below it is stored already: a replay is dropped by its seq);
        returns why the stream stopped."""
        parser = SseParser()
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        while True:
            with trio.move_on_after(self.options.stream_dead_s) as waited:
                chunk = await call.next_chunk()
            if waited.cancelled_caught:
                return f"was silent for {self.options.stream_dead_s:g}s"
            if chunk is None:
                return "ended"
            events = [
                event
                for seq, event in parser.feed_with_ids(decoder.decode(chunk))
                if seq is None or seq > cursor
            ]
            if events and session_id in self._fenced:
                events, fenced = fence(events)
                if not fenced:
                    self._fenced.discard(session_id)
            # The cursor moves with every event that carried a seq, kept or fenced out.
            seq = parser.last_id if parser.last_id is not None and parser.last_id > cursor else None
            if events or seq is not None:
                changed = await self.store.append_runner_events(session_id, events, seq)
                cursor = seq if seq is not None else cursor
                if events:
                    for changed_id in changed:
                        self.notify(changed_id)
            if parser.done:
                return "said [DONE]"
