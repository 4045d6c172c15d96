"""The session tools that write through the server, and ``sys_list_models``.

Runner-local (T-26): the runner asks the session's server for its caller, with the routes,
bodies and result shapes of omnigent 0.19.1's own runner, so a model reads the same answers
on corral:

* ``sys_session_close`` (S-29..S-31, P-18): reads the target's snapshot and the caller's,
  refuses a target outside the caller's tree (its ``root_conversation_id`` differs, or
  either is missing) and a target that is not a sub-agent (no parent, or a title that is
  not ``<agent>:<title>``), and only then ``PATCH /v1/sessions/{id}`` with the tombstoned
  title ``<agent>:<title>:closed:<id>``, the label ``omnigent.closed=true`` and
  ``archived: true`` (the server then stops the child's processes). A later named send
  for the same ``(agent, title)`` makes a fresh child.
* ``sys_session_share`` (S-36, S-37, P-05..P-08): ``PUT /v1/sessions/{id}/permissions``
  ``{"user_id", "level": 1|2|3}``. The spec's ``agent_session_sharing`` is the gate, checked
  here because the server cannot see the spec: off unless ``non-public`` or ``public``, and
  ``__public__`` only under ``public``.
* ``sys_session_create`` (S-38..S-41): ``agent_id`` mode is one JSON ``POST /v1/sessions``
  with ``parent_session_id`` forced to the caller and the message as ``initial_items``;
  ``config_path`` mode is one multipart ``POST /v1/sessions`` (``metadata`` and a gzip tar
  ``bundle`` holding the config unchanged: no ``${VAR}`` is expanded, that would upload the
  runner's secrets), then the message as the child's first event. Either way the caller's
  stream is told ``session.created``.
* ``sys_list_models`` (S-47, S-48): no server call. One row per declared sub-agent plus
  ``self``, from the model provider of ``$OMNIGENT_CONFIG_HOME/config.yaml``.

A refusal the model can act on is an answer in omnigent's shape (``session_not_found``,
``access_denied`` ...); a server that cannot be reached or answers in another shape is a
tool error naming the tool only (:mod:`corral.tools.server_reads`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import msgspec
import trio
import yaml

from .._exceptions import ServerError, ServerProtocolError, ServerRejected
from .._jsonlines import JsonObject
from ..server_client import ServerClient
from ..spec import MAX_BUNDLE_BYTES, make_bundle_files
from ._api import ToolContext, ToolError
from .os_env import effective_cwd
from .paths import resolve_inside
from .server_reads import (
    NOT_UNDERSTOOD,
    REFUSED,
    UNREACHABLE,
    ReadFailed,
    read,
    server_of,
    session_path,
)
from .session_reads import CLOSED_LABEL, CLOSED_TITLE_INFIX, agent_and_title

__all__ = [
    "CLAUDE_MODELS",
    "EXACTLY_ONE_MODE_MESSAGE",
    "SHARE_LEVELS",
    "WriteFailed",
    "model_catalog",
    "sys_list_models",
    "sys_session_close",
    "sys_session_create",
    "sys_session_share",
]

#: S-40: the error when ``sys_session_create`` gets both modes or neither.
EXACTLY_ONE_MODE_MESSAGE = (
    "sys_session_create requires exactly one of 'agent_id' (existing agent) or "
    "'config_path' (new agent from a local config)"
)
#: P-08: the friendly share levels and the server's numbers for them.
SHARE_LEVELS = {"read": 1, "edit": 2, "manage": 3}
PUBLIC_USER = "__public__"
SHARING_OFF = (
    "sys_session_share: session sharing is not enabled for this agent (set "
    "agent_session_sharing: non-public or agent_session_sharing: public in the spec)"
)
PUBLIC_OFF = (
    "sys_session_share: public ('__public__') sharing is not enabled for this agent "
    "(requires agent_session_sharing: public); grant a specific user instead"
)
#: S-47: the curated claude ids a claude subscription login can run, in this order.
CLAUDE_MODELS = (
    "claude-fable-5",
    "claude-opus-4-8",
    "claude-sonnet-5",
    "claude-sonnet-4-6",
    "claude-haiku-4-5",
)
#: Harnesses that run only one model family (their ids start with one of these).
_FAMILY_OF_HARNESS = {
    "claude-native": ("claude",),
    "claude-sdk": ("claude",),
    "claude": ("claude",),
    "codex-native": ("gpt", "codex", "o"),
    "codex": ("gpt", "codex", "o"),
}
_YAML_SUFFIXES = (".yaml", ".yml")


class WriteFailed(ReadFailed):
    """A write the server refused; ``message`` is its ``error.message``, when it sent one."""

    def __init__(self, message: str, *, status: int | None, server_message: str | None) -> None:
        super().__init__(message, status=status)
        self.server_message = server_message


class TreeNode(msgspec.Struct, kw_only=True):
    """``GET /v1/sessions/{id}``: the fields that place a session in a spawn tree."""

    id: str
    title: str | None = None
    parent_session_id: str | None = None
    root_conversation_id: str | None = None


class CreatedSession(msgspec.Struct, kw_only=True):
    """The JSON ``POST /v1/sessions`` answer (a session snapshot)."""

    id: str
    agent_name: str | None = None
    status: str | None = None


class CreatedFromBundle(msgspec.Struct, kw_only=True):
    """The multipart ``POST /v1/sessions`` answer: the session and the agent it made."""

    session_id: str
    agent_id: str
    agent_name: str | None = None


def _dumps(value: object) -> str:
    return json.dumps(value)


def _text_arg(args: JsonObject, key: str, tool: str, default: str | None = None) -> str:
    value = args.get(key) or default
    if not isinstance(value, str) or not value:
        raise ToolError(f"{tool} requires a non-empty '{key}' string")
    return value


def _optional_text(args: JsonObject, name: str) -> str | None:
    """``args[name]`` as a string; absent, null and empty all mean "not given"."""
    value = args.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ToolError(f"{name} must be a string")
    return value


def _server_message(body: bytes) -> str | None:
    """``error.message`` of the server's envelope ``{"error": {"code", "message"}}``."""
    try:
        decoded = json.loads(body)
    except ValueError:
        return None
    error = decoded.get("error") if isinstance(decoded, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) and message else None


