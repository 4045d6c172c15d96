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
``total_lines`` what it held and what the file holds (None past
:data:`~corral.tools.os_files.MAX_COUNT_BYTES` more bytes). At most ``ctx.max_output_chars``
characters come back; ``"truncated": true`` says that cap cut the window. Whenever lines are
left after it, ``"next_offset"`` says where to go on (corral's addition). Only regular files
are read, so a FIFO or a device cannot hang or flood the call.

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

The file work is :mod:`corral.tools.os_files`, the shell :mod:`corral.tools.shell`; both
block, and run in worker threads (:mod:`corral.tools.threads`). This module holds what the
model sees: the arguments, the answers and the table of the four tools.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from typing import Any

from .._jsonlines import JsonObject
from ._api import ToolContext, ToolError, ToolSpec
from .os_env import effective_cwd_sync, effective_place
from .os_files import edit_file, read_window, write_file
from .shell import DEFAULT_SHELL_TIMEOUT_S, run_shell
from .threads import in_thread

__all__ = ["DEFAULT_READ_LIMIT", "TOOLS"]

#: Lines ``sys_os_read`` returns when the call does not say (omnigent's default).
DEFAULT_READ_LIMIT = 2000


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


# -- the tools ------------------------------------------------------------------------------


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
    return await _run_file_op(read_window, ctx, path, offset, limit, ctx.max_output_chars)


async def sys_os_write(ctx: ToolContext, args: JsonObject) -> str:
    """Create or overwrite a file in the working directory (T-01)."""
    path = _str_arg(args, "path")
    content = _str_arg(args, "content", allow_empty=True)
    return await _run_file_op(write_file, ctx, path, content)


async def sys_os_edit(ctx: ToolContext, args: JsonObject) -> str:
    """Replace ``oldText`` with ``newText`` in a file of the working directory (T-02)."""
    path = _str_arg(args, "path")
    old = _str_arg(args, "oldText", "old_string")
    new = _str_arg(args, "newText", "new_string", allow_empty=True)
    replace_all = args.get("replace_all", False)
    if not isinstance(replace_all, bool):
        raise ToolError("replace_all must be true or false")
    return await _run_file_op(edit_file, ctx, path, old, new, replace_all)


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
