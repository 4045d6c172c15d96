"""The read-only session and agent tools: what they ask the server and what the model sees.

``sys_session_get_info``, ``sys_session_list``, ``sys_session_get_history``, ``sys_agent_get``,
``sys_agent_list`` and ``sys_agent_download`` are runner-local (T-26): the runner asks the
session's server for its caller (:mod:`corral.tools.server_reads`), with the routes and the
result shapes of omnigent 0.19.1's runner, so a model reads the same answers on corral:

* ``sys_session_get_info`` (S-32..S-35, E-06): ``GET /v1/sessions/{id}`` (default the caller),
  projected; ``runner_online`` from ``GET /v1/runners/{id}/status``; the parked prompts as
  they are, and their count; no transcript.
* ``sys_session_list`` (S-24..S-26): the caller's ``sub_agents`` (children, and for a child
  caller ``main`` and its siblings) and the global ``sessions`` (an ``agent_name`` filter
  goes to the server), each with its runner's connectivity, asked once per runner.
* ``sys_session_get_history`` (S-27, S-28, E-05): the last ``tail_items`` items, oldest first,
  projected, then the target's parked prompts, which never reach its stored items.
* ``sys_agent_get`` (S-42, S-43), ``sys_agent_list`` (S-45, S-46) and ``sys_agent_download``
  (S-43, S-44; gates P-20, P-21 run before the server is asked).

A server that refuses what the model asked for (404, 401, 403) is an answer in the shape the
model knows (``session_not_found`` ...); one that cannot be reached, or answers in another
shape, is a tool error naming the tool only. Parts of a listing degrade one at a time: a
failed part is empty, the rest is shown.

Internal ``<tool>-native-ui`` wrapper names never reach the model (S-35, P-29): they become
the agent's display name.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

import trio
import yaml

from .._jsonlines import JsonObject
from ..spec import MAX_BUNDLE_BYTES
from ._api import ToolContext, ToolError
from .os_env import effective_cwd
from .paths import download_destination
from .server_reads import (
    AgentObject,
    ChildRow,
    ItemRow,
    Page,
    ReadFailed,
    RunnerStatus,
    SessionRow,
    SessionSnapshot,
    read,
    read_bytes,
    read_or_none,
    rows,
    runner_status_path,
    server_of,
    session_path,
)

__all__ = [
    "Window",
    "agent_and_title",
    "bundle_filename",
    "history_window",
    "project_item",
    "project_pending",
    "public_agent_name",
    "scan_agent_configs",
    "sys_agent_download",
    "sys_agent_get",
    "sys_agent_list",
    "sys_session_get_history",
    "sys_session_get_info",
    "sys_session_list",
]

#: Display names of the native coding agents' internal wrapper agents (S-35).
WRAPPER_NAMES = {
    "claude-native-ui": "Claude",
    "codex-native-ui": "Codex",
    "pi-native-ui": "Pi",
    "opencode-native-ui": "OpenCode",
    "cursor-native-ui": "Cursor",
    "kiro-native-ui": "Kiro",
    "goose-native-ui": "Goose",
    "antigravity-native-ui": "Antigravity",
    "qwen-native-ui": "Qwen Code",
    "kimi-native-ui": "Kimi",
    "hermes-native-ui": "Hermes",
    "devin-native-ui": "Devin",
}
#: A child closed by label, or by the legacy title marker.
CLOSED_LABEL = ("omnigent.closed", "true")
CLOSED_TITLE_INFIX = ":closed:"
#: Where ``sys_agent_list`` looks for agent configs the agent wrote, under its cwd.
AGENT_CONFIGS = Path(".omnigent") / "agent-configs"
#: Rows asked of a listing route (as omnigent's runner asks).
LIST_LIMIT = "1000"
CHILDREN_LIMIT = "100"
HISTORY_DEFAULT_TAIL = 10
HISTORY_MAX_TAIL = 50
#: Characters of one history item's text, then `` [truncated]`` (the default).
HISTORY_ITEM_CHARS = 2000
#: Characters of a whole history's items, at most.
HISTORY_MAX_CHARS = HISTORY_MAX_TAIL * HISTORY_ITEM_CHARS
_LEAN = {"include_items": "false", "include_liveness": "false"}


def public_agent_name(name: str | None) -> str | None:
    """``name``, or its display name when it is an internal wrapper's (S-35)."""
    return WRAPPER_NAMES.get(name, name) if name is not None else None