async def _write(
    server: ServerClient,
    tool: str,
    method: str,
    path: str,
    body: JsonObject,
    *,
    files: dict[str, tuple[str, bytes, str]] | None = None,
) -> Any:
    """``method path`` with ``body``: the decoded answer.

    Raises:
        WriteFailed: an error status.
        ReadFailed: no answer, or one that is not JSON (``status`` None).
    """
    try:
        return await server.write(method, path, body, files=files)
    except ServerRejected as exc:
        status = exc.status or 0
        raise WriteFailed(
            REFUSED.format(tool=tool, status=status),
            status=status,
            server_message=_server_message(exc.body or b""),
        ) from None
    except ServerProtocolError:
        raise ReadFailed(NOT_UNDERSTOOD.format(tool=tool), status=None) from None
    except ServerError:
        raise ReadFailed(UNREACHABLE.format(tool=tool), status=None) from None


def _shape(value: Any, shape: type[Any], tool: str) -> Any:
    try:
        return msgspec.convert(value, shape)
    except msgspec.ValidationError:
        raise ToolError(NOT_UNDERSTOOD.format(tool=tool)) from None


# --- sys_session_close ----------------------------------------------------------------------


async def sys_session_close(ctx: ToolContext, args: JsonObject) -> str:
    """Tombstone and label a sub-agent of the caller's tree (S-29..S-31, P-18)."""
    tool = "sys_session_close"
    target = _text_arg(args, "conversation_id", tool)
    server = server_of(ctx, tool)
    try:
        node = await read(server, tool, session_path(target), TreeNode)
    except ReadFailed as exc:
        if exc.status == 404:
            return _dumps({"error": "session_not_found", "conversation_id": target})
        if exc.status in (401, 403):
            return _dumps({"error": "session_out_of_tree", "conversation_id": target})
        raise
    try:
        own = await read(server, tool, session_path(ctx.session_id), TreeNode)
    except ReadFailed as exc:
        if exc.status is None:
            raise
        # Not failing open: a caller whose own root is unknown closes nothing.
        raise ToolError(f"{tool} could not resolve the calling session") from None
    if own.root_conversation_id is None or node.root_conversation_id != own.root_conversation_id:
        return _dumps({"error": "session_out_of_tree", "conversation_id": target})
    agent, title = agent_and_title(node.title)
    if node.parent_session_id is None or agent is None or title is None:
        return _dumps({"error": "session_not_a_sub_agent", "conversation_id": target})
    body: JsonObject = {
        "title": f"{agent}:{title}{CLOSED_TITLE_INFIX}{target}",
        "labels": {CLOSED_LABEL[0]: CLOSED_LABEL[1]},
        "archived": True,
    }
    try:
        await _write(server, tool, "PATCH", session_path(target), body)
    except WriteFailed as exc:
        if exc.status == 404:
            return _dumps({"error": "session_not_found", "conversation_id": target})
        raise
    return _dumps({"closed": True, "conversation_id": target, "agent": agent, "title": title})


