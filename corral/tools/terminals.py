"""tmux-backed terminals: ``sys_terminal_launch|send|read|list|close`` (T-12..T-16).

An agent spec's ``terminals:`` block names the terminals an agent may open and the command
each runs. The model launches one under a *session key* (``{"terminal": "zsh", "session":
"s1"}``; the key defaults to ``main``), types into it, reads its screen and closes it. Each
launched terminal is a tmux session; clients see it as a session resource
``terminal_<terminal>_<session>`` (PROTOCOL_FACTS §ii.5) and may attach to it through the
``tmux_socket``/``tmux_target`` in its metadata.

Design notes:

* **One tmux server per (conversation, terminal)**, on a socket named by a digest of the
  pair, so conversations never see each other's terminals and the tmux session name can be
  the session key itself (``tmux_target`` is ``s1``, as in the reference runner). Unix
  socket paths are limited to about 100 bytes: the sockets live in the manager's directory
  when that is short enough, else in a private ``0700`` directory under ``/tmp`` named after
  it.
* **No shell, ever.** Every tmux call is an argv list run by :func:`trio.run_process` under
  a deadline. The terminal's command is handed to tmux as several arguments (so tmux does
  not call ``sh -c`` with it) behind ``/bin/sh -c 'exec "$0" "$@"'``, which execs it as
  given; model text reaches the terminal through ``send-keys -l``, literally.
* **Stale servers.** tmux servers daemonise, so a tools actor that crashed leaves them
  running. :meth:`Terminals.run` kills every server of an earlier incarnation at start (and
  reports their resources as deleted); a graceful stop calls :meth:`Terminals.aclose`.
* ``remain-on-exit`` is on: when the command exits, its last screen stays readable and the
  resource says ``running: false`` until the terminal is closed or launched again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shlex
import stat
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from .._child_env import base_env
from ._api import ToolContext, ToolError, ToolSpec
from .os_env import effective_cwd

log = logging.getLogger("corral.tools.terminals")

#: Publishes one event on a session's stream: ``(session_id, event)``.
SessionPublish = Callable[[str, dict[str, Any]], Awaitable[None]]

#: The web-attach transport a terminal reports when its spec entry names none (T-14).
DEFAULT_TRANSPORT = "control"
#: The session key used when the model gives none.
DEFAULT_SESSION = "main"
#: Lines of scrollback ``sys_terminal_read`` returns by default, and at most.
DEFAULT_READ_LINES = 200
MAX_READ_LINES = 5000
#: Longest text one ``sys_terminal_send`` may type (an argv element must stay well under
#: the kernel's 128 KiB limit).
MAX_SEND_CHARS = 65_536

# Longest socket path we hand tmux; sun_path holds 108 bytes including the NUL.
_MAX_SOCKET_PATH = 100
_TERMINAL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# tmux forbids "." and ":" in session names; the key is the tmux session name.
_SESSION_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_KEY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9+_-]{0,31}$")
_TRANSPORT = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
# Execs "$0" "$@" exactly as given: the shell sees no string from the spec or the model.
_EXEC = ("/bin/sh", "-c", 'exec "$0" "$@"')
# Read by each tmux server at start (static: nothing from a spec goes in here).
_TMUX_CONF = """\
set-option -g remain-on-exit on
set-option -g history-limit 5000
set-option -g status off
"""
_PANE_FORMAT = "\t".join(
    [
        "#{session_name}",
        "#{pane_dead}",
        "#{window_activity}",
        "#{history_size}",
        "#{cursor_x}",
        "#{cursor_y}",
    ]
)
_NO_SERVER = ("no server running", "error connecting", "No such file or directory")


# ---------------------------------------------------------------------------------------------
# The spec's terminals block


@dataclass(frozen=True, slots=True)
class TerminalDef:
    """One terminal an agent spec declares.

    ``argv`` is the command and its arguments; ``env`` is added to the terminal's
    environment and ``env_unset`` removed from it (after ``env``); ``cwd`` is relative to the
    workspace unless absolute; ``transport`` is the web-attach transport it reports.
    """

    name: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    env_unset: tuple[str, ...] = ()
    cwd: str | None = None
    transport: str | None = None


def _bad(path: str, problem: str) -> ToolError:
    return ToolError(f"invalid terminals block in the agent spec: {path} {problem}")


def _str_list(value: Any, path: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _bad(path, "must be a list of strings")
    return list(value)


def _parse_def(name: Any, body: Any, path: str) -> TerminalDef:
    if not isinstance(name, str) or not _TERMINAL_NAME.match(name):
        raise _bad(path, "needs a name of letters, digits, '_', '.' or '-' (at most 64)")
    if body is None or isinstance(body, str | list):
        body = {"command": body}
    if not isinstance(body, dict):
        raise _bad(path, "must be a command string or a mapping with 'command'")
    command = body.get("command")
    if command is None:
        argv = [name]
    elif isinstance(command, str):
        try:
            argv = shlex.split(command)
        except ValueError as exc:
            raise _bad(f"{path}.command", f"does not parse: {exc}") from None
    else:
        argv = _str_list(command, f"{path}.command")
    argv += _str_list(body.get("args", []), f"{path}.args")
    if not argv or not argv[0]:
        raise _bad(f"{path}.command", "is empty")
    env = body.get("env") or {}
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and _ENV_NAME.match(k) and isinstance(v, str | int | float)
        for k, v in env.items()
    ):
        raise _bad(f"{path}.env", "must map variable names to strings")
    unset = _str_list(body.get("env_unset", []), f"{path}.env_unset")
    if not all(_ENV_NAME.match(k) for k in unset):
        raise _bad(f"{path}.env_unset", "must list variable names")
    cwd = body.get("cwd")
    if cwd is not None and (not isinstance(cwd, str) or not cwd):
        raise _bad(f"{path}.cwd", "must be a non-empty string")
    transport = body.get("transport", body.get("terminal_transport"))
    if transport is not None and (
        not isinstance(transport, str) or not _TRANSPORT.match(transport)
    ):
        raise _bad(f"{path}.transport", "must be a transport name such as 'control'")
    return TerminalDef(
        name=name,
        argv=tuple(argv),
        env=tuple((k, str(v)) for k, v in env.items()),
        env_unset=tuple(unset),
        cwd=cwd,
        transport=transport,
    )


def parse_terminals(block: Any) -> dict[str, TerminalDef]:
    """The terminals an agent spec's ``terminals:`` block declares, by name.

    Accepted shapes (unknown keys of an entry are ignored)::

        terminals: {zsh: {command: zsh}, py: "python3 -q", bash: null}
        terminals: [{name: zsh, command: zsh, args: [-l]}, "bash"]

    ``command`` is a string (split like a shell would, but never run by one) or an argv
    list; a missing command means the terminal's own name. Entries may also give ``args``,
    ``env``, ``env_unset``, ``cwd`` and ``transport``.

    Raises:
        ToolError: naming the first bad entry, e.g. ``terminals[1].args must be a list of
            strings``; also for a name declared twice.
    """
    if block is None:
        return {}
    entries: list[tuple[Any, Any, str]]
    if isinstance(block, dict):
        entries = [(name, body, f"terminals.{name}") for name, body in block.items()]
    elif isinstance(block, list):
        entries = []
        for i, entry in enumerate(block):
            if isinstance(entry, str):
                entries.append((entry, {"command": entry}, f"terminals[{i}]"))
            elif isinstance(entry, dict):
                body = {k: v for k, v in entry.items() if k != "name"}
                entries.append((entry.get("name"), body, f"terminals[{i}]"))
            else:
                raise _bad(f"terminals[{i}]", "must be a command string or a mapping with 'name'")
    else:
        raise _bad("terminals", "must be a list or a mapping")
    out: dict[str, TerminalDef] = {}
    for name, body, path in entries:
        tdef = _parse_def(name, body, path)
        if tdef.name in out:
            raise _bad(path, f"declares terminal {tdef.name!r} a second time")
        out[tdef.name] = tdef
    return out


# ---------------------------------------------------------------------------------------------
# Resources


def resource_id(terminal: str, session: str) -> str:
    """The session-resource id of a terminal: ``terminal_<terminal>_<session>``."""
    return f"terminal_{terminal}_{session}"


@dataclass(frozen=True, slots=True)
class TerminalInstance:
    """A launched terminal as tmux reports it now (the result of one lookup)."""

    conversation_id: str
    terminal: str
    session: str
    socket_path: Path
    tmux_target: str
    #: Whether its command is still running (False once it exited; the screen stays).
    running: bool
    #: The effective web-attach transport (the spec's, else the manager's default).
    transport: str


def resource_view(instance: TerminalInstance) -> dict[str, Any]:
    """The ``session.resource`` object of a terminal, as REST lists and events carry it."""
    t, s = instance.terminal, instance.session
    return {
        "id": resource_id(t, s),
        "object": "session.resource",
        "type": "terminal",
        "session_id": instance.conversation_id,
        "name": f"{t}:{s}",
        "metadata": {
            "terminal_name": t,
            "session_key": s,
            "running": instance.running,
            "tmux_socket": str(instance.socket_path),
            "tmux_target": instance.tmux_target,
            "terminal_transport": instance.transport,
        },
        "environment": f"env_terminal_{t}_{s}",
    }


def deleted_event(conversation_id: str, terminal: str, session: str) -> dict[str, Any]:
    """The ``session.resource.deleted`` event of a closed terminal (T-16)."""
    return {
        "type": "session.resource.deleted",
        "resource_id": resource_id(terminal, session),
        "resource_type": "terminal",
        "session_id": conversation_id,
    }


# ---------------------------------------------------------------------------------------------
# The manager


@dataclass(slots=True)
class _Launched:
    conversation_id: str
    terminal: str
    session: str
    socket: Path
    transport: str
    #: Last seen pane state, for the activity watcher (None until first seen).
    fingerprint: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class _Pane:
    dead: bool
    fingerprint: tuple[str, ...]


def _private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise PermissionError(f"{path} is not a directory owned by this user")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def _socket_dir_for(base_dir: Path) -> Path:
    probe = base_dir / ("0" * 16 + ".sock")
    if len(os.fsencode(probe)) <= _MAX_SOCKET_PATH:
        return base_dir
    digest = hashlib.sha256(os.fsencode(base_dir.resolve())).hexdigest()[:12]
    return Path("/tmp") / f"corral-tmux-{os.geteuid()}-{digest}"


class Terminals:
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

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> list[tuple[str, dict[str, Any]]]:
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

    async def cleanup_stale(self) -> list[tuple[str, dict[str, Any]]]:
        """Kill the tmux servers an earlier incarnation left behind.

        Returns ``(conversation_id, session.resource.deleted event)`` for every terminal
        they held, so clients can drop them. Servers this manager started are left alone.
        """
        if not self.socket_dir.exists():
            return []
        _private_dir(self.socket_dir)  # never trust what is in a shared /tmp
        ours = {launched.socket for launched in self._launched.values()}
        stems = {p.stem for p in self.socket_dir.iterdir() if p.suffix in (".sock", ".json")}
        events: list[tuple[str, dict[str, Any]]] = []
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

    # -- operations -----------------------------------------------------------------------

    async def launch(self, ctx: ToolContext, terminal: str, session: str) -> dict[str, Any]:
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
        answer = {
            "terminal": terminal,
            "session": session,
            "resource_id": resource_id(terminal, session),
        }
        async with self._lock(socket):
            pane = (await self._panes(socket)).get(session)
            if pane is not None and not pane.dead:
                self._launched.setdefault(key, self._new_launched(key, socket, tdef))
                return {**answer, "status": "already_running"}
            cwd = await self._cwd(ctx, tdef)
            env_flags = [arg for k, v in tdef.env for arg in ("-e", f"{k}={v}")]
            unset = [arg for k in tdef.env_unset for arg in ("-u", k)]
            command = [*(["env", *unset] if unset else []), *_EXEC, *tdef.argv]
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
        return {**answer, "status": "launched", "cwd": str(cwd)}

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
    ) -> dict[str, Any]:
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

    async def list_terminals(self, ctx: ToolContext) -> dict[str, Any]:
        """The terminals the spec declares and the launched ones of ``ctx``'s conversation."""
        declared = parse_terminals(ctx.spec.get("terminals"))
        live = {
            (r["metadata"]["terminal_name"], r["metadata"]["session_key"]): r
            for r in await self.list_resources(ctx.session_id)
        }
        names = [*declared, *(t for t, _ in live if t not in declared)]
        terminals = []
        for name in dict.fromkeys(names):
            tdef = declared.get(name)
            sessions = [
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

    async def list_resources(self, conversation_id: str) -> list[dict[str, Any]]:
        """Resource views of ``conversation_id``'s terminals, in launch order (§ii.5)."""
        launched = [v for k, v in self._launched.items() if k[0] == conversation_id]
        panes_by_socket: dict[Path, dict[str, _Pane]] = {}
        views: list[dict[str, Any]] = []
        for item in launched:
            if item.socket not in panes_by_socket:
                panes_by_socket[item.socket] = await self._panes(item.socket)
            pane = panes_by_socket[item.socket].get(item.session)
            if pane is None:
                self._launched.pop((conversation_id, item.terminal, item.session), None)
                continue
            views.append(resource_view(self._instance(item, pane)))
        return views

    async def close_all(self, conversation_id: str) -> list[dict[str, Any]]:
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

    async def _cwd(self, ctx: ToolContext, tdef: TerminalDef) -> Path:
        # The session's effective cwd, exactly as the OS tools get it (the workspace when
        # there is one, T-12) — and the same refusal when the spec asks for a sandbox this
        # runner cannot provide: a terminal must not be the way around it.
        base = await effective_cwd(ctx)
        cwd = base / tdef.cwd if tdef.cwd is not None else base
        if not await trio.to_thread.run_sync(cwd.is_dir):
            raise ToolError(f"terminal {tdef.name}: working directory {cwd} does not exist")
        return cwd

    async def _tmux(self, socket: Path, *args: str, check: bool = True) -> str:
        out, err, code = await self._tmux_raw(socket, *args)
        if check and code != 0:
            raise ToolError(f"tmux {args[0]} failed: {err.strip() or f'exit status {code}'}")
        return out

    async def _tmux_raw(self, socket: Path, *args: str) -> tuple[str, str, int]:
        argv = [self._tmux_bin, "-f", str(self._conf), "-S", str(socket), *args]
        with trio.move_on_after(self.call_timeout_s):
            proc = await trio.run_process(
                argv, capture_stdout=True, capture_stderr=True, check=False, env=self._env
            )
            return (
                proc.stdout.decode(errors="replace"),
                proc.stderr.decode(errors="replace"),
                proc.returncode,
            )
        raise ToolError(f"tmux {args[0]} did not answer within {self.call_timeout_s:g}s")

    async def _panes(self, socket: Path) -> dict[str, _Pane]:
        """Every tmux session on ``socket`` with its pane state; {} when no server runs."""
        if not socket.exists():
            return {}
        out, err, code = await self._tmux_raw(socket, "list-panes", "-a", "-F", _PANE_FORMAT)
        if code != 0:
            if any(marker in err for marker in _NO_SERVER):
                return {}
            raise ToolError(f"tmux list-panes failed: {err.strip() or f'exit status {code}'}")
        panes: dict[str, _Pane] = {}
        for line in out.splitlines():
            fields = line.split("\t")
            if len(fields) != 6:
                continue
            # One pane per session: we never split; the first pane is the terminal.
            panes.setdefault(fields[0], _Pane(dead=fields[1] == "1", fingerprint=tuple(fields[1:])))
        return panes

    async def _kill_server(self, socket: Path) -> None:
        if socket.exists():
            try:
                await self._tmux_raw(socket, "kill-server")
            except ToolError as exc:
                # Keep the files: the next start-up's cleanup finds the server by them.
                log.warning("could not kill tmux server %s: %s", socket, exc)
                return
        async with self._dir_lock:
            await trio.to_thread.run_sync(_remove_socket_files, socket, self.base_dir)

    async def _write_meta(self, socket: Path, conversation_id: str, terminal: str) -> None:
        # Lets a later incarnation say which conversation a stale server belonged to.
        meta = socket.with_suffix(".json")
        data = json.dumps({"conversation_id": conversation_id, "terminal": terminal})
        await trio.to_thread.run_sync(meta.write_text, data)

    def _read_meta(self, socket: Path) -> tuple[str, str] | None:
        try:
            data = json.loads(socket.with_suffix(".json").read_text())
            return str(data["conversation_id"]), str(data["terminal"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

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


def _remove_socket_files(socket: Path, base_dir: Path) -> None:
    # tmux leaves its socket file behind when the server exits.
    socket.unlink(missing_ok=True)
    socket.with_suffix(".json").unlink(missing_ok=True)
    if socket.parent != base_dir:
        # The /tmp fallback goes with its last server (rmdir fails while others remain).
        with contextlib.suppress(OSError):
            socket.parent.rmdir()


def _check_terminal(terminal: str) -> None:
    if not _TERMINAL_NAME.match(terminal):
        raise ToolError(f"{terminal!r} is not a terminal name")


def _check_session(session: str) -> None:
    if not _SESSION_KEY.match(session):
        raise ToolError(
            f"session {session!r} must be 1-64 letters, digits, '_' or '-', starting with a "
            "letter or digit"
        )


def _declared(spec: dict[str, Any], terminal: str) -> TerminalDef:
    declared = parse_terminals(spec.get("terminals"))
    tdef = declared.get(terminal)
    if tdef is None:
        known = ", ".join(sorted(declared)) or "none"
        raise ToolError(
            f"unknown terminal {terminal!r}: this agent's spec declares these terminals: {known}"
        )
    return tdef


# ---------------------------------------------------------------------------------------------
# The tools


def _manager(ctx: ToolContext) -> Terminals:
    # ``ctx.terminals`` is the field; ``extra["terminals"]`` is accepted as well.
    manager = ctx.terminals if ctx.terminals is not None else ctx.extra.get("terminals")
    if not isinstance(manager, Terminals):
        raise ToolError("terminals are not available in this runner")
    return manager


def _names(args: dict[str, Any]) -> tuple[str, str]:
    terminal = args.get("terminal")
    if not isinstance(terminal, str) or not terminal:
        raise ToolError('"terminal" is required: the name of a terminal from the agent spec')
    session = args.get("session")
    if session is None or session == "":
        session = DEFAULT_SESSION
    if not isinstance(session, str):
        raise ToolError('"session" must be a string')
    return terminal, session


async def _launch(ctx: ToolContext, args: dict[str, Any]) -> str:
    terminal, session = _names(args)
    return json.dumps(await _manager(ctx).launch(ctx, terminal, session))


async def _send(ctx: ToolContext, args: dict[str, Any]) -> str:
    terminal, session = _names(args)
    text = args.get("text") or ""
    keys = args.get("keys") or []
    if isinstance(keys, str):
        keys = [keys]
    if not isinstance(text, str) or not isinstance(keys, list):
        raise ToolError('"text" must be a string and "keys" a list of key names')
    enter = args.get("enter")
    if enter is None:
        enter = bool(text) and not keys
    if not text and not keys and not enter:
        raise ToolError('nothing to send: give "text", "keys" or "enter": true')
    await _manager(ctx).send(
        ctx.session_id, terminal, session, text=text, keys=keys, enter=bool(enter)
    )
    return json.dumps({"terminal": terminal, "session": session, "status": "sent"})


async def _read(ctx: ToolContext, args: dict[str, Any]) -> str:
    terminal, session = _names(args)
    lines = args.get("lines", DEFAULT_READ_LINES)
    if isinstance(lines, bool) or not isinstance(lines, int) or not 1 <= lines <= MAX_READ_LINES:
        raise ToolError(f'"lines" must be a whole number from 1 to {MAX_READ_LINES}')
    out = await _manager(ctx).read(
        ctx.session_id, terminal, session, lines=lines, max_chars=ctx.max_output_chars
    )
    return json.dumps(out, ensure_ascii=False)


async def _list(ctx: ToolContext, args: dict[str, Any]) -> str:
    del args
    return json.dumps(await _manager(ctx).list_terminals(ctx))


async def _close(ctx: ToolContext, args: dict[str, Any]) -> str:
    terminal, session = _names(args)
    _check_terminal(terminal)
    _check_session(session)
    closed = await _manager(ctx).close(ctx.session_id, terminal, session)
    if closed:
        await ctx.publish(deleted_event(ctx.session_id, terminal, session))
    status = "closed" if closed else "not_running"
    return json.dumps({"terminal": terminal, "session": session, "status": status})


_TARGET = {
    "terminal": {"type": "string", "description": "A terminal name from the agent spec."},
    "session": {
        "type": "string",
        "description": (
            f"Which instance of it (letters, digits, '_', '-'); default {DEFAULT_SESSION!r}."
        ),
    },
}

TOOLS: list[ToolSpec] = [
    ToolSpec(
        name="sys_terminal_launch",
        description=(
            "Start a terminal declared in the agent spec, in the workspace. Launching one that "
            "runs already does nothing (status 'already_running')."
        ),
        parameters={"type": "object", "properties": _TARGET, "required": ["terminal"]},
        run=_launch,
        family="terminal",
    ),
    ToolSpec(
        name="sys_terminal_send",
        description=(
            "Type into a terminal: 'text' is typed literally, then 'keys' are pressed (tmux key "
            "names such as 'Enter', 'C-c', 'Up', 'Tab'), then Enter if 'enter' is true "
            "(default: true when only text is given)."
        ),
        parameters={
            "type": "object",
            "properties": {
                **_TARGET,
                "text": {"type": "string"},
                "keys": {"type": "array", "items": {"type": "string"}},
                "enter": {"type": "boolean"},
            },
            "required": ["terminal"],
        },
        run=_send,
        family="terminal",
    ),
    ToolSpec(
        name="sys_terminal_read",
        description=(
            "Read a terminal's screen and recent scrollback ('lines', default "
            f"{DEFAULT_READ_LINES}). Works after its command exited too ('running': false)."
        ),
        parameters={
            "type": "object",
            "properties": {
                **_TARGET,
                "lines": {"type": "integer", "minimum": 1, "maximum": MAX_READ_LINES},
            },
            "required": ["terminal"],
        },
        run=_read,
        family="terminal",
    ),
    ToolSpec(
        name="sys_terminal_list",
        description="List the terminals the agent spec declares and the ones running now.",
        parameters={"type": "object", "properties": {}},
        run=_list,
        family="terminal",
    ),
    ToolSpec(
        name="sys_terminal_close",
        description="Close a terminal and end its command.",
        parameters={"type": "object", "properties": _TARGET, "required": ["terminal"]},
        run=_close,
        family="terminal",
    ),
]