def _dumps(value: object) -> str:
    return json.dumps(value)


def _target(args: JsonObject, key: str, default: str | None, tool: str) -> str:
    value = args.get(key) or default
    if not isinstance(value, str) or not value:
        raise ToolError(f"{tool} requires a non-empty '{key}' string")
    return value


def _denied(exc: ReadFailed) -> bool:
    return exc.status in (401, 403)


# --- sys_session_get_info ---------------------------------------------------------------------


async def _runner_online(ctx: ToolContext, tool: str, runner_id: str | None) -> bool | None:
    """The runner's connectivity; None when unbound or the lookup fails."""
    if not runner_id:
        return None
    try:
        path = runner_status_path(runner_id)
    except ToolError:
        return None
    status = await read_or_none(server_of(ctx, tool), tool, path, RunnerStatus)
    return status.online if status is not None else None


async def sys_session_get_info(ctx: ToolContext, args: JsonObject) -> str:
    """A session's metadata, by default the caller's (S-32..S-35, E-06)."""
    tool = "sys_session_get_info"
    target = _target(args, "session_id", ctx.session_id, tool)
    server = server_of(ctx, tool)
    try:
        snap = await read(server, tool, session_path(target), SessionSnapshot, _LEAN)
    except ReadFailed as exc:
        if exc.status == 404:
            return _dumps({"error": "session_not_found", "session_id": target})
        if _denied(exc):
            return _dumps({"error": "access_denied", "session_id": target})
        raise
    pending = snap.pending_elicitations or []
    return _dumps(
        {
            "session_id": snap.id,
            "status": snap.status,
            "last_activity_at": snap.updated_at,
            "title": snap.title,
            "agent_id": snap.agent_id,
            "agent_name": public_agent_name(snap.agent_name),
            "runner_id": snap.runner_id,
            "runner_online": await _runner_online(ctx, tool, snap.runner_id),
            "host_id": snap.host_id,
            # corral reads no host registry: readiness is unknown, as for a session of no host.
            "configured_harnesses": None,
            "parent_session_id": snap.parent_session_id,
            "sub_agent_name": snap.sub_agent_name,
            "reasoning_effort": snap.reasoning_effort,
            "model": snap.model_override or snap.llm_model,
            "workspace": snap.workspace,
            "git_branch": snap.git_branch,
            "pending_elicitations": pending,
            "pending_elicitation_count": len(pending),
        }
    )


# --- sys_session_list ---------------------------------------------------------------------------


def _is_closed(row: ChildRow) -> bool:
    labels = row.labels or {}
    closed = labels.get(CLOSED_LABEL[0]) == CLOSED_LABEL[1]
    return closed or CLOSED_TITLE_INFIX in (row.title or "")


def _entries(children: list[ChildRow]) -> list[JsonObject]:
    """Named sub-agent rows (S-24): closed ones and titles with no ``agent:`` are left out."""
    return [
        {"agent": row.tool, "title": row.session_name, "conversation_id": row.id}
        for row in children
        if row.title and ":" in row.title and not _is_closed(row)
    ]


async def _children(ctx: ToolContext, tool: str, session_id: str) -> list[ChildRow] | None:
    path = f"{session_path(session_id)}/child_sessions"
    page = await read_or_none(server_of(ctx, tool), tool, path, Page, {"limit": CHILDREN_LIMIT})
    return rows(page, ChildRow)


async def _sub_agents(ctx: ToolContext, tool: str) -> list[JsonObject]:
    """The caller's children, and for a child caller ``main`` and its siblings (S-25)."""
    children = await _children(ctx, tool, ctx.session_id)
    if children is None:
        return []
    result = _entries(children)
    snap = await read_or_none(
        server_of(ctx, tool), tool, session_path(ctx.session_id), SessionSnapshot
    )
    parent = snap.parent_session_id if snap is not None else None
    if parent:
        result.append({"agent": "main", "title": None, "conversation_id": parent})
        siblings = await _children(ctx, tool, parent)
        result.extend(e for e in _entries(siblings or []) if e["conversation_id"] != ctx.session_id)
    return result


