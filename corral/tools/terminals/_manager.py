"""The :class:`Terminals` manager: the launched terminals of every conversation of a tools actor.

It launches, types into, reads, lists and closes terminals; what it does over time (the
start-up cleanup, the activity watcher, the graceful stop) is its part :class:`Upkeep`.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import trio

from ..._child_env import base_env
from .._api import ToolContext, ToolError
from ..os_env import effective_cwd, effective_place
from ..sandbox import Sandbox, wrap
from ._resources import (
    Launched,
    ListedSession,
    ListedTerminal,
    Listing,
    ResourceDeleted,
    Screen,
    TerminalInstance,
    TerminalResource,
    deleted_event,
    resource_id,
    resource_view,
)
from ._spec import TerminalDef, _check_session, _check_terminal, _declared, parse_terminals
from ._tmux import _TMUX_CONF, _Pane, _private_dir, _socket_dir_for
from ._upkeep import Upkeep

log = logging.getLogger("corral.tools.terminals")


#: Publishes one event on a session's stream: ``(session_id, event)``.
SessionPublish = Callable[[str, Mapping[str, object]], Awaitable[None]]

#: The web-attach transport a terminal reports when its spec entry names none (T-14).
DEFAULT_TRANSPORT = "control"


#: Lines of scrollback ``sys_terminal_read`` returns by default, and at most.
DEFAULT_READ_LINES = 200
MAX_READ_LINES = 5000
#: Longest text one ``sys_terminal_send`` may type (an argv element must stay well under
#: the kernel's 128 KiB limit).
MAX_SEND_CHARS = 65_536


_KEY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9+_-]{0,31}$")


# Execs "$0" "$@" exactly as given: the shell sees no string from the spec or the model.
_EXEC = ("/bin/sh", "-c", 'exec "$0" "$@"')


@dataclass(slots=True)
class _Launched:
    conversation_id: str
    terminal: str
    session: str
    socket: Path
    transport: str
    #: Last seen pane state, for the activity watcher (None until first seen).
    fingerprint: tuple[str, ...] | None = None


class Terminals(Upkeep):
    """The tmux terminals of every conversation of one tools actor.

    Construct one per tools actor and run it in the actor's nursery::

        terminals = Terminals(data_dir / "terminals", publish=publish_session_event)
        await nursery.start(terminals.run)   # kills stale servers, then watches activity
        ...                                  # ToolContext(..., terminals=terminals)
        await terminals.aclose()             # on a graceful stop

    Args:
        base_dir: the manager's directory (made private, ``0700``); sockets go here when
            the path is short enough.
        publish: publishes events outside a tool call — ``session.terminal.activity`` when a
            launched terminal's screen changes, and the deletions of stale terminals found
            at start. None: no watcher, stale deletions are only returned.
        tmux: the tmux executable.
        call_timeout_s: deadline of one tmux command.
        activity_poll_s: how often the activity watcher looks at the terminals.
        default_transport: the transport of a terminal whose spec entry names none.
    """

    def __init__(
        self,
        base_dir: Path,
        *,
        publish: SessionPublish | None = None,
        tmux: str = "tmux",
        call_timeout_s: float = 10.0,
        activity_poll_s: float = 1.0,
        default_transport: str = DEFAULT_TRANSPORT,
    ) -> None:
        self.base_dir = _private_dir(base_dir)
        # Made (and checked) on first use only: a fallback dir under /tmp must not be left
        # behind by an actor that never launches a terminal.
        self.socket_dir = _socket_dir_for(self.base_dir)
        self._conf = self.base_dir / "tmux.conf"
        self._conf.write_text(_TMUX_CONF)
        self._publish = publish
        self._tmux_bin = tmux
        self.call_timeout_s = call_timeout_s
        self.activity_poll_s = activity_poll_s
        self.default_transport = default_transport
        # The host's allow-listed environment only: a terminal runs whatever the model types,
        # so no secret of the host may be in it. Nested-tmux variables are not allow-listed,
        # so tmux cannot end up talking to the actor's own server.
        self._env = base_env()
        self._launched: dict[tuple[str, str, str], _Launched] = {}
        self._locks: dict[Path, trio.Lock] = {}
        self._started = False
        # Orders making the socket dir (launch) against removing it (last server gone).
        self._dir_lock = trio.Lock()

    # -- operations -----------------------------------------------------------------------

    async def launch(self, ctx: ToolContext, terminal: str, session: str) -> Launched:
        """Launch ``terminal`` (declared in ``ctx.spec``) under ``session`` for ``ctx``'s
        conversation, in ``ctx``'s workspace.

        Idempotent: ``status`` is ``already_running`` (nothing published) if it runs already,
        else ``launched``, and exactly one ``session.resource.created`` is published through
        ``ctx.publish`` with the view of one :meth:`lookup` (T-13..T-15). A terminal whose
        command has exited is started afresh.
        """
        tdef = _declared(ctx.spec, terminal)
        _check_session(session)
        conversation_id = ctx.session_id
        socket = self._socket_for(conversation_id, terminal)
        key = (conversation_id, terminal, session)
        async with self._lock(socket):
            pane = (await self._panes(socket)).get(session)
            if pane is not None and not pane.dead:
                self._launched.setdefault(key, self._new_launched(key, socket, tdef))
                return Launched(
                    terminal=terminal,
                    session=session,
                    resource_id=resource_id(terminal, session),
                    status="already_running",
                )
            cwd, sandbox = await self._place(ctx, tdef)
            env_flags = [arg for k, v in tdef.env for arg in ("-e", f"{k}={v}")]
            unset = [arg for k in tdef.env_unset for arg in ("-u", k)]
            command = [*(["env", *unset] if unset else []), *_EXEC, *tdef.argv]
            if sandbox is not None:
                # The session's sandbox, as its shells get it; tmux stays outside it.
                root = await effective_cwd(ctx)
                command = wrap(command, sandbox, cwd=root, env=self._env, start=cwd)
            where = ["-c", str(cwd), *env_flags, "--", *command]
            if pane is not None:
                # Its command exited: start it again in the same tmux session. (Killing the
                # session would race the server's own exit when it was the only one.)
                target = f"={session}:"
                await self._tmux(socket, "respawn-pane", "-k", "-t", target, *where)
                await self._tmux(socket, "clear-history", "-t", target)
            else:
                async with self._dir_lock:
                    # The meta file keeps the directory from being removed under us.
                    _private_dir(self.socket_dir)
                    await self._write_meta(socket, conversation_id, terminal)
                size = ["-x", "200", "-y", "50"]
                await self._tmux(socket, "new-session", "-d", "-s", session, *size, *where)
            self._launched[key] = self._new_launched(key, socket, tdef)
        instance = await self.lookup(conversation_id, terminal, session)
        if instance is not None:
            await ctx.publish(
                {"type": "session.resource.created", "resource": resource_view(instance)}
            )
        return Launched(
            terminal=terminal,
            session=session,
            resource_id=resource_id(terminal, session),
            status="launched",
            cwd=str(cwd),
        )

    async def lookup(
        self, conversation_id: str, terminal: str, session: str
    ) -> TerminalInstance | None:
        """The launched terminal as tmux sees it now (one tmux call), or None if gone."""
        key = (conversation_id, terminal, session)
        launched = self._launched.get(key)
        if launched is None:
            return None
        pane = (await self._panes(launched.socket)).get(session)
        if pane is None:
            self._launched.pop(key, None)
            return None
        if launched.fingerprint is None:
            launched.fingerprint = pane.fingerprint
        return self._instance(launched, pane)

    async def send(
        self,
        conversation_id: str,
        terminal: str,
        session: str,
        *,
        text: str = "",
        keys: list[str] | tuple[str, ...] = (),
        enter: bool = False,
    ) -> None:
        """Type ``text`` literally, then press ``keys`` (tmux key names), then Enter."""
        if len(text) > MAX_SEND_CHARS:
            raise ToolError(f"text is too long ({len(text)} characters; at most {MAX_SEND_CHARS})")
        for k in keys:
            if not isinstance(k, str) or not _KEY_NAME.match(k):
                raise ToolError(
                    f"{k!r} is not a key name (use names like 'Enter', 'C-c', 'Up', 'F5'; "
                    "send other characters as text)"
                )
        launched = self._require(conversation_id, terminal, session)
        target = f"={session}:"
        async with self._lock(launched.socket):
            pane = await self._live_pane(launched)
            if pane.dead:
                raise ToolError(
                    f"terminal {terminal}:{session} has exited; read its last screen with "
                    "sys_terminal_read or start it again with sys_terminal_launch"
                )
            if text:
                await self._tmux(launched.socket, "send-keys", "-t", target, "-l", "--", text)
            if keys:
                await self._tmux(launched.socket, "send-keys", "-t", target, "--", *keys)
            if enter:
                await self._tmux(launched.socket, "send-keys", "-t", target, "Enter")

    async def read(
        self,
        conversation_id: str,
        terminal: str,
        session: str,
        *,
        lines: int = DEFAULT_READ_LINES,
        max_chars: int = 100_000,
    ) -> Screen:
        """The screen and up to ``lines`` lines of scrollback, capped at ``max_chars``.

        Returns ``{"terminal", "session", "running", "output"}``; a capped output keeps the
        newest text and starts with ``...[truncated N chars]``.
        """
        launched = self._require(conversation_id, terminal, session)
        async with self._lock(launched.socket):
            pane = await self._live_pane(launched)
            raw = await self._tmux(
                launched.socket, "capture-pane", "-p", "-J", "-t", f"={session}:", "-S", f"-{lines}"
            )
        text = "\n".join(line.rstrip() for line in raw.splitlines()).rstrip("\n")
        if len(text) > max_chars:
            cut = len(text) - max_chars
            text = f"...[truncated {cut} chars]\n{text[cut:]}"
        return {"terminal": terminal, "session": session, "running": not pane.dead, "output": text}

    async def list_terminals(self, ctx: ToolContext) -> Listing:
        """The terminals the spec declares and the launched ones of ``ctx``'s conversation."""
        declared = parse_terminals(ctx.spec.get("terminals"))
        live = {
            (r["metadata"]["terminal_name"], r["metadata"]["session_key"]): r
            for r in await self.list_resources(ctx.session_id)
        }
        names = [*declared, *(t for t, _ in live if t not in declared)]
        terminals: list[ListedTerminal] = []
        for name in dict.fromkeys(names):
            tdef = declared.get(name)
            sessions: list[ListedSession] = [
                {
                    "session": s,
                    "running": r["metadata"]["running"],
                    "resource_id": r["id"],
                }
                for (t, s), r in live.items()
                if t == name
            ]
            terminals.append(
                {
                    "terminal": name,
                    "command": list(tdef.argv) if tdef is not None else None,
                    "declared": tdef is not None,
                    "sessions": sessions,
                }
            )
        return {"terminals": terminals}

    async def close(self, conversation_id: str, terminal: str, session: str) -> bool:
        """Close a terminal; True if it existed. Publishing the deletion is the caller's job."""
        key = (conversation_id, terminal, session)
        launched = self._launched.get(key)
        if launched is None:
            return False
        async with self._lock(launched.socket):
            panes = await self._panes(launched.socket)
            self._launched.pop(key, None)
            if session not in panes:
                return False
            if len(panes) == 1:
                await self._kill_server(launched.socket)
            else:
                await self._tmux(launched.socket, "kill-session", "-t", f"={session}")
        return True

    async def list_resources(self, conversation_id: str) -> list[TerminalResource]:
        """Resource views of ``conversation_id``'s terminals, in launch order (§ii.5)."""
        launched = [v for k, v in self._launched.items() if k[0] == conversation_id]
        panes_by_socket: dict[Path, dict[str, _Pane]] = {}
        views: list[TerminalResource] = []
        for item in launched:
            if item.socket not in panes_by_socket:
                panes_by_socket[item.socket] = await self._panes(item.socket)
            pane = panes_by_socket[item.socket].get(item.session)
            if pane is None:
                self._launched.pop((conversation_id, item.terminal, item.session), None)
                continue
            views.append(resource_view(self._instance(item, pane)))
        return views

    async def close_all(self, conversation_id: str) -> list[ResourceDeleted]:
        """Close every terminal of ``conversation_id``; returns their deletion events."""
        keys = [k for k in self._launched if k[0] == conversation_id]
        sockets = {self._launched[k].socket for k in keys}
        events = [deleted_event(*k) for k in keys]
        for key in keys:
            self._launched.pop(key, None)
        for socket in sockets:
            lock = self._lock(socket)
            async with lock:
                await self._kill_server(socket)
            if lock.statistics().tasks_waiting == 0 and not lock.locked():
                self._locks.pop(socket, None)  # no one queued on it: forget it
        return events

    # -- internals ------------------------------------------------------------------------

    def _socket_for(self, conversation_id: str, terminal: str) -> Path:
        digest = hashlib.sha256(f"{conversation_id}\0{terminal}".encode()).hexdigest()[:16]
        return self.socket_dir / f"{digest}.sock"

    def _lock(self, socket: Path) -> trio.Lock:
        return self._locks.setdefault(socket, trio.Lock())

    def _new_launched(
        self, key: tuple[str, str, str], socket: Path, tdef: TerminalDef
    ) -> _Launched:
        return _Launched(*key, socket=socket, transport=tdef.transport or self.default_transport)

    def _instance(self, launched: _Launched, pane: _Pane) -> TerminalInstance:
        return TerminalInstance(
            conversation_id=launched.conversation_id,
            terminal=launched.terminal,
            session=launched.session,
            socket_path=launched.socket,
            tmux_target=launched.session,
            running=not pane.dead,
            transport=launched.transport,
        )

    def _require(self, conversation_id: str, terminal: str, session: str) -> _Launched:
        _check_terminal(terminal)
        _check_session(session)
        launched = self._launched.get((conversation_id, terminal, session))
        if launched is None:
            raise ToolError(
                f"terminal {terminal}:{session} is not running; start it with sys_terminal_launch"
            )
        return launched

    async def _live_pane(self, launched: _Launched) -> _Pane:
        pane = (await self._panes(launched.socket)).get(launched.session)
        if pane is None:
            self._launched.pop(
                (launched.conversation_id, launched.terminal, launched.session), None
            )
            raise ToolError(
                f"terminal {launched.terminal}:{launched.session} is not running; start it "
                "with sys_terminal_launch"
            )
        return pane

    async def _place(self, ctx: ToolContext, tdef: TerminalDef) -> tuple[Path, Sandbox | None]:
        # The session's effective cwd and sandbox, exactly as the OS tools get them (the
        # workspace when there is one, T-12) — and the same refusal when the spec asks for a
        # sandbox this runner cannot provide: a terminal must not be the way around it.
        base, sandbox = await effective_place(ctx)
        cwd = base / tdef.cwd if tdef.cwd is not None else base
        if not await trio.to_thread.run_sync(cwd.is_dir):
            raise ToolError(f"terminal {tdef.name}: working directory {cwd} does not exist")
        return cwd, sandbox
