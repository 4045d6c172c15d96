"""The OS-environment tools: ``sys_os_read``, ``sys_os_write``, ``sys_os_edit``, ``sys_os_shell``.

They act in the session's effective working directory (:mod:`corral.tools.os_env`,
T-05 to T-10) and answer with JSON text (T-01 to T-04)::

    sys_os_read  {"path", "offset"?, "limit"?}  -> {"path", "content", "encoding", "offset",
                                                   "limit", "returned_lines", "total_lines",
                                                   "truncated"}
    sys_os_write {"path", "content"}           -> {"path", "created", "bytes_written"}
    sys_os_edit  {"path", "oldText", "newText"} -> {"path", "replacements"}
    sys_os_shell {"command"}                   -> {"stdout", "stderr", "exit_code",
                                                   "timed_out", "shell", "cwd"}

**Paths** the model names go through :func:`~corral.tools.paths.resolve_inside`: ``..``,
absolute paths elsewhere and symlinks out of the cwd are refused with ``escapes the
working directory``, for reads and writes alike. Files are written whole through a
temporary file and a rename, so a crash leaves the old or the new content, never half.

**Reads** are for text: a file with a NUL byte in its first 8 KiB is refused as binary;
other bytes that are not UTF-8 read as U+FFFD. The answer has omnigent's shape
(PROTOCOL_0_19.md §G.6): ``path`` is the absolute path read, ``offset`` (1-based) and
``limit`` (default :data:`DEFAULT_READ_LIMIT` lines) the window, ``returned_lines`` and
``total_lines`` what it held and what the file holds (None past :data:`MAX_COUNT_BYTES`
more bytes). At most ``ctx.max_output_chars`` characters come back; ``"truncated": true``
says that cap cut the window. Whenever lines are left after it, ``"next_offset"`` says
where to go on (corral's addition). Only regular files are read, so a FIFO or a device
cannot hang or flood the call.

**Edits** work on the file's bytes, so the rest of a file that is not valid UTF-8 is left
exactly as it was. ``oldText`` must occur exactly once; no match, or several matches
without ``"replace_all": true``, is an error and the file is not touched.

**The shell** is ``/bin/bash -c <command>`` (that is the tool; the command is passed as one
argument, never pasted into another command line). It runs in its own process group
(new session), with stdin from ``/dev/null``. It gets ``timeout`` seconds (default 120,
never more than the call's own deadline): when they run out, or the call is cancelled,
the whole group gets SIGTERM, then SIGKILL after a grace period, and the answer says
``"timed_out": true``. Background jobs do not outlive the call: the group is ended once
the command has finished, too (long-running programs belong in ``sys_terminal_*``). The
call waits for the output pipes to close, so a background job that keeps them open runs
into the timeout. Output is read as it comes and at most ``ctx.max_output_chars``
characters of stdout and stderr together are kept, the rest counted and replaced by
``\\n...[truncated N chars]``; bytes that are not UTF-8 decode as U+FFFD.

Blocking file work runs in worker threads, at most :data:`MAX_FILE_THREADS` at a time.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import math
import os
import secrets
import shutil
import signal
import stat
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import trio

from .._child_env import base_env
from .._jsonlines import JsonObject
from ._api import ProcessTracker, ToolContext, ToolError, ToolSpec
from ._replies import EditResult, ReadResult, ShellResult, WriteResult
from .os_env import effective_cwd_sync, effective_place
from .paths import is_inside, resolve_inside
from .sandbox import Sandbox, wrap

__all__ = [
    "DEFAULT_READ_LIMIT",
    "DEFAULT_SHELL_TIMEOUT_S",
    "KILL_GRACE_S",
    "MAX_COUNT_BYTES",
    "MAX_EDIT_BYTES",
    "MAX_FILE_THREADS",
    "TOOLS",
    "atomic_write",
    "in_thread",
    "run_shell",
    "shell_path",
]

#: Seconds a ``sys_os_shell`` command gets when the call does not say.
DEFAULT_SHELL_TIMEOUT_S = 120.0
#: Seconds between SIGTERM and SIGKILL when a command's process group is ended.
KILL_GRACE_S = 2.0
#: Largest file ``sys_os_edit`` loads (it has to hold the file twice).
MAX_EDIT_BYTES = 16 * 1024 * 1024
#: Lines ``sys_os_read`` returns when the call does not say (omnigent's default).
DEFAULT_READ_LIMIT = 2000
#: Bytes ``sys_os_read`` reads past its window to count the file's lines, at most.
MAX_COUNT_BYTES = 16 * 1024 * 1024
#: Worker threads the file tools use at most, all sessions together.
MAX_FILE_THREADS = 4

_CHUNK = 64 * 1024
_SNIFF = 8192
_T = TypeVar("_T")

# One limiter per trio run: a module-level limiter would outlive the run that made it.
_LIMITER: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("corral_os_tools")


async def in_thread(fn: Callable[..., _T], *args: Any) -> _T:
    """Run blocking file work in a worker thread, at most :data:`MAX_FILE_THREADS` at once."""
    try:
        limiter = _LIMITER.get()
    except LookupError:
        limiter = trio.CapacityLimiter(MAX_FILE_THREADS)
        _LIMITER.set(limiter)
    return await trio.to_thread.run_sync(fn, *args, limiter=limiter)


# -- arguments ------------------------------------------------------------------------------


def _str_arg(args: Mapping[str, object], *names: str, allow_empty: bool = False) -> str:
    """The first of ``names`` present in ``args`` (later names are aliases), as a string."""
    for name in names:
        if name in args and args[name] is not None:
            value = args[name]
            if not isinstance(value, str) or (not value and not allow_empty):
                kind = "a string" if allow_empty else "a non-empty string"
                raise ToolError(f"{name} must be {kind}")
            return value
    raise ToolError(f"missing required argument {names[0]!r}")


def _int_arg(args: Mapping[str, object], name: str, default: int | None) -> int | None:
    value = args.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ToolError(f"{name} must be an integer >= 1")
    return value


def _timeout_arg(args: Mapping[str, object], ctx: ToolContext) -> float:
    value = args.get("timeout", args.get("timeout_s"))
    if value is None:
        requested = DEFAULT_SHELL_TIMEOUT_S
    elif (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ToolError("timeout must be a positive number of seconds")
    else:
        requested = float(value)
    return min(requested, ctx.timeout_s)


def _describe(exc: OSError, path: str) -> str:
    if isinstance(exc, FileNotFoundError):
        return f"{path!r} does not exist"
    if isinstance(exc, IsADirectoryError):
        return f"{path!r} is a directory"
    if isinstance(exc, NotADirectoryError):
        return f"a parent of {path!r} is not a directory"
    if isinstance(exc, PermissionError):
        return f"permission denied: {path!r}"
    return f"{path!r}: {exc.strerror or exc}"


def _output(**fields: Any) -> str:
    return json.dumps(fields)


# -- files ----------------------------------------------------------------------------------


def _open_regular(target: Path, path: str) -> tuple[int, os.stat_result]:
    """Open ``target`` for reading if it is a regular file (not a FIFO, device, directory)."""
    # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(target, flags)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise ToolError(f"{path!r} is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise ToolError(f"{path!r} is not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _binary_error(path: str) -> ToolError:
    return ToolError(f"{path!r} is a binary file; sys_os_read and sys_os_edit handle text only")


def _read_sync(cwd: Path, path: str, offset: int, limit: int, cap: int) -> ReadResult:
    target = resolve_inside(cwd, path)
    fd, _st = _open_regular(target, path)
    with os.fdopen(fd, "rb") as raw:
        if b"\x00" in raw.read(_SNIFF):
            raise _binary_error(path)
        raw.seek(0)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        parts: list[str] = []
        size = 0
        line = 1  # the line the next chunk belongs to
        taken = 0  # lines of the window read to their end
        cut = False
        stopped_at: int | None = None
        last = b""
        # Lines are split on b"\n" (ASCII), so the decoder is at a character boundary at
        # every line start; a line longer than a chunk arrives in pieces.
        while chunk := raw.readline(_CHUNK):
            last = chunk
            if line >= offset:
                if taken >= limit:
                    stopped_at = line
                    break
                text = decoder.decode(chunk)
                room = cap - size
                if len(text) > room:
                    parts.append(text[:room])
                    cut = True
                    stopped_at = line
                    break
                parts.append(text)
                size += len(text)
            if chunk.endswith(b"\n"):
                if line >= offset:
                    taken += 1
                line += 1
        else:
            parts.append(decoder.decode(b"", final=True))
        total = _count_lines(raw, line, last, stopped=stopped_at is not None)
    if stopped_at is None:
        returned = taken + (1 if last and not last.endswith(b"\n") and line >= offset else 0)
    else:
        returned = stopped_at - offset + (1 if cut else 0)
    result: ReadResult = {
        "path": str(target),
        "content": "".join(parts),
        "encoding": "utf-8",
        "offset": offset,
        "limit": limit,
        "returned_lines": returned,
        "total_lines": total,
        "truncated": cut,
    }
    if stopped_at is not None:
        result["next_offset"] = stopped_at
    return result


def _count_lines(raw: Any, line: int, last: bytes, *, stopped: bool) -> int | None:
    """The file's line count, reading on from where the window stopped (if it did).

    ``last`` is the last chunk read (when the window stopped: the first one past it, whose
    line is ``line``). Past :data:`MAX_COUNT_BYTES` more the count is unknown (None).
    """
    if not stopped:
        return line - 1 + (1 if last and not last.endswith(b"\n") else 0)
    newlines = last.count(b"\n")
    counted = 0
    while block := raw.read(_CHUNK):
        counted += len(block)
        if counted > MAX_COUNT_BYTES:
            return None
        newlines += block.count(b"\n")
        last = block
    return line - 1 + newlines + (0 if last.endswith(b"\n") else 1)


def atomic_write(target: Path, data: bytes, mode: int | None) -> None:
    """Replace ``target`` with ``data`` through a temporary file in the same directory."""
    temp = target.parent / f".corral-{secrets.token_hex(6)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temp, flags, 0o666)
    try:
        try:
            if mode is not None:
                os.fchmod(fd, stat.S_IMODE(mode))
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def _existing(target: Path, path: str) -> os.stat_result | None:
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return None
    if stat.S_ISDIR(st.st_mode):
        raise ToolError(f"{path!r} is a directory")
    if not stat.S_ISREG(st.st_mode):
        raise ToolError(f"{path!r} is not a regular file")
    return st


def _write_sync(cwd: Path, path: str, content: str) -> WriteResult:
    target = resolve_inside(cwd, path)
    before = _existing(target, path)
    if before is None:
        target.parent.mkdir(parents=True, exist_ok=True)
        # A directory another process created a moment ago could be a symlink by now.
        if not is_inside(os.path.realpath(cwd), os.path.realpath(target.parent)):
            raise ToolError(f"path {path!r} escapes the working directory")
    data = content.encode("utf-8", "surrogatepass")
    atomic_write(target, data, before.st_mode if before is not None else None)
    return {"path": path, "created": before is None, "bytes_written": len(data)}


def _edit_sync(cwd: Path, path: str, old: str, new: str, replace_all: bool) -> EditResult:
    target = resolve_inside(cwd, path)
    fd, st = _open_regular(target, path)
    with os.fdopen(fd, "rb") as raw:
        if st.st_size > MAX_EDIT_BYTES:
            raise ToolError(
                f"{path!r} is too large to edit ({st.st_size} bytes, limit {MAX_EDIT_BYTES})"
            )
        data = raw.read(MAX_EDIT_BYTES + 1)
    if len(data) > MAX_EDIT_BYTES:
        raise ToolError(f"{path!r} is too large to edit (limit {MAX_EDIT_BYTES} bytes)")
    if b"\x00" in data[:_SNIFF]:
        raise _binary_error(path)
    old_bytes = old.encode("utf-8", "surrogatepass")
    count = data.count(old_bytes)
    if count == 0:
        raise ToolError(f"oldText not found in {path!r}; nothing was changed")
    if count > 1 and not replace_all:
        raise ToolError(
            f"oldText occurs {count} times in {path!r}; include more surrounding text so it "
            "matches once, or set replace_all to true; nothing was changed"
        )
    updated = data.replace(old_bytes, new.encode("utf-8", "surrogatepass"))
    atomic_write(target, updated, st.st_mode)
    return {"path": path, "replacements": count}


async def _run_file_op(
    fn: Callable[..., Mapping[str, object]], ctx: ToolContext, path: str, *rest: Any
) -> str:
    def run() -> Mapping[str, object]:
        cwd = effective_cwd_sync(ctx)  # OSError here is already a ToolError
        try:
            return fn(cwd, path, *rest)
        except OSError as exc:
            raise ToolError(_describe(exc, path)) from exc

    return _output(**await in_thread(run))


async def sys_os_read(ctx: ToolContext, args: JsonObject) -> str:
    """Read a text file in the working directory (T-03)."""
    path = _str_arg(args, "path")
    offset = _int_arg(args, "offset", 1)
    limit = _int_arg(args, "limit", DEFAULT_READ_LIMIT)
    return await _run_file_op(_read_sync, ctx, path, offset, limit, ctx.max_output_chars)


async def sys_os_write(ctx: ToolContext, args: JsonObject) -> str:
    """Create or overwrite a file in the working directory (T-01)."""
    path = _str_arg(args, "path")
    content = _str_arg(args, "content", allow_empty=True)
    return await _run_file_op(_write_sync, ctx, path, content)


async def sys_os_edit(ctx: ToolContext, args: JsonObject) -> str:
    """Replace ``oldText`` with ``newText`` in a file of the working directory (T-02)."""
    path = _str_arg(args, "path")
    old = _str_arg(args, "oldText", "old_string")
    new = _str_arg(args, "newText", "new_string", allow_empty=True)
    replace_all = args.get("replace_all", False)
    if not isinstance(replace_all, bool):
        raise ToolError("replace_all must be true or false")
    return await _run_file_op(_edit_sync, ctx, path, old, new, replace_all)


# -- shell ----------------------------------------------------------------------------------


def shell_path() -> str:
    """The shell ``sys_os_shell`` runs: ``/bin/bash``, else ``bash`` on PATH, else ``/bin/sh``."""
    if os.access("/bin/bash", os.X_OK):
        return "/bin/bash"
    return shutil.which("bash") or "/bin/sh"


class _CappedText:
    """Decodes a byte stream as it arrives, keeping the first ``cap`` characters."""

    def __init__(self, cap: int) -> None:
        self._cap = cap
        self._parts: list[str] = []
        self.kept = 0
        self.dropped = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._done = False

    def feed(self, data: bytes | bytearray) -> None:
        self._add(self._decoder.decode(data))

    def finish(self) -> None:
        if not self._done:
            self._done = True
            self._add(self._decoder.decode(b"", final=True))

    def _add(self, text: str) -> None:
        room = self._cap - self.kept
        if room > 0:
            head = text[:room]
            self._parts.append(head)
            self.kept += len(head)
        self.dropped += len(text) - min(len(text), max(room, 0))

    def text(self) -> str:
        return "".join(self._parts)


def _shares(out_len: int, err_len: int, cap: int) -> tuple[int, int]:
    """How many characters of stdout and of stderr fit in ``cap`` together."""
    if out_len + err_len <= cap:
        return out_len, err_len
    half = cap // 2
    if out_len <= half:
        return out_len, cap - out_len
    if err_len <= half:
        return cap - err_len, err_len
    return half, cap - half


def _finish_text(sink: _CappedText, keep: int) -> str:
    text = sink.text()
    dropped = sink.dropped + len(text) - keep
    text = text[:keep]
    if dropped:
        text += f"\n...[truncated {dropped} chars]"
    return text


async def _pump(stream: trio.abc.ReceiveStream, sink: _CappedText) -> None:
    try:
        while chunk := await stream.receive_some(_CHUNK):
            sink.feed(chunk)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


def _group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` still has a member that is not a zombie.

    ``killpg(pgid, 0)`` also succeeds while only zombies are left: orphans whose new parent
    (init, or a container's PID 1 that never reaps) has not collected them. They no longer
    run, so on Linux the members are looked up in ``/proc``; elsewhere a group that answers
    counts as alive.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        entries = os.listdir("/proc")
    except OSError:
        return True
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as file:
                fields = file.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # After the command name: state, ppid, pgrp.
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def _end_group(process: trio.Process) -> None:
    """SIGTERM the command's process group, SIGKILL what is left after the grace period.

    Runs shielded: it is what a cancelled call does on its way out.
    """
    pgid = process.pid  # start_new_session: the shell leads its own group
    if process.returncode is not None and not await in_thread(_group_alive, pgid):
        return
    _signal_group(pgid, signal.SIGTERM)
    with trio.move_on_after(KILL_GRACE_S):
        await process.wait()
        # Members that outlive the leader (background jobs) are polled: there is no
        # notification when a process we are not the parent of exits.
        while await in_thread(_group_alive, pgid):
            await trio.sleep(0.05)
    if process.returncode is None or await in_thread(_group_alive, pgid):
        _signal_group(pgid, signal.SIGKILL)
        await process.wait()
        # SIGKILL is delivered asynchronously: make sure the members are gone too before the
        # call reports that they are, bounded in case one is stuck in the kernel.
        with trio.move_on_after(KILL_GRACE_S):
            while await in_thread(_group_alive, pgid):
                await trio.sleep(0.01)


async def run_shell(
    command: str,
    *,
    cwd: Path,
    timeout_s: float,
    max_output_chars: int,
    processes: ProcessTracker | None = None,
    sandbox: Sandbox | None = None,
) -> ShellResult:
    """Run ``command`` with bash in ``cwd`` and its own process group; see the module doc.

    The environment is the host's allow-listed one (no secrets: the command is the model's).
    ``processes`` is told about the group while it lives. With a ``sandbox``, bash runs
    inside it (:mod:`corral.tools.sandbox`); bubblewrap then leads the group.

    Returns:
        ``{"stdout", "stderr", "exit_code", "timed_out", "shell", "cwd"}``. ``exit_code``
        is negative when a signal ended the shell (``-15`` after a timeout's SIGTERM).

    Raises:
        ToolError: the shell could not be started.
    """
    shell = shell_path()
    environ = {**base_env(), "PWD": str(cwd)}
    argv = [shell, "-c", command]
    if sandbox is not None:
        argv = wrap(argv, sandbox, cwd=cwd, env=environ)
    try:
        process = await trio.lowlevel.open_process(
            argv,
            cwd=str(cwd),
            env=environ,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        raise ToolError(f"cannot start {shell} in {str(cwd)!r}: {exc.strerror or exc}") from exc
    assert process.stdout is not None and process.stderr is not None
    if processes is not None:
        processes.started(process.pid)
    out, err = _CappedText(max_output_chars), _CappedText(max_output_chars)
    try:
        with trio.move_on_after(timeout_s) as deadline:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_pump, process.stdout, out)
                nursery.start_soon(_pump, process.stderr, err)
                await process.wait()
    finally:
        with trio.CancelScope(shield=True):
            await _end_group(process)
            if processes is not None:
                processes.ended(process.pid)
            await process.stdout.aclose()
            await process.stderr.aclose()
    out.finish()
    err.finish()
    keep_out, keep_err = _shares(out.kept, err.kept, max_output_chars)
    return {
        "stdout": _finish_text(out, keep_out),
        "stderr": _finish_text(err, keep_err),
        "exit_code": process.returncode,
        "timed_out": deadline.cancelled_caught,
        "shell": shell,
        "cwd": str(cwd),
    }


async def sys_os_shell(ctx: ToolContext, args: JsonObject) -> str:
    """Run a shell command in the working directory (T-04)."""
    command = _str_arg(args, "command")
    timeout_s = _timeout_arg(args, ctx)
    cwd, sandbox = await effective_place(ctx)
    if not await in_thread(os.path.isdir, cwd):
        raise ToolError(f"the working directory {str(cwd)!r} does not exist")
    result = await run_shell(
        command,
        cwd=cwd,
        timeout_s=timeout_s,
        max_output_chars=ctx.max_output_chars,
        processes=ctx.processes,
        sandbox=sandbox,
    )
    return _output(**result)


# -- the table ------------------------------------------------------------------------------

_PATH = {"type": "string", "description": "File path, relative to the working directory."}

#: The four OS tools, in the order they are advertised.
TOOLS: list[ToolSpec] = [
    ToolSpec(
        name="sys_os_read",
        description=(
            "Read a text file in the OS environment's working directory. Returns its content; "
            "long files come back in pages (use offset/limit in lines)."
        ),
        parameters={
            "type": "object",
            "properties": {
                "path": _PATH,
                "offset": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "First line to return (1-based). Default 1.",
                },
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "description": f"Most lines to return. Default {DEFAULT_READ_LIMIT}.",
                },
            },
            "required": ["path"],
        },
        run=sys_os_read,
        family="os",
    ),
    ToolSpec(
        name="sys_os_write",
        description=(
            "Create or overwrite a file in the OS environment's working directory with the "
            "given text. Missing parent directories are created."
        ),
        parameters={
            "type": "object",
            "properties": {
                "path": _PATH,
                "content": {"type": "string", "description": "The file's new content."},
            },
            "required": ["path", "content"],
        },
        run=sys_os_write,
        family="os",
        mutates_files=True,
    ),
    ToolSpec(
        name="sys_os_edit",
        description=(
            "Replace text in a file of the OS environment's working directory. oldText must "
            "match exactly once, unless replace_all is true."
        ),
        parameters={
            "type": "object",
            "properties": {
                "path": _PATH,
                "oldText": {"type": "string", "description": "Exact text to replace."},
                "newText": {"type": "string", "description": "Replacement text."},
                "replace_all": {
                    "type": "boolean",
                    "description": "Replace every occurrence. Default false.",
                },
            },
            "required": ["path", "oldText", "newText"],
        },
        run=sys_os_edit,
        family="os",
        mutates_files=True,
    ),
    ToolSpec(
        name="sys_os_shell",
        description=(
            "Run a shell command in the OS environment and return stdout, stderr, and exit_code."
        ),
        parameters={
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "Shell command to execute."},
                "timeout": {
                    "type": "number",
                    "description": "Timeout in seconds (default 120).",
                },
            },
            "required": ["command"],
        },
        run=sys_os_shell,
        family="os",
        mutates_files=True,
    ),
]