async def _online_map(ctx: ToolContext, tool: str, runner_ids: list[str]) -> dict[str, Any]:
    """Each distinct runner's connectivity, asked once per runner, all at once (S-26)."""
    online: dict[str, Any] = {}

    async def ask(runner_id: str) -> None:
        online[runner_id] = await _runner_online(ctx, tool, runner_id)

    async with trio.open_nursery() as nursery:
        for runner_id in dict.fromkeys(runner_ids):
            nursery.start_soon(ask, runner_id)
    return online


async def _session_rows(
    ctx: ToolContext, tool: str, agent_name: str | None = None
) -> list[SessionRow] | None:
    params = {"limit": LIST_LIMIT, "order": "desc", "visibility": "all"}
    if agent_name:
        params["agent_name"] = agent_name
    page = await read_or_none(server_of(ctx, tool), tool, "/v1/sessions", Page, params)
    return rows(page, SessionRow)


async def sys_session_list(ctx: ToolContext, args: JsonObject) -> str:
    """The caller's named sub-agents and the sessions it may see (S-24..S-26)."""
    tool = "sys_session_list"
    server_of(ctx, tool)
    agent_name = args.get("agent_name")
    wanted = agent_name if isinstance(agent_name, str) and agent_name else None
    sub_agents = await _sub_agents(ctx, tool)
    found = await _session_rows(ctx, tool, wanted) or []
    online = await _online_map(ctx, tool, [r.runner_id for r in found if r.runner_id])
    sessions = [
        {
            "session_id": r.id,
            "agent_name": public_agent_name(r.agent_name),
            "title": r.title,
            "status": r.status,
            "runner_id": r.runner_id,
            "runner_online": online.get(r.runner_id or ""),
            "parent_session_id": r.parent_session_id,
        }
        for r in found
    ]
    return _dumps({"sub_agents": sub_agents, "sessions": sessions})


# --- sys_session_get_history --------------------------------------------------------------------


class Window(NamedTuple):
    """The part of each item's text a history shows: ``chars`` from ``offset`` (S-27)."""

    chars: int = HISTORY_ITEM_CHARS
    offset: int = 0

    def cut(self, text: str | None) -> str | None:
        """``text[offset:offset + chars]``, `` [truncated]`` when more follows."""
        if text is None:
            return None
        window = text[self.offset : self.offset + self.chars]
        if self.offset + self.chars >= len(text):
            return window
        return window + " [truncated]"


def _text_of(content: object) -> str:
    if not isinstance(content, list):
        return ""
    texts = [b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str)]
    return " ".join(texts)


#: The part of an item a history shows when it is not asked for another.
DEFAULT_WINDOW = Window()


def project_item(item: ItemRow, window: Window = DEFAULT_WINDOW) -> JsonObject:
    """One stored item as a history shows it (S-27)."""
    if item.type == "function_call":
        args = item.arguments if isinstance(item.arguments, str) else None
        return {"type": "function_call", "tool": item.name, "args": window.cut(args)}
    if item.type == "function_call_output":
        output = item.output if isinstance(item.output, str) else json.dumps(item.output)
        return {"type": "function_call_output", "output": window.cut(output)}
    if item.type == "message":
        return {"type": "message", "role": item.role, "text": window.cut(_text_of(item.content))}
    return {"type": item.type}


def project_pending(event: JsonObject) -> JsonObject:
    """A parked ``response.elicitation_request`` as the last items of a history (E-05)."""
    params = event.get("params")
    params = params if isinstance(params, dict) else {}
    item: JsonObject = {
        "type": "pending_elicitation",
        "elicitation_id": event.get("elicitation_id"),
        "prompt": params.get("message"),
    }
    schema = params.get("requestedSchema")
    properties = schema.get("properties") if isinstance(schema, dict) else None
    if isinstance(properties, dict) and properties:
        item["fields"] = list(properties)
    return item


