"""The effective OS environment a session's ``sys_os_*`` tools run in (T-05 to T-11).

A spec's ``os_env`` says where an agent works (``type``, ``cwd``, ``sandbox``, ...). The
runner turns it into the *effective* OS env, whose ``cwd`` is a concrete directory:

1. **A runner workspace wins** (T-06, T-08, T-09). When the runner has a workspace
   (``corral up --workspace``, ``CORRAL_WORKSPACE``, ``OMNIGENT_RUNNER_WORKSPACE``), the
   cwd is that workspace, whatever the spec says: relative, placeholder, absolute or
   absent. An absolute spec cwd is a boundary chosen when the session was created, not a
   runtime override.
2. **Without a workspace, an absolute spec cwd is used as written** (T-07); a leading
   ``~`` is expanded. It is not created: a spec naming a directory that does not exist
   gets tool errors, not a fresh empty directory.
3. **Otherwise the session gets its own directory** (T-10):
   ``<os_env_root>/<sanitised conversation id>/workspace``, created on first use. This
   covers no ``os_env``, an ``os_env`` without ``cwd``, the placeholders ``""``, ``"."``
   and ``"./"``, and a relative cwd (which has nothing to be relative to).

The fallback root is touched only in case 3, so a runner with a workspace never creates
it (T-08, T-09).

The effective env is a deep copy of the spec's ``os_env`` (T-11): every field, known or
not, is kept, and lists and the sandbox are new objects, so neither side can change the
other. Dropping a field such as ``sandbox.egress_rules`` would be a sandbox escape; a
copy that cannot forget fields is the guard.

This runner executes ``caller_process`` environments, without a sandbox or in a bubblewrap
sandbox on Linux (:mod:`corral.tools.sandbox`). :func:`unsupported_reason` says why an
effective env cannot be honoured (another ``type``, a sandbox this host cannot provide,
``fork``), so tools refuse instead of running with less isolation than the spec asked for.
"""

from __future__ import annotations

import copy
import hashlib
import os
import re
from collections.abc import Mapping
from pathlib import Path

import trio

from .._child_env import Sandbox, sandbox_of, sandbox_refusal
from .._jsonlines import JsonObject
from ._api import ToolContext, ToolError

__all__ = [
    "DEFAULT_OS_ENV_TYPE",
    "OS_ENV_ROOT_ENV_VARS",
    "PLACEHOLDER_CWDS",
    "WORKSPACE_ENV_VARS",
    "clone_os_env",
    "default_os_env_root",
    "effective_cwd",
    "effective_cwd_sync",
    "effective_os_env",
    "effective_place",
    "effective_place_sync",
    "sanitize_conversation_id",
    "unsupported_reason",
    "workspace_from_env",
]

#: The OS env type a spec without one gets, and the only one this runner executes.
DEFAULT_OS_ENV_TYPE = "caller_process"
#: ``os_env.cwd`` values that mean "wherever the runner puts this session" (T-08).
PLACEHOLDER_CWDS: frozenset[str | None] = frozenset({None, "", ".", "./"})
#: Environment variables naming the runner workspace, first match wins.
WORKSPACE_ENV_VARS = ("CORRAL_WORKSPACE", "OMNIGENT_RUNNER_WORKSPACE")
#: Environment variables naming the root of per-conversation fallback dirs, first match wins.
OS_ENV_ROOT_ENV_VARS = ("CORRAL_OS_ENV_ROOT", "OMNIGENT_RUNNER_OS_ENV_ROOT")

# A path segment is at most 255 bytes on common filesystems; longer ids keep a readable
# prefix plus a digest so two long ids never share a directory by truncation alone.
_MAX_SEGMENT = 128
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def sanitize_conversation_id(conversation_id: str) -> str:
    """A path segment for ``conversation_id``: unsafe characters become ``_`` (T-10).

    Only ASCII letters, digits, ``-`` and ``_`` are kept, so the result is never ``.``,
    ``..``, contains no separator and means the same on every filesystem:
    ``"conv/default workspace"`` gives ``conv_default_workspace``. An empty id gives
    ``default``; an id longer than 128 characters keeps its first 111 characters plus
    ``-`` and 16 hex digits of its SHA-256.
    """
    safe = _UNSAFE.sub("_", conversation_id) or "default"
    if len(safe) > _MAX_SEGMENT:
        digest = hashlib.sha256(conversation_id.encode("utf-8", "surrogatepass")).hexdigest()
        safe = f"{safe[: _MAX_SEGMENT - 17]}-{digest[:16]}"
    return safe


def clone_os_env(os_env: JsonObject) -> JsonObject:
    """A field-complete, unshared copy of an ``os_env`` mapping (T-11).

    Every key is kept, unknown ones included; lists and nested mappings (the sandbox) are
    new objects.
    """
    return copy.deepcopy(os_env)


