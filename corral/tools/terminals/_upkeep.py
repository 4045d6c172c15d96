"""The upkeep of a :class:`Terminals` manager: its start, its activity watcher, its stop.

tmux servers daemonise, so they outlive the tools actor that started them. :class:`Upkeep`
is the part of :class:`Terminals` that deals with time rather than with one tool call:
at start it kills the servers of an earlier incarnation (and reports their terminals as
deleted), while it runs it watches the launched terminals' screens and publishes
``session.terminal.activity``, and on a graceful stop it closes every terminal.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from .._api import ToolError
from ._resources import ResourceDeleted, deleted_event, resource_id
from ._tmux import TmuxServers, _private_dir

if TYPE_CHECKING:
    from ._manager import SessionPublish, _Launched

log = logging.getLogger("corral.tools.terminals")


class Upkeep(TmuxServers):
    """Start-up cleanup, the activity watcher and the graceful stop of :class:`Terminals`.

    :class:`Terminals` sets these attributes in its ``__init__``; they are declared here for
    readers and the type checker.
    """

    socket_dir: Path
    activity_poll_s: float
    _publish: SessionPublish | None
    _launched: dict[tuple[str, str, str], _Launched]
    _started: bool

    if TYPE_CHECKING:

        async def close_all(self, conversation_id: str) -> list[ResourceDeleted]: ...

    async def start(self) -> list[tuple[str, ResourceDeleted]]:
        """Start-up: kill the servers of an earlier incarnation (once; later calls do nothing).

        Publishes their deletions through ``publish`` when there is one, and returns them as
        ``(conversation_id, event)`` pairs either way.
        """
        if self._started:
            return []
        self._started = True
        events = await self.cleanup_stale()
        if self._publish is not None:
            for conversation_id, event in events:
                await self._publish(conversation_id, event)
        return events

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """:meth:`start`, then watch pane activity until cancelled (use ``nursery.start``).

        Tool calls should wait until it has started, or the start-up cleanup could race a
        fresh launch (the cleanup spares servers this manager started, but not their
        half-made state).
        """
        await self.start()
        task_status.started()
        if self._publish is None:
            await trio.sleep_forever()
        while True:
            # A poll, not a synchronisation: tmux has no push notification we could wait on
            # without keeping a control-mode client attached to every server.
            await trio.sleep(self.activity_poll_s)
            await self._poll_activity()

    async def cleanup_stale(self) -> list[tuple[str, ResourceDeleted]]:
        """Kill the tmux servers an earlier incarnation left behind.

        Returns ``(conversation_id, session.resource.deleted event)`` for every terminal
        they held, so clients can drop them. Servers this manager started are left alone.
        """
        if not self.socket_dir.exists():
            return []
        _private_dir(self.socket_dir)  # never trust what is in a shared /tmp
        ours = {launched.socket for launched in self._launched.values()}
        stems = {p.stem for p in self.socket_dir.iterdir() if p.suffix in (".sock", ".json")}
        events: list[tuple[str, ResourceDeleted]] = []
        for stem in sorted(stems):
            socket = self.socket_dir / f"{stem}.sock"
            if socket in ours:
                continue
            meta = self._read_meta(socket)
            try:
                panes = await self._panes(socket)
            except ToolError as exc:
                log.warning("stale tmux server %s: %s", socket, exc)
                panes = {}
            if meta is not None:
                conversation_id, terminal = meta
                events.extend(
                    (conversation_id, deleted_event(conversation_id, terminal, session))
                    for session in panes
                )
            await self._kill_server(socket)
            log.info("killed stale tmux server %s (%d terminals)", socket, len(panes))
        return events

    async def aclose(self, *, timeout_s: float = 10.0) -> None:
        """Close every terminal of every conversation (a graceful stop).

        Shielded, with its own deadline: it is called on the way out, often from a scope
        that is already cancelled, and a tmux server left running outlives the actor.
        """
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + timeout_s
            for conversation_id in {key[0] for key in self._launched}:
                await self.close_all(conversation_id)

    async def _poll_activity(self) -> None:
        by_socket: dict[Path, list[_Launched]] = {}
        for launched in list(self._launched.values()):
            by_socket.setdefault(launched.socket, []).append(launched)
        for socket, items in by_socket.items():
            try:
                panes = await self._panes(socket)
            except ToolError as exc:
                log.warning("activity watcher: %s", exc)
                continue
            for launched in items:
                pane = panes.get(launched.session)
                if pane is None or pane.fingerprint == launched.fingerprint:
                    continue
                first_look = launched.fingerprint is None
                launched.fingerprint = pane.fingerprint
                if first_look or self._publish is None:
                    continue
                event = {
                    "type": "session.terminal.activity",
                    "session_id": launched.conversation_id,
                    "terminal_id": resource_id(launched.terminal, launched.session),
                }
                try:
                    await self._publish(launched.conversation_id, event)
                except Exception:
                    # The watcher outlives one bad publish; the next change tries again.
                    log.exception("could not publish terminal activity")
