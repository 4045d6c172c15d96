"""The Codex app-server's JSON-RPC, as types, and a client for one running app-server.

``codex app-server`` speaks JSON-RPC 2.0 without the ``"jsonrpc"`` member, one object per
line on stdio (the CLI's own schema: ``codex app-server generate-json-schema``). Three
kinds of message arrive:

* a **response** ``{id, result}`` or ``{id, error}`` to a request corral sent;
* a **notification** ``{method, params}``: the turn's progress (``item/agentMessage/delta``,
  ``item/started``, ``turn/completed``, …);
* a **server request** ``{id, method, params}``: Codex asks something and waits for the
  answer — a command or file change to approve. One corral does not know is answered with a
  JSON-RPC error at once, so Codex never waits on it.

What corral sends and the parameters it reads are msgspec Structs (snake_case here, the
protocol's camelCase on the wire); only the fields corral uses are declared, so the CLI may
add fields freely. A message whose shape is wrong is a
:class:`ProtocolError`, logged once per method and skipped (a notification) or answered with
an error (a server request); it never ends the turn by itself.

:class:`AppServer` owns the read side: it hands each response to the request that waits
for it, and notifications and server requests to the one listener (the running turn,
:meth:`AppServer.listen`); with nobody listening, notifications are dropped and server
requests refused.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, TypeVar

import msgspec
import trio

from .._cli_process import CliError, CliProcess
from .._rpc_reader import RpcReader

log = logging.getLogger("corral.harnesses.codex")

#: How long a request may wait for its response: the app-server answers its requests
#: at once (a turn's work is reported in notifications), so a silent one is stuck.
REQUEST_TIMEOUT_S = 30.0

METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602


class ProtocolError(Exception):
    """A message from the app-server that is not what its protocol says."""


class RpcFailed(Exception):
    """The app-server answered a request with an error."""

    def __init__(self, method: str, code: int, message: str) -> None:
        super().__init__(f"codex app-server refused {method}: {message} ({code})")
        self.method = method
        self.code = code


# --- what corral sends ----------------------------------------------------------------------


class _Params(msgspec.Struct, omit_defaults=True, rename="camel", kw_only=True):
    """Request parameters: a field left at its default is not sent."""


class ClientInfo(_Params):
    name: str
    version: str


class Capabilities(_Params):
    #: Needed for ``dynamicTools`` (corral's runner tools) on ``thread/start``.
    experimental_api: bool


class InitializeParams(_Params):
    client_info: ClientInfo
    capabilities: Capabilities


class ThreadStartParams(_Params):
    model: str
    cwd: str
    approval_policy: str
    sandbox: str
    developer_instructions: str | None = None
    #: Tools Codex offers the model and asks the client to run (``item/tool/call``), as
    #: ``{type: "function", name, description, inputSchema}``; kept with the thread.
    dynamic_tools: list[dict[str, Any]] | None = None


class ThreadResumeParams(_Params):
    """A thread's settings again (Codex takes them as they are now), and its id."""

    thread_id: str
    model: str
    cwd: str
    approval_policy: str
    sandbox: str
    developer_instructions: str | None = None
    #: The turns are in the thread already; corral needs none of them back.
    exclude_turns: bool = True


class ThreadInjectItemsParams(_Params):
    thread_id: str
    #: Responses API items, appended to what the model sees of the thread.
    items: list[dict[str, Any]]


class TurnStartParams(_Params):
    thread_id: str
    input: list[dict[str, Any]]
    model: str | None = None


class TurnInterruptParams(_Params):
    thread_id: str
    turn_id: str


class ApprovalAnswer(_Params):
    #: ``accept`` or ``decline`` (Codex tells the model a declined call was rejected).
    decision: str


class ToolAnswer(_Params):
    """The answer to ``item/tool/call``: the tool's output as text."""

    content_items: list[dict[str, str]]
    success: bool


class _Request(msgspec.Struct):
    id: int
    method: str
    params: Any


class _Notification(msgspec.Struct):
    method: str
    params: Any = None


class _Result(msgspec.Struct):
    id: int | str
    result: Any


class _ErrorBody(msgspec.Struct):
    code: int
    message: str


class _ErrorAnswer(msgspec.Struct):
    id: int | str
    error: _ErrorBody


# --- what corral reads ----------------------------------------------------------------------


class _Read(msgspec.Struct, rename="camel"):
    """Parameters and results corral reads."""


class _Message(msgspec.Struct):
    """Any JSON-RPC message: which of the three it is follows from the fields present."""

    id: int | str | None = None
    method: str | None = None
    params: dict[str, Any] = msgspec.field(default_factory=dict)
    result: Any = None
    error: _ErrorBody | None = None


class Notification(msgspec.Struct, frozen=True):
    method: str
    params: dict[str, Any]


class ServerRequest(msgspec.Struct, frozen=True):
    id: int | str
    method: str
    params: dict[str, Any]


class ThreadInfo(_Read):
    id: str


class ThreadOpened(_Read):
    """The result of ``thread/start`` and ``thread/resume``."""

    thread: ThreadInfo
    model: str


class TurnInfo(_Read):
    id: str
    status: str = "inProgress"
    error: TurnError | None = None


class TurnError(_Read):
    message: str = ""
    codex_error_info: Any = None


class TurnStarted(_Read):
    """The result of ``turn/start``; also ``turn/started`` and ``turn/completed``."""

    turn: TurnInfo


class Delta(_Read):
    """``item/agentMessage/delta``, ``item/reasoning/textDelta`` and ``…/summaryTextDelta``."""

    item_id: str
    delta: str
    turn_id: str = ""


