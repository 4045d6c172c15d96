"""pi's RPC mode as types, and its client.

``pi --mode rpc`` reads one command per line on stdin (``{id, type, …}``) and answers each
with one ``response`` (``{id, type: "response", command, success, data | error}``); every
other line it writes is an event of its session (``message_update``,
``tool_execution_*``, ``agent_settled``, …) or a request of an extension's UI
(``extension_ui_request``), which the client answers with an ``extension_ui_response``
that gets no response (docs/rpc.md of the pi package; HARNESS_CLIS.md).

:class:`PiRpc` sends commands and waits for their responses; :meth:`PiRpc.read` (a task of
whoever holds the CLI) reads everything and hands each event to the listener of the moment
(:meth:`PiRpc.listen`, the running turn). Only the fields corral reads are declared.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, TypeVar

import msgspec
import trio

from .._cli_process import CliError, CliProcess
from .._rpc_reader import RpcReader

log = logging.getLogger("corral.harnesses.pi")

#: How long a command may go unanswered (pi answers ``prompt`` once it has taken it, and
#: ``abort`` once its run has stopped).
COMMAND_TIMEOUT_S = 60.0
#: The extension UI requests that wait for an answer (the others are notices).
DIALOGS = ("confirm", "select", "input", "editor")


class CommandFailed(Exception):
    """pi answered a command with ``success: false``."""

    def __init__(self, command: str, error: str) -> None:
        super().__init__(f"pi refused {command}: {error}")
        self.command = command
        self.error = error


class ProtocolError(Exception):
    """An event's fields do not fit what corral reads (msgspec's ``$.path`` text kept)."""


class _Read(msgspec.Struct, rename="camel"):
    """What corral reads of pi's records."""


class Response(_Read):
    command: str = ""
    success: bool = False
    id: str | None = None
    data: Any = None
    error: str | None = None


class Usage(_Read):
    input: int = 0
    output: int = 0
    total_tokens: int = 0


class Message(_Read):
    """An ``AgentMessage``; only an assistant's fields are declared."""

    role: str
    content: Any = None
    model: str | None = None
    response_model: str | None = None
    usage: Usage | None = None
    stop_reason: str | None = None
    error_message: str | None = None


class MessageEvent(_Read):
    """``message_end`` (and ``message_start``)."""

    message: Message


class AssistantEvent(_Read):
    """The ``assistantMessageEvent`` of ``message_update``."""

    type: str
    delta: str = ""


class MessageUpdate(_Read):
    assistant_message_event: AssistantEvent


class ToolExecution(_Read):
    """``tool_execution_start`` and ``tool_execution_end``."""

    tool_call_id: str
    tool_name: str
    args: Any = None
    result: Any = None
    is_error: bool = False


class UiRequest(_Read):
    """``extension_ui_request``."""

    id: str
    method: str
    title: str = ""
    #: ``confirm``'s text.
    message: str = ""
    #: ``input``'s hint.
    placeholder: str = ""


class Settled(_Read):
    """``agent_settled``: pi will not go on by itself."""

    aborted: bool = False


class RetryStart(_Read):
    """``auto_retry_start``."""

    attempt: int = 1
    max_attempts: int = 1
    delay_ms: float = 0.0
    error_message: str = ""


T = TypeVar("T")
#: What was logged already: each kind of bad input once per worker, not once per event.
_logged: set[str] = set()


def event_as(event: dict[str, Any], kind: type[T]) -> T:
    """``event`` as ``kind``.

    Raises:
        ProtocolError: it does not fit; logged once per event type.
    """
    try:
        return msgspec.convert(event, kind)
    except msgspec.ValidationError as exc:
        what = str(event.get("type"))
        if what not in _logged:
            _logged.add(what)
            log.warning("pi sent a malformed %s: %s", what, exc)
        raise ProtocolError(f"{what}: {exc}") from exc


class PiRpc(RpcReader[str, Response, dict[str, Any]]):
    """A running ``pi --mode rpc``."""

    def __init__(self, cli: CliProcess) -> None:
        super().__init__(cli)
        self._next_id = 0
        #: Whether pi has answered anything yet (it started).
        self.answered = False

    async def command(
        self,
        kind: str,
        *,
        timeout: float = COMMAND_TIMEOUT_S,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
        **fields: Any,
    ) -> Any:
        """Send command ``kind`` and wait for its response; its ``data``. Started with
        ``nursery.start``, it counts as started once the command is written.

        Raises:
            CommandFailed: pi refused it.
            CliError: the CLI ended, or did not answer within ``timeout``.
        """
        if self.ended is not None:
            raise self.ended
        self._next_id += 1
        ident = f"corral-{self._next_id}"
        done = trio.Event()
        box: list[Response] = []
        self._waiting[ident] = (done, box)
        try:
            await self.cli.send({"id": ident, "type": kind, **fields})
            task_status.started()
            with trio.move_on_after(timeout):
                await done.wait()
        finally:
            self._waiting.pop(ident, None)
        if not box:
            raise self.ended or CliError(f"pi did not answer {kind} in {timeout:g}s")
        if not box[0].success:
            raise CommandFailed(kind, box[0].error or "no reason given")
        return box[0].data

    async def answer(self, request: UiRequest, **fields: Any) -> None:
        """Answer an extension's UI request (``confirmed``, ``value`` or ``cancelled``)."""
        await self.cli.send({"type": "extension_ui_response", "id": request.id, **fields})

    async def _dispatch(self, record: dict[str, Any]) -> None:
        if record.get("type") == "response":
            self.answered = True
            try:
                response = msgspec.convert(record, Response)
            except msgspec.ValidationError as exc:
                log.warning("pi sent a malformed response: %s", exc)
                return
            waiting = self._waiting.get(response.id or "")
            if waiting is None:
                log.warning("pi answered %r, which nobody waits for: %.300r", response.id, record)
                return
            waiting[1].append(response)
            waiting[0].set()
            return
        listener = self._listener
        if listener is not None:
            with contextlib.suppress(trio.ClosedResourceError, trio.BrokenResourceError):
                await listener.send(record)
                return
        if record.get("type") == "extension_ui_request" and record.get("method") in DIALOGS:
            # Asked between turns (nothing should be): refused, so pi does not wait.
            await self.cli.send(
                {"type": "extension_ui_response", "id": record["id"], "cancelled": True}
            )