def agent_and_title(title: str | None) -> tuple[str | None, str | None]:
    """``"researcher:auth"`` → ``("researcher", "auth")``; ``"ui:<agent>:<label>"`` too; a
    title with no ``:`` (a top-level session) → ``(None, None)``."""
    if title is not None:
        title = title.partition(CLOSED_TITLE_INFIX)[0]
    if not title or ":" not in title:
        return None, None
    head, _, tail = title.partition(":")
    if head == "ui" and ":" in tail:
        agent, _, label = tail.partition(":")
        return agent, label
    return head, tail


def _whole(args: JsonObject, name: str, default: int, low: int) -> int:
    """``args[name]`` as a whole number >= ``low`` (a numeric string or an integral float
    too: providers do not all enforce the schema).

    Raises:
        ToolError: it is not one.
    """
    raw = args.get(name, default)
    value: int | None = None
    if isinstance(raw, int) and not isinstance(raw, bool):
        value = raw
    elif isinstance(raw, float) and raw.is_integer():
        value = int(raw)
    elif isinstance(raw, str):
        with contextlib.suppress(ValueError):
            value = int(raw)
    if value is None:
        raise ToolError(f"{name} must be a whole number, got {raw!r}")
    if value < low:
        raise ToolError(f"{name} must be >= {low}")
    return value