# --- sys_session_share ----------------------------------------------------------------------


async def sys_session_share(ctx: ToolContext, args: JsonObject) -> str:
    """Grant a user access to a session, default the caller's (S-36, S-37, P-05..P-08).

    The checks run in P-08's order: target and user, the spec's gate, its public tier, the
    level; only then is the server asked.
    """
    tool = "sys_session_share"
    target = _text_arg(args, "session_id", tool, default=ctx.session_id)
    user_id = args.get("user_id")
    if not isinstance(user_id, str) or not user_id:
        raise ToolError(f"{tool} requires a non-empty 'user_id'")
    policy = ctx.spec.get("agent_session_sharing")
    if policy not in ("non-public", "public"):
        return _dumps({"error": SHARING_OFF, "session_id": target})
    if user_id == PUBLIC_USER and policy != "public":
        return _dumps({"error": PUBLIC_OFF, "session_id": target})
    level = args.get("level") or "read"
    if not isinstance(level, str) or level not in SHARE_LEVELS:
        return _dumps({"error": f"{tool}: level must be one of {sorted(SHARE_LEVELS)}"})
    server = server_of(ctx, tool)
    body: JsonObject = {"user_id": user_id, "level": SHARE_LEVELS[level]}
    try:
        await _write(server, tool, "PUT", f"{session_path(target)}/permissions", body)
    except WriteFailed as exc:
        if exc.status == 404:
            return _dumps({"error": "session_not_found", "session_id": target})
        if exc.status in (401, 403):
            return _dumps({"error": "access_denied", "session_id": target})
        if exc.server_message is not None:
            answer = {"error": exc.server_message, "status_code": exc.status, "session_id": target}
            return _dumps(answer)
        return _dumps({"error": f"{tool} returned {exc.status}", "session_id": target})
    return _dumps({"shared": True, "session_id": target, "user_id": user_id, "level": level})


# --- sys_session_create ---------------------------------------------------------------------


def _user_message(text: str) -> JsonObject:
    return {"role": "user", "content": [{"type": "input_text", "text": text}]}


async def _announce(ctx: ToolContext, child_id: str, agent_id: str) -> None:
    """Tell the caller's stream a child exists (PROTOCOL_0_19 §J.3)."""
    await ctx.publish(
        {
            "type": "session.created",
            "conversation_id": ctx.session_id,
            "child_session_id": child_id,
            "agent_id": agent_id,
            "parent_session_id": ctx.session_id,
        }
    )


def _handle(
    child_id: str, agent_id: str, agent_name: str | None, title: str | None, status: str | None
) -> str:
    return _dumps(
        {
            "conversation_id": child_id,
            "kind": "sub_agent",
            "agent_id": agent_id,
            "agent_name": agent_name,
            "title": title,
            "status": status or "created",
        }
    )


def _refused(exc: WriteFailed, tool: str, key: str, value: str) -> str:
    if exc.status in (401, 403):
        return _dumps({"error": "access_denied", key: value})
    answer: JsonObject = {"error": f"{tool} returned {exc.status}"}
    if exc.server_message is not None:
        answer["detail"] = exc.server_message
    return _dumps(answer)