class FileChange(_Read):
    path: str
    diff: str = ""
    kind: dict[str, Any] = msgspec.field(default_factory=dict)


class ThreadItem(_Read):
    """One item of a turn; only the fields of the types corral relays are declared."""

    type: str
    id: str
    text: str | None = None
    command: str | None = None
    cwd: str | None = None
    status: str | None = None
    aggregated_output: str | None = None
    exit_code: int | None = None
    changes: list[FileChange] = msgspec.field(default_factory=list)


class ItemEvent(_Read):
    """``item/started`` and ``item/completed``."""

    item: ThreadItem
    turn_id: str = ""


class Tokens(_Read):
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0


class TokenUsage(_Read):
    total: Tokens
    last: Tokens


class TokenUsageUpdated(_Read):
    """``thread/tokenUsage/updated``: the thread's totals after each model call."""

    token_usage: TokenUsage
    turn_id: str = ""


class ModelRerouted(_Read):
    to_model: str


class ErrorNotice(_Read):
    """The ``error`` notification: a failed model call, retried or not."""

    error: TurnError
    will_retry: bool = False


class CommandApproval(_Read):
    """``item/commandExecution/requestApproval``."""

    item_id: str
    command: str | None = None
    cwd: str | None = None
    reason: str | None = None


class FileChangeApproval(_Read):
    """``item/fileChange/requestApproval`` (the changes were in the item's ``item/started``)."""

    item_id: str
    reason: str | None = None
    grant_root: str | None = None


class ToolCall(_Read):
    """``item/tool/call``: the model called one of the thread's dynamic tools."""

    call_id: str
    tool: str
    arguments: Any = None


T = TypeVar("T")
#: What was logged already: each kind of bad input once per worker, not once per message.
_logged: set[str] = set()


def _warn_once(key: str, message: str, *args: object) -> None:
    if key not in _logged:
        _logged.add(key)
        log.warning(message, *args)


def params_as(message: Notification | ServerRequest, kind: type[T]) -> T:
    """The parameters of ``message`` as ``kind``.

    Raises:
        ProtocolError: they do not fit (msgspec's ``$.path`` text kept); logged once per
            method.
    """
    try:
        return msgspec.convert(message.params, kind)
    except msgspec.ValidationError as exc:
        _warn_once(message.method, "codex app-server sent a malformed %s: %s", message.method, exc)
        raise ProtocolError(f"{message.method}: {exc}") from exc


def result_as(result: Any, kind: type[T], method: str) -> T:
    """A request's result as ``kind``.

    Raises:
        ProtocolError: it does not fit.
    """
    try:
        return msgspec.convert(result, kind)
    except msgspec.ValidationError as exc:
        raise ProtocolError(f"the result of {method}: {exc}") from exc


# --- the client -----------------------------------------------------------------------------


class AppServer(RpcReader[int, _Message, Notification | ServerRequest]):
    """A running ``codex app-server``: requests out, and everything it says read by
    :meth:`read` (the task that owns the CLI runs it until the CLI ends)."""

    def __init__(self, cli: CliProcess) -> None:
        super().__init__(cli)
        self._next_id = 0

    async def request(
        self, method: str, params: msgspec.Struct, *, timeout: float = REQUEST_TIMEOUT_S
    ) -> Any:
        """Send a request and wait for its result.

        Raises:
            RpcFailed: the app-server answered with an error.
            CliError: the CLI ended, or did not answer within ``timeout``.
        """
        if self.ended is not None:
            raise self.ended
        self._next_id += 1
        ident = self._next_id
        done = trio.Event()
        box: list[_Message] = []
        self._waiting[ident] = (done, box)
        try:
            await self.cli.send(msgspec.to_builtins(_Request(ident, method, params)))
            with trio.move_on_after(timeout):
                await done.wait()
        finally:
            self._waiting.pop(ident, None)
        if not box:
            silent = f"codex app-server did not answer {method} in {timeout:g}s"
            raise self.ended or CliError(silent)
        answer = box[0]
        if answer.error is not None:
            raise RpcFailed(method, answer.error.code, answer.error.message)
        return answer.result

    async def notify(self, method: str) -> None:
        """Send a notification (no answer comes)."""
        await self.cli.send(msgspec.to_builtins(_Notification(method)))

    async def answer(self, request: ServerRequest, result: msgspec.Struct) -> None:
        """Answer a server request."""
        await self.cli.send(msgspec.to_builtins(_Result(request.id, result)))

    async def refuse(self, request: ServerRequest, code: int, message: str) -> None:
        """Answer a server request with a JSON-RPC error."""
        body = _ErrorBody(code, message)
        await self.cli.send(msgspec.to_builtins(_ErrorAnswer(request.id, body)))

    async def _dispatch(self, raw: dict[str, Any]) -> None:
        try:
            message = msgspec.convert(raw, _Message)
        except msgspec.ValidationError as exc:
            _warn_once(
                "not JSON-RPC", "codex app-server sent a message that is not JSON-RPC: %s", exc
            )
            return
        if message.method is None:
            waiting = self._waiting.get(message.id) if isinstance(message.id, int) else None
            if waiting is None:
                log.warning("codex app-server answered %r, which nobody waits for", message.id)
                return
            waiting[1].append(message)
            waiting[0].set()
            return
        incoming: Notification | ServerRequest = (
            Notification(message.method, message.params)
            if message.id is None
            else ServerRequest(message.id, message.method, message.params)
        )
        listener = self._listener
        if listener is not None:
            with contextlib.suppress(trio.ClosedResourceError, trio.BrokenResourceError):
                await listener.send(incoming)
                return
        if isinstance(incoming, ServerRequest):
            await self.refuse(incoming, METHOD_NOT_FOUND, "no turn is running")
