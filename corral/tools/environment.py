"""A session's environment ``default`` as the server's file browser sees it (PROTOCOL_0_19.md §H).

The omnigent server proxies a client's ``/v1/sessions/{id}/resources/environments/...``
requests to the runner; the tools actor hands them to :meth:`Environments.answer`. Every
session has one environment, ``default``: its root is the session's effective cwd, exactly
where the ``sys_os_*`` tools work (:mod:`corral.tools.os_env`, T-05 to T-10), so what a user
browses is what the model reads and writes. Routes, below ``.../environments``:

=========================================  ==================================================
route                                      answer
=========================================  ==================================================
``GET``                                    list page holding ``default``
``GET /default``                           the environment, with ``root``/``home``/``reachable``
``GET /default/filesystem[/{path}]``       a directory's page, or a file's content
                                           (``?download=true``: the file's bytes)
``PUT /default/filesystem/{path}``         ``write_result`` (``{content, encoding,
                                           create_parents}``)
``PATCH /default/filesystem/{path}``       ``edit_result`` (``{old_text, new_text,
                                           replace_all}``)
``DELETE /default/filesystem/{path}``      ``delete_result`` (``?recursive=true``)
``GET /default/search[/{path}]?q=``        entries whose name or path contains ``q``
``GET /default/changes``                   uncommitted changes under the root (git)
``GET /default/diff/{path}``               ``file_diff``: the file at ``HEAD`` and now
``POST /default/shell``                    ``shell_result`` (``{command, timeout?}``)
=========================================  ==================================================

Errors are always ``{"error": {"code", "message"}}`` (§H.2: the server reads
``error.message`` and fails on a string ``error``): 400 ``invalid_input`` for a bad query or
body, 400 ``invalid_path``/403 ``path_unreachable`` for a path out of the root
(:mod:`corral.tools.env_files`), 404 ``not_found`` for an unknown environment or route,
404 ``path_not_found``, 405, 409, 413, 415 as the file work says, and 409
``unsupported_environment`` when the session's spec asks for an environment this runner
cannot provide (a sandbox without bubblewrap: browsing or a shell must not be the way around
it). A sandboxed session's shell runs in its sandbox, as its ``sys_os_shell`` does.

**Changes and diffs** come from git, as omnigent's runner gets them in a git work tree
(:mod:`corral.tools.env_changes`): every uncommitted change under the root against
``HEAD``. Outside a work tree there is no record of changes (corral's changed-files signal,
:mod:`corral.tools.changed_files`, only says *that* something changed): ``changes`` is the
empty list and ``diff`` 404, so the client shows no changes rather than wrong ones.

**The spec.** The root depends on the session's ``os_env`` when the runner has no
workspace (an absolute ``cwd``, T-07). A tunnelled request carries no spec, so the tools
actor remembers the ``os_env`` of the last tool call of each session (:class:`SessionSpecs`,
durable); a session no tool has run for yet is browsed as a spec without ``os_env``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import mimetypes
import os
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import trio

from .._child_env import Sandbox, sandbox_of
from .._jsonlines import JsonObject
from ..routes import HttpRequest
from . import env_changes, env_files
from ._api import ProcessTracker, ToolError
from ._replies import (
    EnvironmentResource,
    FileDiff,
    Page,
    PageParams,
    Resource,
    SearchPage,
    ShellAnswer,
)
from .changed_files import ENVIRONMENT_ID
from .env_files import FsError
from .os_env import effective_os_env, unsupported_reason
from .shell import DEFAULT_SHELL_TIMEOUT_S, run_shell
from .threads import in_thread

__all__ = [
    "ENVIRONMENT_NAME",
    "MAX_PAGE_LIMIT",
    "MAX_SEARCH_LIMIT",
    "Download",
    "Environments",
    "RouteError",
    "SessionSpecs",
    "environment_resource",
    "page",
    "page_params",
    "query_params",
]

log = logging.getLogger("corral.tools.environment")

ENVIRONMENT_NAME = "Primary environment"
#: ``limit`` of a list page: 1 to this, 20 when not given.
MAX_PAGE_LIMIT = 1000
DEFAULT_PAGE_LIMIT = 20
#: ``limit`` of a search: 1 to this, and the default.
MAX_SEARCH_LIMIT = 500

_T = TypeVar("_T")


@dataclass(slots=True)
class Download:
    """A file to stream as the answer (``?download=true``): its head, then its bytes."""

    file: BinaryIO
    name: str
    size: int

    def headers(self) -> list[tuple[str, str]]:
        """The attachment's headers, as omnigent's runner sends them."""
        quoted = urllib.parse.quote(self.name)
        disposition = (
            f'attachment; filename="{self.name}"'
            if quoted == self.name
            else f"attachment; filename*=utf-8''{quoted}"
        )
        return [
            ("content-type", mimetypes.guess_type(self.name)[0] or "application/octet-stream"),
            ("content-length", str(self.size)),
            ("content-disposition", disposition),
            ("cache-control", "no-store"),
            ("x-content-type-options", "nosniff"),
        ]


class RouteError(Exception):
    """A request answered with an error: status, code and message (§H.2's shape)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def _bad_input(message: str) -> RouteError:
    return RouteError(400, "invalid_input", message)


# -- query and body -----------------------------------------------------------------------


def query_params(query: str) -> dict[str, str]:
    """The query string's parameters; a repeated one keeps its last value."""
    return dict(urllib.parse.parse_qsl(query, keep_blank_values=True))


def _int_param(params: dict[str, str], name: str, default: int, high: int) -> int:
    raw = params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise _bad_input(f"{name} must be an integer from 1 to {high}") from None
    if not 1 <= value <= high:
        raise _bad_input(f"{name} must be an integer from 1 to {high}")
    return value


def _choice(params: dict[str, str], name: str, default: str, allowed: tuple[str, ...]) -> str:
    value = params.get(name, default)
    if value not in allowed:
        raise _bad_input(f"{name} must be one of {', '.join(allowed)}")
    return value


def _flag(params: dict[str, str], name: str) -> bool:
    raw = params.get(name, "false").lower()
    if raw in ("true", "1", "yes"):
        return True
    if raw in ("false", "0", "no", ""):
        return False
    raise _bad_input(f"{name} must be true or false")


def _body(request: HttpRequest) -> JsonObject:
    try:
        body = request.json()
    except (ValueError, UnicodeDecodeError):
        raise _bad_input("The request body is not valid JSON.") from None
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise _bad_input("The request body must be a JSON object.")
    return body


def page_params(params: dict[str, str]) -> PageParams:
    """``limit`` (1 to 1000, default 20), ``order`` (``asc``/``desc``, default ``desc``),
    ``after`` and ``before`` of a list route, checked.

    Raises:
        RouteError: 400 ``invalid_input``.
    """
    return {
        "limit": _int_param(params, "limit", DEFAULT_PAGE_LIMIT, MAX_PAGE_LIMIT),
        "order": _choice(params, "order", "desc", ("asc", "desc")),
        "after": params.get("after") or None,
        "before": params.get("before") or None,
    }


# -- resources ------------------------------------------------------------------------------


def page(
    items: Sequence[Resource],
    *,
    limit: int = DEFAULT_PAGE_LIMIT,
    order: str = "desc",
    after: str | None = None,
    before: str | None = None,
) -> Page:
    """A list page of resources by ``id``, as omnigent's runner pages in memory.

    ``desc`` reverses the list; ``after`` starts past its id, ``before`` ends before its id
    (the ``limit`` items just before it); an unknown cursor is ignored. ``has_more`` is
    about the direction of travel.
    """
    working = list(reversed(items)) if order == "desc" else list(items)
    ids = [item["id"] for item in working]
    start = ids.index(after) + 1 if after in ids else 0
    end = ids.index(before) if before in ids else len(working)
    window = working[start:end]
    if before in ids:
        data, has_more = window[-limit:], len(window) > limit
    else:
        data, has_more = window[:limit], len(window) > limit
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }


