"""What a worker kind sees of its turn: :class:`TurnContext`, and how it ends one.

A worker kind (``corral.harnesses.<kind>``) is handed a :class:`TurnContext` per turn by the
worker process (:mod:`._worker`, which serves the bus). Through it the kind emits the turn's
events, asks for tools, elicitations and policy verdicts, and waits for their answers; it
raises :class:`TurnFailed` to end the turn ``response.failed``. Everything here runs inside
the worker process, on its trio loop.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import msgspec
import trio

from ._llm_request import LlmRequestData
from ._observe import Observer
from .protocol import (
    ElicitationRequest,
    OutputItemDone,
    OutputTextDelta,
    PolicyDenied,
    PolicyEvaluationRequested,
    PolicyVerdict,
    ReasoningDelta,
    ResponseHeartbeat,
    ResponseRetry,
    RuntimeModel,
    TurnStart,
    Warning,
)

if TYPE_CHECKING:
    from ._worker import Worker

#: The phase asked before a turn's first model call (PROTOCOL_0_19 §F.4).
LLM_REQUEST = "PHASE_LLM_REQUEST"
#: A ``response.heartbeat`` this often while a policy verdict is awaited: the server may hold
#: the evaluation until a person answers, and a turn with no event for long is ended by
#: dispatch's idle watchdog (which cannot see that the turn waits on a person).
POLICY_HEARTBEAT_S = 30.0
APPROVAL_SCHEMA = {
    "type": "object",
    "properties": {"approved": {"type": "boolean"}},
    "required": ["approved"],
}


class TurnFailed(Exception):
    """Raised by a worker kind to end the turn with ``response.failed {code, message}``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class Verdict:
    """A human's answer to an elicitation."""

    action: str
    content: dict[str, Any] | None = None

    @property
    def accepted(self) -> bool:
        return self.action == "accept"


class WorkerKind(Protocol):
    """What a harness implementation provides. One instance per worker process."""

    async def run_turn(self, turn: TurnContext) -> None:
        """Run one turn, emitting through ``turn``; raise :class:`TurnFailed` to fail it."""


