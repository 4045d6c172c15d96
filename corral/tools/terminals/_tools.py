"""The five terminal tools the model calls: ``sys_terminal_launch|send|read|list|close``."""

from __future__ import annotations

import json
from collections.abc import Mapping

from ..._jsonlines import JsonObject
from .._api import ToolContext, ToolError, ToolSpec
from ._manager import DEFAULT_READ_LINES, MAX_READ_LINES, Terminals
from ._resources import deleted_event
from ._spec import _check_session, _check_terminal

#: The session key used when the model gives none.
DEFAULT_SESSION = "main"


def _manager(ctx: ToolContext) -> Terminals:
    manager = ctx.terminals
    if not isinstance(manager, Terminals):
        raise ToolError("terminals are not available in this runner")
    return manager


def _names(args: Mapping[str, object]) -> tuple[str, str]:
    terminal = args.get("terminal")
    if not isinstance(terminal, str) or not terminal:
        raise ToolError('"terminal" is required: the name of a terminal from the agent spec')
    session = args.get("session")
    if session is None or session == "":
        session = DEFAULT_SESSION
    if not isinstance(session, str):
        raise ToolError('"session" must be a string')
    return terminal, session


async def _launch(ctx: ToolContext, args: JsonObject) -> str:
    terminal, session = _names(args)
    return json.dumps(await _manager(ctx).launch(ctx, terminal, session))


async def _send(ctx: ToolContext, args: JsonObject) -> str:
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


async def _read(ctx: ToolContext, args: JsonObject) -> str:
    terminal, session = _names(args)
    lines = args.get("lines", DEFAULT_READ_LINES)
    if isinstance(lines, bool) or not isinstance(lines, int) or not 1 <= lines <= MAX_READ_LINES:
        raise ToolError(f'"lines" must be a whole number from 1 to {MAX_READ_LINES}')
    out = await _manager(ctx).read(
        ctx.session_id, terminal, session, lines=lines, max_chars=ctx.max_output_chars
    )
    return json.dumps(out, ensure_ascii=False)


async def _list(ctx: ToolContext, args: JsonObject) -> str:
    del args
    return json.dumps(await _manager(ctx).list_terminals(ctx))


async def _close(ctx: ToolContext, args: JsonObject) -> str:
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