def environment_resource(session_id: str) -> EnvironmentResource:
    """The ``session.resource`` of a session's ``default`` environment (as lists carry it)."""
    return {
        "id": ENVIRONMENT_ID,
        "object": "session.resource",
        "type": "environment",
        "session_id": session_id,
        "name": ENVIRONMENT_NAME,
        "metadata": {"environment_type": "caller_process", "role": "primary"},
    }


# -- what a session's spec said -------------------------------------------------------------


class SessionSpecs:
    """The ``os_env`` each session's tool calls last carried, kept on disk.

    Only ``os_env`` decides where a session's environment is, so only it is kept (not the
    prompt, not credentials the spec may hold). One small file per session, named by a
    digest of its id, written only when the value changes.
    """

    def __init__(self, dir: Path) -> None:
        self.dir = dir
        self._known: dict[str, JsonObject] = {}

    def _path(self, session_id: str) -> Path:
        return self.dir / (hashlib.sha256(session_id.encode()).hexdigest()[:32] + ".json")

    async def learn(self, session_id: str, spec: Mapping[str, object]) -> None:
        """Remember the ``os_env`` of ``spec`` (a tool call's) for ``session_id``."""
        os_env = spec.get("os_env")
        value = {"os_env": os_env} if os_env is not None else {}
        if await self.get(session_id) == value:
            return
        self._known[session_id] = value
        await trio.to_thread.run_sync(self._write, session_id, value)

    def _write(self, session_id: str, value: JsonObject) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self._path(session_id)
        temp = path.with_suffix(".tmp")
        temp.write_text(json.dumps(value))
        os.replace(temp, path)

    async def get(self, session_id: str) -> JsonObject:
        """The spec (``{"os_env": ...}`` or ``{}``) to resolve ``session_id``'s root with."""
        known = self._known.get(session_id)
        if known is None:
            known = await trio.to_thread.run_sync(self._read, session_id)
            self._known[session_id] = known
        return known

    def _read(self, session_id: str) -> JsonObject:
        try:
            value = json.loads(self._path(session_id).read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError):
            log.warning("unreadable os_env record of session %s; using none", session_id)
            return {}
        return value if isinstance(value, dict) else {}