def effective_os_env(
    spec: Mapping[str, object],
    *,
    workspace: Path | None,
    conversation_id: str,
    os_env_root: Path,
) -> JsonObject:
    """The OS env the session's tools run in, with a concrete absolute ``cwd`` (T-05 to T-11).

    Args:
        spec: the session's agent spec as a plain dict (``spec_to_dict``); ``{}`` when
            unknown. An ``os_env`` that is not a mapping (``inherit`` in a sub-agent,
            which only the parent's runner could resolve) counts as absent.
        workspace: the runner workspace, or None.
        conversation_id: the session id; names the fallback directory.
        os_env_root: where fallback directories live; created only when one is used.

    Returns:
        A copy of the spec's ``os_env`` (or ``{"type": "caller_process"}``) whose ``cwd``
        is a string and whose ``type`` defaults to ``caller_process``.

    Raises:
        OSError: the fallback directory cannot be created.
    """
    configured = spec.get("os_env")
    env = clone_os_env(configured) if isinstance(configured, dict) else {}
    env.setdefault("type", DEFAULT_OS_ENV_TYPE)
    if env["type"] is None:
        env["type"] = DEFAULT_OS_ENV_TYPE
    if workspace is not None:
        env["cwd"] = str(workspace)
        return env
    cwd = env.get("cwd")
    if isinstance(cwd, str) and cwd not in PLACEHOLDER_CWDS:
        expanded = Path(cwd).expanduser()
        if expanded.is_absolute():
            env["cwd"] = str(expanded)
            return env
    fallback = os_env_root / sanitize_conversation_id(conversation_id) / "workspace"
    fallback.mkdir(parents=True, exist_ok=True)
    env["cwd"] = str(fallback)
    return env


def unsupported_reason(env: Mapping[str, object]) -> str | None:
    """Why this runner cannot honour an effective OS env, or None when it can.

    Running a tool with less isolation than the spec asked for is an escape, so a spec
    that wants another env type, a sandbox this host cannot provide (another type, no
    bubblewrap) or a forked copy of the cwd is refused rather than run as a plain local
    process.
    """
    kind = env.get("type")
    if kind != DEFAULT_OS_ENV_TYPE:
        return f"os_env type {kind!r} is not supported by this runner (only 'caller_process')"
    refused = sandbox_refusal(env)
    if refused is not None:
        return refused
    if env.get("fork"):
        return "os_env.fork is not supported by this runner"
    if env.get("start_in_scratch"):
        return "os_env.start_in_scratch is not supported by this runner"
    return None


async def effective_cwd(ctx: ToolContext) -> Path:
    """The effective cwd of the call's session, after checking the env is supported.

    The fallback directory may be created, so this runs in a worker thread.

    Raises:
        ToolError: the spec asks for an environment this runner cannot provide, or the
            fallback directory cannot be created.
    """
    return await trio.to_thread.run_sync(effective_cwd_sync, ctx)


async def effective_place(ctx: ToolContext) -> tuple[Path, Sandbox | None]:
    """:func:`effective_place_sync` from trio."""
    return await trio.to_thread.run_sync(effective_place_sync, ctx)


def effective_cwd_sync(ctx: ToolContext) -> Path:
    """:func:`effective_cwd` for code already in a worker thread (a file tool resolves its
    directory in the thread that does its I/O: one thread hop per call, not two)."""
    return effective_place_sync(ctx)[0]


def effective_place_sync(ctx: ToolContext) -> tuple[Path, Sandbox | None]:
    """The effective cwd of the call's session and the sandbox its commands run in (None:
    none), after checking the env is supported; in a worker thread.

    Raises:
        ToolError: as :func:`effective_cwd`.
    """
    try:
        env = effective_os_env(
            ctx.spec,
            workspace=ctx.workspace,
            conversation_id=ctx.session_id,
            os_env_root=ctx.os_env_root,
        )
    except OSError as exc:
        raise ToolError(f"cannot create the session working directory: {exc.strerror}") from exc
    reason = unsupported_reason(env)
    if reason is not None:
        raise ToolError(reason)
    return Path(env["cwd"]), sandbox_of(env)


def workspace_from_env(environ: dict[str, str] | None = None) -> Path | None:
    """The runner workspace named by ``CORRAL_WORKSPACE``, else ``OMNIGENT_RUNNER_WORKSPACE``.

    Empty values count as unset. A relative value is made absolute against the current
    directory, so it means the same after the process changes directory.
    """
    source = os.environ if environ is None else environ
    for name in WORKSPACE_ENV_VARS:
        value = source.get(name)
        if value:
            return Path(value).expanduser().absolute()
    return None


def default_os_env_root(data_dir: Path, environ: dict[str, str] | None = None) -> Path:
    """Root of the per-conversation fallback directories (T-10).

    ``CORRAL_OS_ENV_ROOT``, else ``OMNIGENT_RUNNER_OS_ENV_ROOT``, else ``<data_dir>/os-envs``
    where ``data_dir`` is the tools actor's durable directory, so a session's files survive
    a runner restart and live under the state dir instead of a shared temp directory.
    Nothing is created here.
    """
    source = os.environ if environ is None else environ
    for name in OS_ENV_ROOT_ENV_VARS:
        value = source.get(name)
        if value:
            return Path(value).expanduser().absolute()
    return data_dir / "os-envs"