async def _create_from_agent(
    ctx: ToolContext, agent_id: str, title: str | None, message: str | None, model: str | None
) -> str:
    tool = "sys_session_create"
    body: JsonObject = {"agent_id": agent_id, "parent_session_id": ctx.session_id}
    if title is not None:
        body["title"] = title
    if model is not None:
        body["model_override"] = model
    if message is not None:
        body["initial_items"] = [{"type": "message", "data": _user_message(message)}]
    try:
        answer = await _write(server_of(ctx, tool), tool, "POST", "/v1/sessions", body)
    except WriteFailed as exc:
        if exc.status == 404:
            return _dumps({"error": "agent_not_found", "agent_id": agent_id})
        return _refused(exc, tool, "agent_id", agent_id)
    created: CreatedSession = _shape(answer, CreatedSession, tool)
    await _announce(ctx, created.id, agent_id)
    return _handle(created.id, agent_id, created.agent_name, title, created.status)


def _bundle_of(source: Path) -> tuple[str, bytes]:
    """The bundle to upload for a config file: a YAML as the only member of a gzip tar, its
    bytes unchanged; any other file (a ``.tar.gz`` bundle) as it is, for the server to
    judge.

    Raises:
        ToolError: the file is over the bundle limit.
    """
    size = source.stat().st_size
    if size > MAX_BUNDLE_BYTES:
        raise ToolError(f"sys_session_create: config_path is over {MAX_BUNDLE_BYTES} bytes")
    data = source.read_bytes()
    if source.suffix.lower() in _YAML_SUFFIXES:
        return f"{source.name}.tar.gz", make_bundle_files({source.name: data})
    return source.name, data


async def _create_from_config(
    ctx: ToolContext, config_path: str, title: str | None, message: str | None
) -> str:
    tool = "sys_session_create"
    cwd = await effective_cwd(ctx)

    def load() -> tuple[str, bytes] | None:
        # Containment first: a path outside the cwd is not even looked at (P-22).
        source = resolve_inside(cwd, config_path, what="config_path")
        return _bundle_of(source) if source.is_file() else None

    bundle = await trio.to_thread.run_sync(load)
    if bundle is None:
        return _dumps({"error": "config_not_found", "config_path": config_path})
    server = server_of(ctx, tool)
    metadata: JsonObject = {"parent_session_id": ctx.session_id}
    if title is not None:
        metadata["title"] = title
    name, data = bundle
    fields: JsonObject = {"metadata": json.dumps(metadata)}
    files = {"bundle": (name, data, "application/gzip")}
    try:
        answer = await _write(server, tool, "POST", "/v1/sessions", fields, files=files)
    except WriteFailed as exc:
        return _refused(exc, tool, "config_path", config_path)
    created: CreatedFromBundle = _shape(answer, CreatedFromBundle, tool)
    if message is not None:
        event: JsonObject = {"type": "message", "data": _user_message(message)}
        try:
            await _write(server, tool, "POST", f"{session_path(created.session_id)}/events", event)
        except ReadFailed as exc:
            # The child exists: say so, so the model can send to it instead of creating again.
            why = f"{exc.status}" if exc.status is not None else "no answer"
            return _dumps(
                {
                    "error": f"child session created but message failed: {why}",
                    "conversation_id": created.session_id,
                }
            )
    await _announce(ctx, created.session_id, created.agent_id)
    return _handle(created.session_id, created.agent_id, created.agent_name, title, "created")


async def sys_session_create(ctx: ToolContext, args: JsonObject) -> str:
    """Create a child session from an agent id or a local config (S-38, S-39; gates S-40,
    S-41, P-22, which run before any server call)."""
    agent_id = _optional_text(args, "agent_id")
    config_path = _optional_text(args, "config_path")
    if (agent_id is None) == (config_path is None):
        raise ToolError(EXACTLY_ONE_MODE_MESSAGE)
    title = _optional_text(args, "title")
    message = _optional_text(args, "message")
    if config_path is not None:
        return await _create_from_config(ctx, config_path, title, message)
    assert agent_id is not None
    return await _create_from_agent(ctx, agent_id, title, message, _optional_text(args, "model"))