# -- the routes -----------------------------------------------------------------------------


class Environments:
    """Answers ``.../resources/environments[/...]`` for every session of a tools actor.

    Args:
        workspace: the runner workspace, or None.
        os_env_root: root of the per-session fallback directories (T-10).
        specs: what each session's spec says about its ``os_env``.
        timeout_s: the longest a shell command may run.
        max_output_chars: stdout and stderr of a shell command, together, at most.
        processes: told about every shell's process group (swept after a crash).
    """

    def __init__(
        self,
        *,
        workspace: Path | None,
        os_env_root: Path,
        specs: SessionSpecs,
        timeout_s: float,
        max_output_chars: int,
        processes: ProcessTracker | None = None,
    ) -> None:
        self.workspace = workspace
        self.os_env_root = os_env_root
        self.specs = specs
        self.timeout_s = timeout_s
        self.max_output_chars = max_output_chars
        self.processes = processes

    async def root(self, session_id: str) -> Path:
        """The session's environment root (created when it is the fallback directory).

        Raises:
            RouteError: 409 ``unsupported_environment``; 500 when the fallback directory
                cannot be created.
        """
        return (await self.place(session_id))[0]

    async def place(self, session_id: str) -> tuple[Path, Sandbox | None]:
        """The session's environment root and the sandbox its shells run in (None: none).

        Raises:
            RouteError: as :meth:`root`.
        """
        spec = await self.specs.get(session_id)

        def resolve() -> JsonObject:
            return effective_os_env(
                spec,
                workspace=self.workspace,
                conversation_id=session_id,
                os_env_root=self.os_env_root,
            )

        try:
            env = await in_thread(resolve)
        except OSError as exc:
            raise RouteError(
                500,
                "environment_unavailable",
                f"The session's working directory cannot be created: {exc.strerror}",
            ) from exc
        reason = unsupported_reason(env)
        if reason is not None:
            raise RouteError(409, "unsupported_environment", reason)
        return Path(env["cwd"]), sandbox_of(env)

    async def answer(
        self, request: HttpRequest, session_id: str, rest: list[str]
    ) -> tuple[int, Mapping[str, object] | Download, bool]:
        """Answer a request whose path below ``.../resources/environments`` is ``rest``.

        Returns:
            ``(status, body, mutated)``; ``body`` is a :class:`Download` for a file to stream
            (the caller closes it); ``mutated`` is True after a successful write, edit,
            delete or shell command (the caller publishes the changed-files signal).

        Raises:
            RouteError: the answer is an error.
        """
        method = request.method.upper()
        params = query_params(request.query)
        if not rest:
            _only(method, "GET")
            return 200, page([environment_resource(session_id)], **page_params(params)), False
        env_id = urllib.parse.unquote(rest[0])
        if env_id != ENVIRONMENT_ID:
            raise RouteError(404, "not_found", f"Environment {env_id!r} not found")
        if len(rest) == 1:
            _only(method, "GET")
            return 200, await self._describe(session_id), False
        kind, tail = rest[1], urllib.parse.unquote("/".join(rest[2:]))
        if kind == "filesystem":
            return await self._filesystem(request, method, session_id, tail, params)
        if kind == "search":
            _only(method, "GET")
            return 200, await self._search(session_id, tail, params), False
        if kind == "changes" and not tail:
            _only(method, "GET")
            root = await self.root(session_id)
            return 200, await _git(env_changes.changed_files(root)), False
        if kind == "diff":
            _only(method, "GET")
            return 200, await self._diff(session_id, tail), False
        if kind == "shell" and not tail:
            _only(method, "POST")
            return 200, await self._shell(session_id, _body(request)), True
        raise RouteError(404, "not_found", f"No route {method} {request.path} on this runner.")

    async def _describe(self, session_id: str) -> EnvironmentResource:
        root = str(await self.root(session_id))
        resource = environment_resource(session_id)
        metadata = resource["metadata"]
        metadata["root"] = root
        home = os.path.expanduser("~")
        if os.path.isabs(home):
            metadata["home"] = home
        # What the browser can reach: the root, nothing else (absolute paths elsewhere are
        # refused, so the environment is not "unconfined" as far as browsing goes).
        metadata["reachable"] = {
            "unconfined": False,
            "roots": [{"path": root, "access": "write", "origin": "cwd"}],
        }
        return resource

    async def _fs(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        def run() -> _T:
            return fn(*args, **kwargs)

        try:
            return await in_thread(run)
        except FsError as exc:
            raise RouteError(exc.status, exc.code, exc.message) from None

    async def _filesystem(
        self,
        request: HttpRequest,
        method: str,
        session_id: str,
        path: str,
        params: dict[str, str],
    ) -> tuple[int, Mapping[str, object] | Download, bool]:
        if method == "GET":
            paging = page_params(params)
            # The server sends ``scope=reach`` for a caller who may follow a link out of the
            # workspace; corral never serves outside the root, so both scopes read the same.
            _choice(params, "scope", "workspace", ("workspace", "reach"))
            root = await self.root(session_id)
            if _flag(params, "download"):
                file, name, size = await self._fs(env_files.open_download, root, path)
                return 200, Download(file, name, size), False
            return 200, await self._fs(env_files.list_or_read, root, path, **paging), False
        if method == "PUT":
            body = _body(request)
            data = _content(body)
            create_parents = body.get("create_parents", True)
            if not isinstance(create_parents, bool):
                raise _bad_input("create_parents must be true or false")
            root = await self.root(session_id)
            result = await self._fs(
                env_files.write_file, root, path, data, create_parents=create_parents
            )
            return 200, result, True
        if method == "PATCH":
            body = _body(request)
            old, new = body.get("old_text"), body.get("new_text")
            if not isinstance(old, str) or not old:
                raise _bad_input("old_text must be a non-empty string")
            if not isinstance(new, str):
                raise _bad_input("new_text must be a string")
            replace_all = body.get("replace_all", False)
            if not isinstance(replace_all, bool):
                raise _bad_input("replace_all must be true or false")
            root = await self.root(session_id)
            edited = await self._fs(
                env_files.edit_file, root, path, old, new, replace_all=replace_all
            )
            return 200, edited, True
        if method == "DELETE":
            recursive = _flag(params, "recursive")
            root = await self.root(session_id)
            deleted = await self._fs(env_files.delete_path, root, path, recursive=recursive)
            return 200, deleted, True
        raise _not_allowed(method)

    async def _search(self, session_id: str, path: str, params: dict[str, str]) -> SearchPage:
        query = params.get("q", "")
        if not query.strip():
            raise _bad_input("q must be a non-blank search text")
        limit = _int_param(params, "limit", MAX_SEARCH_LIMIT, MAX_SEARCH_LIMIT)
        include = env_files.split_globs(params.get("include"))
        exclude = env_files.split_globs(params.get("exclude"))
        root = await self.root(session_id)
        return await self._fs(
            env_files.search, root, path, query, limit=limit, include=include, exclude=exclude
        )

    async def _diff(self, session_id: str, path: str) -> FileDiff:
        root = await self.root(session_id)
        target = await self._fs(env_files.resolve, root, path)
        if not target.rel:
            raise RouteError(400, "invalid_path", "Cannot diff the environment root")
        return await _git(env_changes.file_diff(target))

    async def _shell(self, session_id: str, body: Mapping[str, object]) -> ShellAnswer:
        command = body.get("command")
        if not isinstance(command, str) or not command.strip():
            raise _bad_input("'command' is required")
        timeout = body.get("timeout")
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 1
        ):
            raise _bad_input("'timeout' must be an integer number of seconds >= 1")
        timeout_s = min(float(timeout or DEFAULT_SHELL_TIMEOUT_S), self.timeout_s)
        root, sandbox = await self.place(session_id)
        if not await in_thread(os.path.isdir, root):
            raise RouteError(404, "path_not_found", f"The environment root {root} does not exist")
        try:
            result = await run_shell(
                command,
                cwd=root,
                timeout_s=timeout_s,
                max_output_chars=self.max_output_chars,
                processes=self.processes,
                sandbox=sandbox,
            )
        except ToolError as exc:  # the shell could not start
            raise RouteError(500, "shell_failed", str(exc)) from exc
        return {
            "object": "session.environment.shell_result",
            "stdout": result["stdout"],
            "stderr": result["stderr"],
            "exit_code": result["exit_code"],
            "timed_out": result["timed_out"],
            "cwd": result["cwd"],
        }


async def _git(work: Awaitable[_T]) -> _T:
    try:
        return await work
    except FsError as exc:
        raise RouteError(exc.status, exc.code, exc.message) from None


def _content(body: Mapping[str, object]) -> bytes:
    content = body.get("content", "")
    if not isinstance(content, str):
        raise _bad_input("content must be a string")
    encoding = body.get("encoding", "utf-8")
    if encoding == "utf-8":
        return content.encode("utf-8", "surrogatepass")
    if encoding == "base64":
        try:
            return base64.b64decode(content, validate=True)
        except (binascii.Error, ValueError):
            raise _bad_input("content is not valid base64") from None
    raise _bad_input("encoding must be utf-8 or base64")


def _only(method: str, allowed: str) -> None:
    if method != allowed:
        raise _not_allowed(method)


def _not_allowed(method: str) -> RouteError:
    return RouteError(405, "method_not_allowed", f"{method} is not allowed on this route")