class TurnContext:
    """Everything a worker kind needs to run one turn and report it."""

    def __init__(self, worker: Worker, start: TurnStart) -> None:
        self.worker = worker
        self.start = start
        self.session_id = start.session_id
        self.turn_id = start.turn_id
        self.spec = start.spec
        self.message = start.message
        self.response_id = f"resp_{uuid.uuid4().hex[:24]}"
        self.observer = Observer(start.session_id, start.turn_id)
        self.usage: dict[str, Any] = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
        self.text_parts: list[str] = []
        #: The assistant message being streamed: its id and its text so far (:meth:`text`).
        self._message_id: str | None = None
        self._message_text: list[str] = []
        #: A failure the harness's stream reported without ending the turn: (code, message),
        #: cleared by a later completion report (:meth:`report_end`).
        self.reported_failure: tuple[str, str] | None = None
        self._seq = 0
        self._waits: dict[str, tuple[trio.Event, list[Any]]] = {}

    @property
    def model(self) -> str | None:
        """The requested model: the override, else the spec's, else the message's."""
        return (
            self.start.model_override
            or self.spec.get("model")
            or self.spec.get("executor", {}).get("model")
            or self.message.get("model")
        )

    @property
    def workdir(self) -> Path:
        """The session's tool working directory (where its ``sys_os_*`` tools run): a CLI
        harness runs there, so the file browser and the changed-files signal see its work.
        A turn handed over without one (a test's) works in the current directory."""
        return Path(self.start.workdir) if self.start.workdir else Path.cwd()

    @property
    def cli_home(self) -> Path:
        """A directory of the session's own (0700), durable under the host's state dir, for
        a CLI's home and configuration: two sessions' CLIs never share state, and a
        restarted worker finds the CLI's session to resume. A turn handed over without one
        (a test's) gets a directory under the temporary directory."""
        if self.start.cli_home:
            return Path(self.start.cli_home)
        key = uuid.uuid5(uuid.NAMESPACE_URL, self.session_id).hex
        home = Path(tempfile.gettempdir()) / f"corral-home-{os.getuid()}-{key}"
        home.mkdir(mode=0o700, exist_ok=True)
        return home

    @property
    def services(self) -> trio.Nursery:
        """A nursery as long-lived as the worker, for what a kind keeps across turns (a CLI
        it drives): its tasks are cancelled when the worker stops."""
        assert self.worker.services is not None, "the worker is not serving"
        return self.worker.services

    @property
    def agent(self) -> str:
        """The agent's name, as the server knows it: the message's ``model`` (§C.1).

        It is the ``model`` of every ``response.*`` event's response, and the ``agent`` of the
        items the server persists; the relay names its own assistant message after the same
        value (PROTOCOL_0_19 §D.3, §E.1).
        """
        return str(self.message.get("model") or self.model or self.spec.get("name") or "agent")

    # --- emitting --------------------------------------------------------------------------

    async def emit(self, event: Any, *, durable: bool = False) -> None:
        """Number and send one output event to the turn's ``reply_to``."""
        event = msgspec.structs.replace(event, turn_id=self.turn_id, sequence_number=self._seq)
        self._seq += 1
        await self.worker.send_output(self.start.reply_to, event, durable=durable)

    def report_end(self, failure: tuple[str, str] | None) -> None:
        """The relayed harness stream reported its end: a failure ``(code, message)``, or a
        completion (None). The turn goes on; when it ends, the last report stands — a
        completion after a failure wins (D-21), a failure with nothing after it fails the
        turn (D-19). A kind that raises :class:`TurnFailed` fails the turn regardless."""
        self.reported_failure = failure

    async def _observe_then(self) -> None:
        observation = self.observer.before_output()
        if observation is not None:
            await self.emit(RuntimeModel(**observation))

    async def text(self, delta: str) -> None:
        """Stream assistant text.

        Deltas carry the ``message_id`` of the assistant message they make up, and the whole
        message follows as one item (:meth:`end_message`) before the next item or the turn's
        end. The server could save the text from the deltas alone, but its relay keeps them
        only for one relay of the stream: after a reconnect (a gateway restart, a server
        restart) it would save only the part it relayed since. The item reaches it whole,
        through the gateway's durable buffer.
        """
        await self._observe_then()
        self.text_parts.append(delta)
        if self._message_id is None:
            self._message_id = f"msg_{uuid.uuid4().hex[:24]}"
        self._message_text.append(delta)
        await self.emit(OutputTextDelta(delta=delta, message_id=self._message_id))

    async def end_message(self) -> None:
        """Send the assistant message streamed so far as one item (nothing if none is)."""
        message_id, text = self._message_id, "".join(self._message_text)
        self._message_id, self._message_text = None, []
        if message_id is None or not text:
            return
        item = {
            "type": "message",
            "id": message_id,
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
        await self.item(item)

    def drop_message(self) -> None:
        """Forget the message being streamed: an interrupted turn's partial text is not
        saved (PROTOCOL_0_19 §E.4)."""
        self._message_id, self._message_text = None, []

    async def reasoning(self, delta: str) -> None:
        """Stream reasoning text."""
        await self._observe_then()
        await self.emit(ReasoningDelta(delta=delta))

    def serve(self, model: str | None, provider: str | None, fallback_active: bool = False) -> None:
        """From now on, ``model`` (by ``provider``) serves this run."""
        self.observer.serve(model, provider, fallback_active)

    async def retry(self, attempt: int, max_attempts: int, delay_s: float, reason: str) -> None:
        """The model call is tried again (``attempt`` of ``max_attempts``) in ``delay_s``:
        a ``response.retry`` event, so whoever watches the turn sees why it pauses."""
        await self.emit(
            ResponseRetry(
                attempt=attempt,
                max_attempts=max_attempts,
                delay_seconds=round(delay_s, 2),
                error={"code": "provider_retry", "message": reason},
            )
        )

    async def status(self, text: str) -> None:
        """A provider lifecycle status; a fallback switch becomes a ``warning`` (J-24)."""
        if self.observer.on_status(text):
            await self.emit(Warning(kind="fallback", message=text))

    async def item(self, item: dict[str, Any]) -> None:
        """Emit a finished output item.

        A completed ``function_call`` and an assistant ``message`` get the ``agent`` field
        (unless they have one): the server drops either without it (PROTOCOL_0_19 §E.1).
        """
        if item.get("type") == "message" and item.get("role") == "assistant":
            # The kind sends its message whole: the deltas streamed for it are in it.
            self.drop_message()
        else:
            # The text streamed so far comes first in the transcript.
            await self.end_message()
        if _persisted_with_agent(item) and not item.get("agent"):
            item = {**item, "agent": self.agent}
        await self.emit(OutputItemDone(item=item))

    # --- waiting on the runner -------------------------------------------------------------

    async def _wait_for(self, key: str, ask: Callable[[], Awaitable[Any]]) -> Any:
        """Wait on ``key``, registered before ``ask`` sends the request.

        The answer can arrive while the request is still being sent (a durable send waits
        for its ack); registered only afterwards, it would find nobody waiting (404).
        """
        event = trio.Event()
        box: list[Any] = []
        self._waits[key] = (event, box)
        try:
            await ask()
            await event.wait()
        finally:
            self._waits.pop(key, None)
        return box[0]

    def resolve(self, key: str, value: Any) -> bool:
        """Deliver an answer the turn waits for; False if nothing waits on ``key``."""
        waiting = self._waits.get(key)
        if waiting is None:
            return False
        waiting[1].append(value)
        waiting[0].set()
        return True

    def waits_for(self, key: str) -> bool:
        """Whether the turn is waiting on ``key`` (a call id, elicitation id, ...)."""
        return key in self._waits

    def elicitations(self) -> list[str]:
        """The ids of the elicitations the turn waits on."""
        return sorted(
            key.removeprefix("elicit:") for key in self._waits if key.startswith("elicit:")
        )

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        """Ask the runner to execute a tool (§iv.4) and return its output."""
        call_id = f"call_{uuid.uuid4().hex[:12]}"
        args = json.dumps(arguments)
        base = {"type": "function_call", "name": name, "arguments": args, "call_id": call_id}
        await self.item({**base, "id": f"fc_{uuid.uuid4().hex[:12]}", "status": "in_progress"})
        item_id = f"fc_{uuid.uuid4().hex[:12]}"
        request = OutputItemDone(item={**base, "id": item_id, "status": "action_required"})
        output: str = await self._wait_for(
            f"tool:{call_id}", lambda: self.emit(request, durable=True)
        )
        await self.item({**base, "id": item_id, "status": "completed"})
        await self.item(
            {
                "type": "function_call_output",
                "id": f"fco_{uuid.uuid4().hex[:12]}",
                "call_id": call_id,
                "output": output,
            }
        )
        return output

    async def elicit(self, params: dict[str, Any]) -> Verdict:
        """Ask a human (``response.elicitation_request``) and park until a verdict."""
        elicitation_id = f"elicit_{uuid.uuid4().hex}"

        async def ask() -> None:
            await self.worker.park(self, elicitation_id, params)
            await self.emit(
                ElicitationRequest(elicitation_id=elicitation_id, params=params), durable=True
            )

        return await self._wait_for(f"elicit:{elicitation_id}", ask)

    async def policy(self, phase: str, data: dict[str, Any]) -> PolicyVerdict:
        """Ask for a policy verdict (``policy_evaluation.requested``) and wait for it.

        ``data`` is the phase's ``event.data`` object (PROTOCOL_0_19 §F.2). There is no
        deadline: the server may hold the evaluation until a person answers (§F.3). A
        ``response.heartbeat`` goes out every :data:`POLICY_HEARTBEAT_S` meanwhile.
        """
        evaluation_id = f"poleval_{uuid.uuid4().hex}"
        request = PolicyEvaluationRequested(evaluation_id=evaluation_id, phase=phase, data=data)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._heartbeats)
            verdict: PolicyVerdict = await self._wait_for(
                f"policy:{evaluation_id}", lambda: self.emit(request, durable=True)
            )
            nursery.cancel_scope.cancel()
        return verdict

    async def _heartbeats(self) -> None:
        while True:
            await trio.sleep(POLICY_HEARTBEAT_S)
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            await self.emit(ResponseHeartbeat(server_time=now, last_event_seq=self._seq))

    async def check_llm_request(self, data: LlmRequestData) -> None:
        """Ask policy whether the turn may call the model (``PHASE_LLM_REQUEST``, §F.4).

        A kind calls it once per turn, before its first model call: a server-side spend or
        model policy can stop the turn there. ``data`` is ``{model, messages_count,
        tools_count, system_prompt_preview, last_user_message}``.

        ALLOW and UNSPECIFIED return. The server holds an ASK until a person answers and then
        answers ALLOW or DENY; an ASK handed back as such (a server that does not hold it) is
        put to a person here, as an elicitation. DENY publishes ``response.policy_denied``
        and fails the turn ``policy_denied`` with the reason; a verdict the runner could not
        get fails it ``policy_unavailable``. Either way the model is not called.

        Raises:
            TurnFailed: ``policy_denied`` or ``policy_unavailable``.
        """
        verdict = await self.policy(LLM_REQUEST, dict(data))
        action = verdict.action.upper().removeprefix("POLICY_ACTION_")
        reason = verdict.reason
        if verdict.failed:
            raise TurnFailed(
                "policy_unavailable",
                f"the policy check before the model call failed: {reason or 'no verdict'}",
            )
        if action == "ASK":
            answer = await self.elicit(
                {
                    "message": reason or "The agent wants to call the model. Approve?",
                    "requestedSchema": APPROVAL_SCHEMA,
                    "phase": "llm_request",
                }
            )
            if answer.accepted:
                return
            action, reason = "DENY", f"the user answered {answer.action}"
        if action == "DENY":
            reason = reason or "no reason given"
            await self.emit(
                PolicyDenied(conversation_id=self.session_id, reason=reason, phase="llm_request")
            )
            raise TurnFailed("policy_denied", f"the model call was denied by policy: {reason}")

    async def flush(self) -> None:
        """Send every queued event now (before something that may stop the process)."""
        await self.worker.flush_outputs()

    def response(self, status: str) -> dict[str, Any]:
        """The ``response`` object of lifecycle events."""
        return {
            "id": self.response_id,
            "object": "response",
            "status": status,
            "model": self.agent,
            "created_at": int(time.time()),
            "output": [],
        }


def _persisted_with_agent(item: dict[str, Any]) -> bool:
    """Whether the server persists ``item`` only with an ``agent`` (PROTOCOL_0_19 §E.1)."""
    kind = item.get("type")
    if kind == "function_call":
        return item.get("status") == "completed"
    return kind == "message" and item.get("role") == "assistant"


def final_usage(turn: TurnContext) -> dict[str, Any]:
    """``response.completed.response.usage``, with the serving model when the kind did not
    name one: the server publishes ``session.model`` from ``usage.model`` (§D.3)."""
    usage = dict(turn.usage)
    if not usage.get("model") and turn.observer.serving.model:
        usage["model"] = turn.observer.serving.model
    return usage
