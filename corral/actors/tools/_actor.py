"""The tools actor: runs runner-local tools (T-01..T-27).

What it handles and answers is the table in :mod:`corral.actors.tools.messages`.

Resource routes (every error ``{"error": {"code", "message"}}``, PROTOCOL_0_19.md §H.2):

======================================  =======================================================
``GET .../resources``                   list page: the ``default`` environment, then terminals
``GET .../resources/terminals``         list page of the session's terminals
``GET .../resources/terminals/{id}``    one terminal; 404 ``not_found``
``DELETE .../resources/terminals/{id}`` closes it → ``session.resource.deleted`` (and
                                        publishes that event)
``GET .../resources/{id}``              one of those resources; 404 ``not_found``
``DELETE .../resources``                closes the session's terminals → ``cleaned``
``* .../resources/environments[/...]``  :class:`~corral.tools.environment.Environments`
                                        (files, search, shell); a successful write, edit,
                                        delete or shell publishes
                                        ``session.changed_files.invalidated``
======================================  =======================================================

Requests are answered in tasks of their own (a shell command or a search must not hold up
tool calls), at most :data:`MAX_HTTP_JOBS` at a time.

Only the policy actor sends :class:`ToolExec`: every call has passed its gate. The table of
tools is :func:`corral.tools.registry.tool_table` for the session's spec (terminal tools only
when the spec declares ``terminals:``).

Crash safety. Each call is written to the call log (:mod:`corral.tools.calls`) before it runs
and with its result after; the result is answered only once it is written. A redelivered call
is answered from the log, and one that a crash cut off mid-run ends with an error result
instead of running twice. A copy that comes while the call still runs (its caller restarted
and asked again) joins the run and is answered with its result, as the first. Inbox items
(async results) are durable in :class:`~corral.tools.inbox.Inbox`; background calls a crash
cut off are reported to the inbox as failed when the next incarnation starts.

Session events a tool causes (terminal resources, ``session.changed_files.invalidated``) go to
dispatch as durable :class:`~corral.actors.dispatch.messages.PublishEvents`, before the
call's result.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

import msgspec
import trio

from ..._exceptions import BusError
from ..._jsonlines import JsonObject
from ...bus import Incoming
from ...config import RunnerSettings
from ...routes import HttpChunk, HttpRequest, HttpResponse, error_response, json_response
from ...tools import registry
from ...tools._api import ToolContext, ToolError, ToolStatus
from ...tools._replies import Resource
from ...tools.async_calls import AsyncCalls
from ...tools.calls import CallLog
from ...tools.changed_files import ChangedFilesSignal, changed_files_event
from ...tools.environment import (
    Download,
    Environments,
    RouteError,
    SessionSpecs,
    environment_resource,
    page,
    page_params,
    query_params,
)
from ...tools.inbox import Inbox
from ...tools.os_env import default_os_env_root, workspace_from_env
from ...tools.servers import Servers
from ...tools.terminals import Terminals, deleted_event
from ...tools.threads import in_thread
from .._actor import Actor, ActorContext, handles
from .._deferred import Deferred
from .._process import sweep, write_pidfile
from ..dispatch.messages import (
    PublishEvents,
    SubagentCancel,
    SubagentDispatched,
    SubagentDrained,
)
from .messages import InboxPush, InboxPushed, ToolCancel, ToolExec, ToolExecResult

log = logging.getLogger("corral.actors.tools")

#: What the model sees when a tool fails in a way it cannot act on (P-28).
TOOL_BROKE = "The tool failed on the runner; see runner logs for details."
CUT_OFF = "The tools actor restarted while this call ran; it may have partly run."
TIMED_OUT = "The tool call did not finish within {s:g} s and was stopped."
CANCELLED = "The tool call was cancelled."
#: What a client sees when a resource route fails in a way it cannot act on.
ROUTE_BROKE = "The request failed on the runner; see runner logs for details."
#: Resource requests answered at once; more wait their turn.
MAX_HTTP_JOBS = 16
#: Bytes of a download per HttpChunk message.
DOWNLOAD_CHUNK = 256 * 1024
#: How long ``sys_session_send`` waits for dispatch to record a child's work.
REGISTER_WAIT_S = 30.0
#: The exit code of a crash the ``crash_at`` option asked for (as ``kill -9`` leaves it).
CRASH_EXIT = 137

_R = TypeVar("_R", bound=Resource)


class ToolsOptions(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """``[actors.tools.options]``."""

    #: The runner workspace (``corral up --workspace``; else ``CORRAL_WORKSPACE`` /
    #: ``OMNIGENT_RUNNER_WORKSPACE``).
    workspace: str | None = None
    #: Root of per-conversation fallback directories (else the data dir's ``os-envs``).
    os_env_root: str | None = None
    #: Deadline of one tool call (``sys_os_shell`` default), in seconds.
    timeout_s: float = 120.0
    #: Largest tool output returned to the model, in characters.
    max_output_chars: int = 100_000
    dispatch: str = "dispatch"
    #: A server for sessions of any runner (tests; hosts pass ``runners`` instead): the
    #: session tools ask it for their caller (T-26).
    server_url: str | None = None
    token: str | None = None
    runners: list[RunnerSettings] = []
    #: Crash tests only: exit at once after a sub-agent result is in the inbox and before
    #: dispatch is answered (``inbox_pushed``). Empty: never.
    crash_at: Literal["", "inbox_pushed"] = ""


class ToolsActor(Actor):
    """Runs the runner-local tools of every session on this host."""

    def __init__(self, ctx: ActorContext, peer: Any) -> None:
        super().__init__(ctx, peer)
        self.options = msgspec.convert(ctx.options, ToolsOptions)
        workspace = Path(self.options.workspace) if self.options.workspace else None
        workspace = workspace or workspace_from_env()
        self.workspace = workspace.absolute() if workspace else None
        self.os_env_root = (
            Path(self.options.os_env_root)
            if self.options.os_env_root
            else default_os_env_root(ctx.data_dir)
        )
        self.calls = CallLog(ctx.data_dir / "calls.log")
        self.inbox = Inbox(ctx.data_dir / "inbox")
        self.terminals = Terminals(ctx.data_dir / "terminals", publish=self._publish)
        self.async_calls = AsyncCalls(ctx.data_dir / "async", self.inbox)
        self.changed = ChangedFilesSignal()
        self.groups = ProcessGroups(ctx.data_dir / "groups")
        self.environments = Environments(
            workspace=self.workspace,
            os_env_root=self.os_env_root,
            specs=SessionSpecs(ctx.data_dir / "os-env-specs"),
            timeout_s=self.options.timeout_s,
            max_output_chars=self.options.max_output_chars,
            processes=self.groups,
        )
        self.servers = Servers(
            self.options.runners, server_url=self.options.server_url, token=self.options.token
        )
        self.http_jobs = trio.CapacityLimiter(MAX_HTTP_JOBS)
        self.scopes: dict[str, trio.CancelScope] = {}
        #: Further copies of a running call, answered when it ends (see :meth:`execute`).
        self.joined: dict[str, list[Deferred]] = {}
        self.stats = {
            "calls": 0,
            "failed": 0,
            "timed_out": 0,
            "cut_off": 0,
            "replayed": 0,
            "joined": 0,
        }

    async def setup(self) -> None:
        assert self.nursery is not None
        killed = sweep(self.groups.dir)
        if killed:
            log.warning(
                "killed %d process groups a crashed incarnation left: %s", len(killed), killed
            )
        await self.calls.load()
        await self.nursery.start(self.async_calls.run)  # reports calls a crash cut off
        await self.nursery.start(self.terminals.run)  # kills a crashed incarnation's tmux

    async def terminate(self) -> None:
        await self.terminals.aclose()
        await self.servers.aclose()

    def snapshot(self) -> dict[str, Any]:
        return {**super().snapshot(), **self.stats, "running": sorted(self.scopes)}

    # --- tool calls --------------------------------------------------------------------------

    @handles(ToolExec)
    async def execute(self, msg: ToolExec, incoming: Incoming) -> ToolExecResult | None:
        record = self.calls.get(msg.call_id)
        if record is not None and record.state == "done":
            self.stats["replayed"] += 1
            return ToolExecResult(
                call_id=msg.call_id, output=record.output or "", status=_status(record.status)
            )
        if msg.call_id in self.scopes:
            # Asked again while it runs: its caller restarted (the policy actor re-acts on
            # an approval it held) and waits on this copy, not the first. Every copy is
            # answered with the one run's result.
            self.stats["joined"] += 1
            self.joined.setdefault(msg.call_id, []).append(self.defer(incoming))
            return None
        if record is not None:
            self.stats["cut_off"] += 1
            output = _error(CUT_OFF)
            await self.calls.done(msg.call_id, output, "failed")
            return ToolExecResult(call_id=msg.call_id, output=output, status="failed")
        deferred = self.defer(incoming)
        # Registered here, not in the task: a copy handled next must find it running.
        scope = self.scopes[msg.call_id] = trio.CancelScope()
        assert self.nursery is not None
        self.nursery.start_soon(self._execute, msg, deferred, scope)
        return None

    async def _execute(self, msg: ToolExec, deferred: Deferred, scope: trio.CancelScope) -> None:
        self.stats["calls"] += 1
        if msg.spec:
            # The file routes resolve the session's root from it (a request carries no spec).
            try:
                await self.environments.specs.learn(msg.session_id, msg.spec)
            except OSError as exc:
                log.warning("os_env of session %s not kept: %s", msg.session_id, exc)
        await self.calls.started(msg.call_id)
        ctx = self._context(msg)
        timeout = msg.timeout_s or self.options.timeout_s
        status: ToolStatus = "completed"
        output: str | None = None
        with scope:
            # The shell tool has its own deadline (and reports ``timed_out``); this one is
            # the backstop for every tool, a little later.
            with trio.move_on_after(timeout + 5) as deadline:
                output, status = await self._run(ctx, msg.name, msg.arguments)
        if output is None:
            if deadline.cancelled_caught:
                self.stats["timed_out"] += 1
                output = _error(TIMED_OUT.format(s=timeout))
            else:
                output = _error(CANCELLED)
            status = "cancelled" if scope.cancelled_caught else "failed"
        if status != "completed":
            self.stats["failed"] += 1
        await self.calls.done(msg.call_id, output, status)
        # Running until its result is on record: a copy that came meanwhile joins this run
        # rather than finding it started and not running (cut off).
        self.scopes.pop(msg.call_id, None)
        result = ToolExecResult(call_id=msg.call_id, output=output, status=status)
        for waiting in (deferred, *self.joined.pop(msg.call_id, ())):
            await self.peer.reply(waiting.incoming, result)
            waiting.ack()

    async def _run(self, ctx: ToolContext, name: str, arguments: str) -> tuple[str, ToolStatus]:
        try:
            args = json.loads(arguments or "{}")
        except ValueError:
            args = None
        if not isinstance(args, dict):
            return _error(f"The arguments of {name} are not a JSON object."), "failed"
        table = registry.tool_table(ctx.spec)
        tool = table.get(name)
        if tool is None:
            known = registry.is_runner_local(name)
            return _error(
                registry.not_enabled_error(name) if known else registry.not_in_table_error(name)
            ), "failed"
        try:
            output = await tool.run(ctx, args)
        except ToolError as exc:
            return _error(str(exc)), "failed"
        except Exception:
            log.exception("tool %s failed in session %s", name, ctx.session_id)
            return _error(TOOL_BROKE), "failed"
        if tool.mutates_files:
            await self.changed.maybe_signal(ctx.session_id, ctx.publish)
        return output, "completed"

    async def _publish(self, session_id: str, event: Mapping[str, object]) -> None:
        await self.peer.cast(
            self.options.dispatch,
            PublishEvents(session_id=session_id, events=[dict(event)]),
            durable=True,
            session_id=session_id,
        )

    def _context(self, msg: ToolExec) -> ToolContext:
        async def publish(event: Mapping[str, object]) -> None:
            await self._publish(msg.session_id, event)

        ctx = ToolContext(
            session_id=msg.session_id,
            call_id=msg.call_id,
            spec=msg.spec,
            workspace=self.workspace,
            os_env_root=self.os_env_root,
            timeout_s=msg.timeout_s or self.options.timeout_s,
            publish=publish,
            data_dir=self.ctx.data_dir,
            inbox=self.inbox,
            async_calls=self.async_calls,
            terminals=self.terminals,
            processes=self.groups,
            server=self.servers.for_runner(msg.runner_id),
            max_output_chars=self.options.max_output_chars,
        )

        async def run_tool(name: str, args: JsonObject) -> str:
            output, _status = await self._run(ctx, name, json.dumps(args))
            return output

        async def register_work(
            work: str, child: str, agent: str, title: str, abandoned: bool
        ) -> None:
            dispatched = SubagentDispatched(
                dispatch_id=work,
                parent_session_id=msg.session_id,
                child_session_id=child,
                agent=agent,
                title=title,
                runner_id=msg.runner_id,
                abandoned=abandoned,
            )
            await self._register_work(dispatched)

        async def cancel_work(child: str, confirm: bool) -> tuple[bool, str | None]:
            ask = SubagentCancel(
                parent_session_id=msg.session_id, child_session_id=child, confirm=confirm
            )
            try:
                task = await self.peer.call(self.options.dispatch, ask, timeout=15)
            except BusError as exc:
                log.warning("sys_cancel_task could not ask dispatch about %s: %s", child, exc)
                raise ToolError("sys_cancel_task: the runner's dispatch did not answer") from None
            return task.found, task.status

        async def work_drained(work_ids: list[str]) -> None:
            drained = SubagentDrained(parent_session_id=msg.session_id, work_ids=work_ids)
            await self.peer.cast(
                self.options.dispatch, drained, durable=True, session_id=msg.session_id
            )

        ctx.run_tool = run_tool
        ctx.register_work = register_work
        ctx.cancel_work = cancel_work
        ctx.work_drained = work_drained
        return ctx

    async def _register_work(self, msg: SubagentDispatched) -> None:
        """Record a dispatched child's work with dispatch, asked again (the same dispatch id,
        a no-op there) while dispatch is away — it is back within seconds of a crash.

        Raises:
            ToolError: dispatch did not answer in :data:`REGISTER_WAIT_S`.
        """
        delay = 0.2
        with trio.move_on_after(REGISTER_WAIT_S):
            while True:
                try:
                    await self.peer.call(
                        self.options.dispatch,
                        msg,
                        durable=True,
                        timeout=5,
                        session_id=msg.parent_session_id,
                    )
                    return
                except Exception as exc:
                    log.warning("registering sub-agent work %s: %s", msg.dispatch_id, exc)
                await trio.sleep(delay)
                delay = min(delay * 2, 2.0)
        raise ToolError("sys_session_send: the runner could not record the sub-agent's work")

    @handles(ToolCancel)
    async def cancel(self, msg: ToolCancel, incoming: Incoming) -> None:
        scope = self.scopes.get(msg.call_id)
        if scope is not None:
            scope.cancel()

    @handles(InboxPush)
    async def inbox_push(self, msg: InboxPush, incoming: Incoming) -> InboxPushed:
        """A sub-agent's result into its parent's inbox (S-14): answered once it is on disk,
        so the durable request is acked only then; the key makes a push sent again after a
        crash (of either side) a no-op."""
        queued = await self.inbox.push(msg.session_id, msg.item, key=msg.key)
        self._crash_point("inbox_pushed")
        return InboxPushed(key=msg.key, queued=queued)

    def _crash_point(self, step: str) -> None:
        """The fault hook of crash tests: with the option ``crash_at = step``, the actor exits
        at once here (as ``kill -9`` would stop it), once per data directory."""
        if step != self.options.crash_at:
            return
        marker = self.ctx.data_dir / f"crashed-at-{step}"
        if marker.exists():
            return
        marker.touch()
        log.warning("crash_at %s: exiting now", step)
        os._exit(CRASH_EXIT)

    # --- resources ---------------------------------------------------------------------------

    @handles(HttpRequest)
    async def http(self, msg: HttpRequest, incoming: Incoming) -> None:
        deferred = self.defer(incoming)
        assert self.nursery is not None
        self.nursery.start_soon(self._http, msg, deferred)

    async def _http(self, msg: HttpRequest, deferred: Deferred) -> None:
        async with self.http_jobs:
            download: Download | None = None
            try:
                answer = await self._route(msg)
            except RouteError as exc:
                answer = error_response(exc.status, exc.code, exc.message)
            except ToolError as exc:  # tmux, listing a session's terminals
                answer = error_response(500, "terminal_error", str(exc))
            except Exception:
                log.exception("%s %s failed", msg.method, msg.path)
                answer = error_response(500, "internal_error", ROUTE_BROKE)
            if isinstance(answer, Download):
                download = answer
                answer = HttpResponse(status=200, headers=download.headers(), streaming=True)
            try:
                await self.peer.reply(deferred.incoming, answer)
                deferred.ack()
                if download is not None:
                    await self._stream(msg, download)
            finally:
                if download is not None:
                    with trio.CancelScope(shield=True):
                        await trio.to_thread.run_sync(download.file.close)

    async def _stream(self, msg: HttpRequest, download: Download) -> None:
        """A download's bytes as HttpChunk messages to the request's ``reply_to``; the last
        one ends the answer, also when the file could not be read to its announced size (the
        client then sees a short body, never a wrong one)."""
        left = download.size
        try:
            while left > 0:
                data = await in_thread(download.file.read, min(DOWNLOAD_CHUNK, left))
                if not data:
                    log.warning("%s shrank during its download", download.name)
                    break
                left -= len(data)
                await self.peer.cast(msg.reply_to, HttpChunk(request_id=msg.request_id, data=data))
        except Exception:
            # A read error, or the bus refusing a chunk: the answer ends short.
            log.exception("download of %s failed", download.name)
        with trio.CancelScope(shield=True):
            try:
                await self.peer.cast(msg.reply_to, HttpChunk(request_id=msg.request_id, end=True))
            except Exception:
                log.exception("the end of the download of %s was not sent", download.name)

    async def _route(self, msg: HttpRequest) -> HttpResponse | Download:
        parts = msg.path.strip("/").split("/")
        if parts[:2] != ["v1", "sessions"] or len(parts) < 4 or parts[3] != "resources":
            raise RouteError(404, "not_found", f"No route {msg.method} {msg.path} on this runner.")
        session_id = urllib.parse.unquote(parts[2])
        method = msg.method.upper()
        rest = parts[4:]
        if rest[:1] == ["environments"]:
            status, body, mutated = await self.environments.answer(msg, session_id, rest[1:])
            if mutated:
                await self._publish(session_id, changed_files_event(session_id))
            return body if isinstance(body, Download) else json_response(status, body)
        if method == "DELETE" and not rest:
            for event in await self.terminals.close_all(session_id):
                await self._publish(session_id, event)
            return json_response(
                200,
                {"session_id": session_id, "object": "session.resources.cleaned", "cleaned": True},
            )
        if rest[:1] == ["terminals"] and len(rest) <= 2:
            return await self._terminal_route(msg, method, session_id, rest[1:])
        if method != "GET" or len(rest) > 1:
            raise RouteError(404, "not_found", f"No route {msg.method} {msg.path} on this runner.")
        terminals = await self.terminals.list_resources(session_id)
        resources: list[Resource] = [environment_resource(session_id), *terminals]
        if not rest:
            return json_response(200, page(resources, **page_params(query_params(msg.query))))
        return json_response(200, _find(resources, urllib.parse.unquote(rest[0]), "Resource"))

    async def _terminal_route(
        self, msg: HttpRequest, method: str, session_id: str, rest: list[str]
    ) -> HttpResponse:
        """``GET .../terminals``, ``GET`` and ``DELETE .../terminals/{id}``."""
        terminals = await self.terminals.list_resources(session_id)
        if not rest:
            if method != "GET":
                raise RouteError(405, "method_not_allowed", f"{method} is not allowed here")
            return json_response(200, page(terminals, **page_params(query_params(msg.query))))
        terminal_id = urllib.parse.unquote(rest[0])
        view = _find(terminals, terminal_id, "Terminal")
        if method == "GET":
            return json_response(200, view)
        if method != "DELETE":
            raise RouteError(405, "method_not_allowed", f"{method} is not allowed here")
        meta = view["metadata"]
        terminal, key = meta["terminal_name"], meta["session_key"]
        if not await self.terminals.close(session_id, terminal, key):
            raise RouteError(404, "not_found", f"Terminal {terminal_id!r} not found")
        await self._publish(session_id, deleted_event(session_id, terminal, key))
        body = {"id": terminal_id, "object": "session.resource.deleted", "deleted": True}
        return json_response(200, body)


class ProcessGroups:
    """Pidfiles of the process groups tools run (shell commands), swept at start: a
    ``kill -9`` of this actor must not leave a model's command running unowned."""

    def __init__(self, dir: Path) -> None:
        self.dir = dir

    def started(self, pid: int) -> None:
        write_pidfile(self.dir / f"{pid}.pid", pid)

    def ended(self, pid: int) -> None:
        (self.dir / f"{pid}.pid").unlink(missing_ok=True)


def _find(resources: Sequence[_R], resource_id: str, what: str) -> _R:
    for resource in resources:
        if resource["id"] == resource_id:
            return resource
    raise RouteError(404, "not_found", f"{what} {resource_id!r} not found")


def _error(message: str) -> str:
    return json.dumps({"error": message})


def _status(recorded: str | None) -> ToolStatus:
    """A status read back from the call log; one this version does not know is ``failed``."""
    match recorded:
        case "completed" | "failed" | "denied" | "cancelled":
            return recorded
    return "failed"