# --- sys_list_models ------------------------------------------------------------------------


def _providers_file() -> Path:
    """``$OMNIGENT_CONFIG_HOME/config.yaml``, else ``~/.omnigent/config.yaml`` (H-10)."""
    home = os.environ.get("OMNIGENT_CONFIG_HOME") or str(Path.home() / ".omnigent")
    return Path(home).expanduser() / "config.yaml"


def _default_provider(path: Path) -> JsonObject | None:
    """The provider marked ``default: true`` (else the only one); None when there is none."""
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    providers = loaded.get("providers") if isinstance(loaded, dict) else None
    if not isinstance(providers, dict):
        return None
    entries = [p for p in providers.values() if isinstance(p, dict)]
    marked = [p for p in entries if p.get("default") is True]
    if marked:
        return marked[0]
    return entries[0] if len(entries) == 1 else None


def _family(model_id: str) -> str:
    return model_id.split("-", 1)[0]


def _row(provider: JsonObject | None, harness: str | None) -> JsonObject:
    """One worker's ``{source, verified, models, note}``: only ids its harness can run."""
    if provider is None:
        note = "no model provider is configured (providers: in $OMNIGENT_CONFIG_HOME/config.yaml)"
        return {"source": "none", "verified": False, "models": [], "note": note}
    kind, cli = provider.get("kind"), provider.get("cli")
    if kind != "subscription":
        note = f"listing the models of a {kind!r} provider is not supported on this runner"
        return {"source": "none", "verified": False, "models": [], "note": note}
    # A subscription login has no listing API: the curated ids of its CLI, unverified.
    curated = CLAUDE_MODELS if cli == "claude" else ()
    prefixes = _FAMILY_OF_HARNESS.get(harness or "")
    ids = [m for m in curated if prefixes is None or m.startswith(prefixes)]
    note = (
        f"the {cli or 'unknown'} CLI login exposes no model-listing API; these are the "
        "curated ids it is known to run, not checked against the account"
    )
    models = [{"id": m, "family": _family(m)} for m in ids]
    return {"source": "static", "verified": False, "models": models, "note": note}


def _workers(spec: JsonObject) -> dict[str, str | None]:
    """Each declared sub-agent's name and harness (None: not known from the spec)."""
    workers: dict[str, str | None] = {}
    tools = spec.get("tools")
    declared = tools.get("agents") if isinstance(tools, dict) else None
    for entry in declared if isinstance(declared, list) else []:
        if isinstance(entry, str) and entry:
            workers[entry] = None
        elif isinstance(entry, dict) and isinstance(entry.get("name"), str):
            workers[entry["name"]] = _harness(entry)
    inline = spec.get("sub_agents")
    for entry in inline if isinstance(inline, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("name"), str):
            workers[entry["name"]] = _harness(entry)
    return workers


def _harness(spec: JsonObject) -> str | None:
    executor = spec.get("executor")
    if not isinstance(executor, dict):
        return None
    config = executor.get("config")
    harness = executor.get("harness")
    if harness is None and isinstance(config, dict):
        harness = config.get("harness")
    return harness if isinstance(harness, str) else None


def model_catalog(spec: JsonObject, providers_file: Path) -> JsonObject:
    """``sys_list_models``'s answer: a row per declared sub-agent, then ``self`` (S-47)."""
    provider = _default_provider(providers_file)
    rows: JsonObject = {name: _row(provider, h) for name, h in _workers(spec).items()}
    rows["self"] = _row(provider, _harness(spec))
    return rows


async def sys_list_models(ctx: ToolContext, args: JsonObject) -> str:
    """The models each sub-agent and the caller can run; runs in the runner (S-47, S-48).

    Without a spec the answer is an error, never ``{}``, which would read as "no workers".
    """
    if not ctx.spec:
        return "Error: sys_list_models requires an agent spec"
    catalog = await trio.to_thread.run_sync(model_catalog, ctx.spec, _providers_file())
    return _dumps(catalog)