def history_window(args: JsonObject) -> tuple[int, Window]:
    """The items a history reads and the part of each it shows: ``tail_items`` (default 10,
    at most 50), ``content_max_chars`` (default 2000, the whole read within 50 x 2000) and
    ``content_offset_chars`` (S-27).

    Raises:
        ToolError: one of them is not a whole number in range.
    """
    tail = min(_whole(args, "tail_items", HISTORY_DEFAULT_TAIL, 1), HISTORY_MAX_TAIL)
    chars = min(_whole(args, "content_max_chars", HISTORY_ITEM_CHARS, 1), HISTORY_MAX_CHARS)
    offset = _whole(args, "content_offset_chars", 0, 0)
    return tail, Window(chars=min(chars, HISTORY_MAX_CHARS // tail), offset=offset)


async def sys_session_get_history(ctx: ToolContext, args: JsonObject) -> str:
    """The target's last items, oldest first, then its parked prompts (S-27, S-28, E-05)."""
    tool = "sys_session_get_history"
    target = _target(args, "conversation_id", None, tool)
    tail, window = history_window(args)
    server = server_of(ctx, tool)
    params = {"limit": str(tail), "order": "desc"}
    try:
        page = await read(server, tool, f"{session_path(target)}/items", Page, params)
    except ReadFailed as exc:
        if exc.status == 404:
            return _dumps({"error": "session_not_found", "conversation_id": target})
        if _denied(exc):
            return _dumps({"error": "session_out_of_tree", "conversation_id": target})
        raise
    stored = rows(page, ItemRow)
    if stored is None:
        raise ToolError(f"{tool}: the server's answer was not understood")
    items = [project_item(item, window) for item in reversed(stored)]
    snap = await read_or_none(server, tool, session_path(target), SessionSnapshot, _LEAN)
    agent, title = agent_and_title(snap.title if snap is not None else None)
    pending = (snap.pending_elicitations or []) if snap is not None else []
    items.extend(project_pending(event) for event in pending)
    return _dumps({"conversation_id": target, "agent": agent, "title": title, "items": items})


# --- sys_agent_* --------------------------------------------------------------------------------


def _agent_error(exc: ReadFailed, session_id: str) -> str:
    if exc.status == 404:
        return _dumps({"error": "agent_not_found", "session_id": session_id})
    if _denied(exc):
        return _dumps({"error": "access_denied", "session_id": session_id})
    raise exc


async def sys_agent_get(ctx: ToolContext, args: JsonObject) -> str:
    """The agent of a session: id, name, version, harness, MCP servers, policies (S-42)."""
    tool = "sys_agent_get"
    session_id = _target(args, "session_id", None, tool)
    path = f"{session_path(session_id)}/agent"
    try:
        agent = await read(server_of(ctx, tool), tool, path, AgentObject)
    except ReadFailed as exc:
        return _agent_error(exc, session_id)
    return _dumps(
        {
            "session_id": session_id,
            "agent_id": agent.id,
            "name": agent.name,
            "version": agent.version,
            "description": agent.description,
            "harness": agent.harness,
            "mcp_servers": agent.mcp_servers or [],
            "policies": agent.policies or [],
        }
    )


def scan_agent_configs(directory: Path) -> list[JsonObject]:
    """The agent YAMLs in ``directory``, sorted by path; a file that is not a mapping is
    skipped, and a missing directory is none (S-45, S-46)."""
    if not directory.is_dir():
        return []
    found: list[JsonObject] = []
    for path in sorted(directory.glob("*.yaml")):
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        if isinstance(loaded, dict):
            found.append(
                {
                    "name": loaded.get("name"),
                    "path": str(path),
                    "description": loaded.get("description"),
                }
            )
    return found


async def sys_agent_list(ctx: ToolContext, args: JsonObject) -> str:
    """Built-in agents, the agents of sessions and the agent configs in the cwd (S-45, S-46)."""
    tool = "sys_agent_list"
    server = server_of(ctx, tool)
    params = {"limit": LIST_LIMIT, "order": "desc"}
    agents = rows(await read_or_none(server, tool, "/v1/agents", Page, params), AgentObject)
    sessions = await _session_rows(ctx, tool)
    try:
        cwd = await effective_cwd(ctx)
        configs = await trio.to_thread.run_sync(scan_agent_configs, cwd / AGENT_CONFIGS)
    except ToolError:
        configs = []
    builtins = [
        {
            "agent_id": a.id,
            "name": a.name,
            "description": a.description,
            "harness": a.harness,
            # corral reads no host readiness, so whether a harness can launch is unknown.
            "available_on_host": None,
            "unavailable_reason": None,
        }
        for a in agents or []
    ]
    session_agents = [
        {"session_id": s.id, "agent_id": s.agent_id, "agent_name": s.agent_name, "status": s.status}
        for s in sessions or []
    ]
    return _dumps(
        {"builtins": builtins, "session_agents": session_agents, "local_configs": configs}
    )


def bundle_filename(agent_name: str, agent_version: str) -> str:
    """``<name>-v<version>.tar.gz``, the name's characters other than letters, digits, ``-``
    and ``_`` as ``_`` (S-44)."""
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in agent_name) or "agent"
    return f"{safe}-v{agent_version}.tar.gz"


def _write_whole(dest: Path, data: bytes) -> None:
    """Write ``data`` as ``dest`` all at once: a crash leaves the old file or the new one."""
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


async def sys_agent_download(ctx: ToolContext, args: JsonObject) -> str:
    """Download a session's agent bundle into the working directory (S-44; gates P-20, P-21,
    which run before the server is asked)."""
    tool = "sys_agent_download"
    dest_filename = args.get("dest_filename")
    cwd = await effective_cwd(ctx)
    if dest_filename is not None:
        await trio.to_thread.run_sync(download_destination, cwd, dest_filename)
    session_id = _target(args, "session_id", None, tool)
    server = server_of(ctx, tool)
    path = f"{session_path(session_id)}/agent/contents"
    try:
        data, headers = await read_bytes(server, tool, path, MAX_BUNDLE_BYTES)
    except ReadFailed as exc:
        return _agent_error(exc, session_id)
    agent_name = headers.get("x-agent-name", "agent")
    agent_version = headers.get("x-agent-version", "0")
    name = dest_filename if isinstance(dest_filename, str) else None
    name = name or bundle_filename(agent_name, agent_version)
    # Checked again with the final name: the default one may be a symlink out of the cwd too.
    dest = await trio.to_thread.run_sync(download_destination, cwd, name)
    await trio.to_thread.run_sync(_write_whole, dest, data)
    return _dumps(
        {
            "path": str(dest),
            "agent_name": agent_name,
            "agent_version": agent_version,
            "bytes_written": len(data),
        }
    )
