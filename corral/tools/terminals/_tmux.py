"""The tmux side of the terminals: one tmux server per socket, driven by argv lists only.

:class:`TmuxServers` is the part of :class:`Terminals` that runs tmux commands (under a
deadline, never through a shell), reads pane states and kills servers; the functions here
keep the socket directory private and short enough for a Unix socket path.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import trio

from .._api import ToolError

log = logging.getLogger("corral.tools.terminals")


# Longest socket path we hand tmux; sun_path holds 108 bytes including the NUL.
_MAX_SOCKET_PATH = 100


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


def _remove_socket_files(socket: Path, base_dir: Path) -> None:
    # tmux leaves its socket file behind when the server exits.
    socket.unlink(missing_ok=True)
    socket.with_suffix(".json").unlink(missing_ok=True)
    if socket.parent != base_dir:
        # The /tmp fallback goes with its last server (rmdir fails while others remain).
        with contextlib.suppress(OSError):
            socket.parent.rmdir()


class TmuxServers:
    """The tmux calls of a :class:`Terminals` manager, one server per socket.

    :class:`Terminals` sets these attributes in its ``__init__``; they are declared here for
    readers and the type checker.
    """

    #: The manager's private directory; a socket outside it lives in a /tmp fallback.
    base_dir: Path
    #: The tmux executable, the config file every server reads, and their environment.
    _tmux_bin: str
    _conf: Path
    _env: dict[str, str]
    #: Deadline of one tmux command.
    call_timeout_s: float
    #: Orders making the socket dir (launch) against removing it (last server gone).
    _dir_lock: trio.Lock

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
