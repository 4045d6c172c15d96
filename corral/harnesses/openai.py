"""The ``openai`` worker kind: an agent loop against any OpenAI-compatible endpoint.

One turn is a loop of model calls. Each call streams (Server-Sent Events) from either the
Responses API (``POST {base_url}/responses``) or Chat Completions
(``POST {base_url}/chat/completions``); text and reasoning deltas go to the turn as they
arrive, and tool calls are run through the runner (:meth:`TurnContext.call_tool`), appended
to the conversation with their outputs, and the model is called again, until it answers
without calling a tool or ``max_steps`` calls were made.

The problem is everything in between: providers rate-limit (429), fail (5xx), hang, drop the
connection mid-stream and now and then send garbage. The rules, chosen so that a turn never
hangs and a user never sees the same text twice:

* 408/409/429/5xx and connection errors are retried with exponential backoff and jitter
  (``retry-after`` honoured, capped), but only while nothing of the attempt reached the turn;
  a drop after text was streamed fails the turn (``provider_disconnected``).
* Any other HTTP status fails at once (``provider_error``) with the provider's own message.
* No byte for ``idle_timeout_s``, or a turn longer than ``turn_timeout_s``: ``timeout``.
* A ``data:`` payload that is not a JSON object fails the turn (``provider_protocol_error``):
  skipping it could silently lose text or tool-call arguments. SSE comments, unknown event
  types and unknown fields are skipped: they are how providers keep connections alive and
  extend the protocol.

Interrupts arrive as trio cancellation; the HTTP client lives in the turn, so cancelling the
turn closes its connections. The api key only travels in the ``Authorization`` header: it is
never logged and is scrubbed from provider messages before they become errors.

Configuration (spec first, then worker options, then environment) is documented in
``docs/harnesses.md``.
"""

from __future__ import annotations

import base64
import binascii
import email.utils
import json
import logging
import math
import os
import random
import re
import time
import urllib.parse
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx
import trio

from ._worker import TurnFailed
from .spawn_env import env_prefix

if TYPE_CHECKING:
    from ._worker import TurnContext

log = logging.getLogger("corral.harnesses.openai")

DEFAULT_BASE_URL = "https://api.openai.com/v1"
#: Harness names whose agents were written for the Responses API (PROTOCOL_FACTS §iii.3).
RESPONSES_HARNESSES = frozenset({"openai-agents", "open-responses"})
APIS = ("responses", "chat")
RETRYABLE_STATUS = frozenset({408, 409, 429})
MAX_SSE_LINE = 16 * 1024 * 1024
_VAR = re.compile(r"^\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?$")

#: Tunables, read from ``spec["executor"]``, then the worker options.
DEFAULTS: dict[str, float] = {
    "max_steps": 25,  # model calls per turn
    "max_attempts": 5,  # tries of one model call (429/5xx/connection errors)
    "backoff_base_s": 1.0,  # first retry delay; doubles per attempt, with jitter
    "backoff_max_s": 30.0,  # cap on one delay, retry-after included
    "idle_timeout_s": 180.0,  # no byte from the provider for this long: timeout; 0 disables
    "turn_timeout_s": 3600.0,  # whole turn, tool calls included; 0 disables
}
#: ``HARNESS_<NAME>_<SUFFIX>`` variables per setting; ``GATEWAY_BASE_URL`` is what the runner
#: corral replaces sets for ``openai-agents`` (PROTOCOL_FACTS §iv).
_ENV_SUFFIXES = {
    "model": ("MODEL",),
    "api_key": ("API_KEY",),
    "base_url": ("BASE_URL", "GATEWAY_BASE_URL"),
}


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything one turn needs to talk to the provider."""

    harness: str
    api: str
    model: str
    base_url: str
    api_key: str | None = field(repr=False)
    max_steps: int
    max_attempts: int
    backoff_base_s: float
    backoff_max_s: float
    idle_timeout_s: float
    turn_timeout_s: float
    headers: dict[str, str] = field(default_factory=dict)
    extra_body: dict[str, Any] = field(default_factory=dict)

    def idle_deadline(self) -> float:
        """When the idle watchdog fires if no byte arrives from now on."""
        return trio.current_time() + self.idle_timeout_s if self.idle_timeout_s else math.inf

    @property
    def provider(self) -> str:
        """``"openai"`` for api.openai.com, else the base_url's host."""
        host = httpx.URL(self.base_url).host
        return "openai" if host.endswith("openai.com") else host


def resolve_settings(
    spec: Mapping[str, Any],
    options: Mapping[str, Any],
    environ: Mapping[str, str],
    *,
    harness: str | None = None,
    model_override: str | None = None,
) -> Settings:
    """Settings from the agent spec, then ``options``, then ``environ``.

    Raises:
        TurnFailed: ``config_error`` naming the key that is missing or wrong.
    """
    executor = spec.get("executor") or {}
    auth = executor.get("auth") or {}
    name = harness or executor.get("harness") or options.get("harness") or "openai"
    prefixes = [env_prefix(name), "HARNESS_OPENAI_", "HARNESS_OPENAI_AGENTS_"]

    def from_env(key: str) -> str | None:
        for prefix in prefixes:
            for suffix in _ENV_SUFFIXES[key]:
                if environ.get(prefix + suffix):
                    return environ[prefix + suffix]
        return None

    def pick(key: str, *sources: Mapping[str, Any]) -> Any:
        for source in sources:
            if source.get(key) not in (None, ""):
                return source[key]
        return None

    model = model_override or pick("model", executor, spec, options) or from_env("model")
    if not model:
        raise TurnFailed("config_error", "no model: set executor.model or HARNESS_OPENAI_MODEL")
    api = pick("api", executor, options) or ("responses" if name in RESPONSES_HARNESSES else None)
    api = api or ("chat" if name == "openai" else "responses")
    if api not in APIS:
        raise TurnFailed("config_error", f"executor.api must be 'responses' or 'chat', got {api!r}")
    base_url = pick("base_url", auth, executor, options) or from_env("base_url") or DEFAULT_BASE_URL
    api_key = pick("api_key", auth, executor, options)
    reference = _VAR.match(api_key) if isinstance(api_key, str) else None
    if reference:  # "$VAR": the harness actor expanded it into HARNESS_<NAME>_API_KEY
        api_key = from_env("api_key") or environ.get(reference.group(1))
        if not api_key:
            raise TurnFailed("config_error", f"the api key {reference.group(0)} is not set")
    api_key = api_key or from_env("api_key")
    tunables: dict[str, Any] = {}
    for key, default in DEFAULTS.items():
        value = pick(key, executor, options)
        value = default if value is None else value
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise TurnFailed("config_error", f"{key} must be a number >= 0, got {value!r}")
        if key in ("max_steps", "max_attempts") and (value < 1 or value != int(value)):
            raise TurnFailed("config_error", f"{key} must be an integer >= 1, got {value!r}")
        tunables[key] = int(value) if key.startswith("max_") else float(value)
    for key in ("headers", "extra_body"):
        if not isinstance(pick(key, executor, options) or {}, dict):
            raise TurnFailed("config_error", f"executor.{key} must be a mapping")
    return Settings(
        harness=name,
        api=api,
        model=str(model),
        base_url=str(base_url).rstrip("/"),
        api_key=str(api_key) if api_key else None,
        headers={str(k): str(v) for k, v in (pick("headers", executor, options) or {}).items()},
        extra_body=dict(pick("extra_body", executor, options) or {}),
        **tunables,
    )


class OpenAIHarness:
    """The ``openai`` worker kind (also serves ``openai-agents`` and ``open-responses``).

    Args:
        options: worker options from the harness actor; the same keys as ``executor``.
        environ: where the ``HARNESS_*`` variables are read; ``os.environ`` by default.
    """

    def __init__(
        self, options: dict[str, Any] | None = None, *, environ: Mapping[str, str] | None = None
    ) -> None:
        self.options = dict(options or {})
        self.environ = os.environ if environ is None else environ

    def settings_for(self, turn: TurnContext) -> Settings:
        start = turn.start
        return resolve_settings(
            turn.spec,
            self.options,
            self.environ,
            harness=start.harness_override or start.harness,
            model_override=start.model_override,
        )

    async def run_turn(self, turn: TurnContext) -> None:
        settings = self.settings_for(turn)
        if settings.api_key is None and settings.base_url == DEFAULT_BASE_URL:
            # No credentials for OpenAI itself: a failed turn now, in its stream (D-06),
            # rather than a 401 after a round trip. A gateway or local server at another
            # base_url may need no key.
            raise TurnFailed(
                "missing_credentials",
                f"no API key for {DEFAULT_BASE_URL}: set executor.auth.api_key or "
                f"{env_prefix(settings.harness)}API_KEY",
            )
        # Before the turn watchdog starts: the server may hold this until a person answers.
        await turn.check_llm_request(llm_request_data(settings, turn.message, turn.spec))
        limit = settings.turn_timeout_s or math.inf
        with trio.move_on_after(limit) as watchdog:
            async with httpx.AsyncClient(timeout=None) as client:
                await _AgentLoop(settings, client, turn).run()
        if watchdog.cancelled_caught:
            raise TurnFailed("timeout", f"the turn took longer than {limit:g}s (turn_timeout_s)")


def llm_request_data(
    settings: Settings, message: Mapping[str, Any], spec: Mapping[str, Any]
) -> dict[str, Any]:
    """The ``PHASE_LLM_REQUEST`` data of a turn (PROTOCOL_0_19 §F.4): the model id, how many
    history items and tools the model gets, the first 200 characters of the instructions
    and the text of the last user message (at most 500 characters)."""
    history = _history(message)
    instructions = message.get("instructions") or spec.get("prompt") or ""
    last_user = ""
    for item in reversed(history):
        if item.get("type", "message") == "message" and item.get("role") == "user":
            content = item.get("content")
            if isinstance(content, str):
                last_user = content
            else:
                last_user = " ".join(
                    str(p.get("text") or "")
                    for p in content or []
                    if isinstance(p, dict) and p.get("type") in ("input_text", "text")
                )
            break
    return {
        "model": settings.model,
        "messages_count": len(history),
        "tools_count": sum(1 for t in message.get("tools") or [] if isinstance(t, dict)),
        "system_prompt_preview": str(instructions)[:200],
        "last_user_message": last_user[:500],
    }


# --- the loop --------------------------------------------------------------------------------


@dataclass(slots=True)
class _ToolCall:
    call_id: str
    name: str
    arguments: str


@dataclass(slots=True)
class _Step:
    """What one model call produced."""

    text: str = ""
    tool_calls: list[_ToolCall] = field(default_factory=list)
    items: list[dict[str, Any]] = field(default_factory=list)  # Responses output items
    usage: dict[str, Any] | None = None


class _Retryable(Exception):
    """An attempt failed in a way worth another try (429, 5xx, connection error)."""

    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class _AgentLoop:
    def __init__(self, settings: Settings, client: httpx.AsyncClient, turn: TurnContext) -> None:
        self.settings = settings
        self.client = client
        self.turn = turn
        message = turn.message
        instructions = message.get("instructions") or turn.spec.get("prompt")
        convo = _ResponsesConversation if settings.api == "responses" else _ChatConversation
        self.conversation = convo(_history(message), instructions, message.get("tools") or [])
        self.served: str | None = None

    async def run(self) -> None:
        max_steps = self.settings.max_steps
        for _ in range(max_steps):
            step = await self._call_model()
            self._add_usage(step.usage)
            # No assistant message item for step.text: the server persists the streamed
            # deltas as the assistant message, and would store an item a second time (§E.1).
            outputs = [(call, await self._run_tool(call)) for call in step.tool_calls]
            self.conversation.add_step(step, outputs)
            if not step.tool_calls:
                return
        raise TurnFailed(
            "max_steps", f"the model was still calling tools after {max_steps} steps (max_steps)"
        )

    async def _run_tool(self, call: _ToolCall) -> str:
        try:
            arguments = json.loads(call.arguments or "{}")
        except ValueError as exc:
            arguments, problem = None, f"not valid JSON ({exc})"
        else:
            problem = "not a JSON object"
        if not isinstance(arguments, dict):
            log.warning("tool call %s: arguments are %s", call.name, problem)
            return f"error: the arguments of {call.name} are {problem}; call it again"
        return await self.turn.call_tool(call.name, arguments)

    def _add_usage(self, usage: dict[str, Any] | None) -> None:
        """Add one model call's usage to the turn's.

        Tokens are summed over the turn's calls. ``context_tokens`` is the last call's total:
        what the context holds after it (each call re-sends the whole history, so a sum
        would count it again per call). ``model`` is the id the provider reported serving,
        else the requested one; the server publishes it as ``session.model`` (§D.3).
        """
        if not usage:
            return
        got_in = usage.get("input_tokens", usage.get("prompt_tokens")) or 0
        got_out = usage.get("output_tokens", usage.get("completion_tokens")) or 0
        got_total = usage.get("total_tokens") or got_in + got_out
        total = self.turn.usage
        total["input_tokens"] = total.get("input_tokens", 0) + got_in
        total["output_tokens"] = total.get("output_tokens", 0) + got_out
        total["total_tokens"] = total.get("total_tokens", 0) + got_total
        total["context_tokens"] = got_total
        total["model"] = self.served or self.settings.model

    async def _call_model(self) -> _Step:
        """One model call, retried on 429/5xx/connection errors before anything streamed."""
        s = self.settings
        body = self.conversation.body(s.model)
        for key, value in s.extra_body.items():
            if key in ("model", "stream", "input", "messages"):
                continue
            if value is None:
                body.pop(key, None)
            else:
                body[key] = value
        for attempt in range(1, s.max_attempts + 1):
            try:
                return await self._attempt(body)
            except _Retryable as exc:
                if attempt == s.max_attempts:
                    raise TurnFailed(
                        "provider_unavailable", f"{exc.reason}; gave up after {attempt} attempts"
                    ) from None
                delay = _delay(attempt, exc.retry_after, s)
                log.warning("%s; retrying in %.2fs (attempt %d)", exc.reason, delay, attempt + 1)
                await self.turn.status(f"Retrying the model call in {delay:.1f}s: {exc.reason}")
                await trio.sleep(delay)
        raise AssertionError("unreachable")

    async def _attempt(self, body: dict[str, Any]) -> _Step:
        s = self.settings
        url = s.base_url + ("/responses" if s.api == "responses" else "/chat/completions")
        headers = {"accept": "text/event-stream", **s.headers}
        if s.api_key:
            headers["authorization"] = f"Bearer {s.api_key}"
        reader = (_ResponsesReader if s.api == "responses" else _ChatReader)(self)
        try:
            with trio.CancelScope() as idle:
                idle.deadline = s.idle_deadline()
                async with self.client.stream("POST", url, json=body, headers=headers) as resp:
                    if resp.status_code != 200:
                        payload = await _read_capped(resp, 64 * 1024)
                        raise _http_failure(resp.status_code, resp.headers, payload, s)
                    if resp.headers.get("content-type", "").startswith("application/json"):
                        await reader.whole(_json_object(await resp.aread()))
                    else:
                        await self._read_events(resp, reader, idle)
        except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
            raise TurnFailed("config_error", f"bad base_url {s.base_url!r}: {exc}") from None
        except httpx.TransportError as exc:
            what = f"connection to {s.provider} failed: {type(exc).__name__}: {exc}".rstrip(": ")
            if reader.emitted:
                raise TurnFailed("provider_disconnected", what) from None
            raise _Retryable(what) from None
        except httpx.DecodingError as exc:
            raise TurnFailed("provider_protocol_error", f"undecodable body: {exc}") from None
        if idle.cancelled_caught:
            raise TurnFailed(
                "timeout", f"no data from {s.provider} for {s.idle_timeout_s:g}s (idle_timeout_s)"
            )
        if not reader.complete:
            what = f"the stream from {s.provider} ended before the response was complete"
            if reader.emitted:
                raise TurnFailed("provider_disconnected", what)
            raise _Retryable(what)
        return reader.step()

    async def _read_events(
        self, resp: httpx.Response, reader: _Reader, idle: trio.CancelScope
    ) -> None:
        parser = _SSEParser()
        async for chunk in resp.aiter_bytes():
            idle.deadline = math.inf  # time spent emitting is not provider idleness
            for event, data in parser.feed(chunk):
                await reader.event(event, data)
                if reader.done:
                    return
            idle.deadline = self.settings.idle_deadline()
        for event, data in parser.close():
            await reader.event(event, data)

    def serve(self, model: Any) -> None:
        """Report the model the provider says is serving (never the requested one)."""
        if isinstance(model, str) and model and model != self.served:
            self.served = model
            self.turn.serve(model, self.settings.provider, False)


async def _read_capped(resp: httpx.Response, limit: int) -> bytes:
    """At most ``limit`` bytes of an error body: enough for a message, never a flood."""
    body = b""
    async for chunk in resp.aiter_bytes():
        body += chunk
        if len(body) >= limit:
            break
    return body[:limit]


def _delay(attempt: int, retry_after: float | None, s: Settings) -> float:
    """Seconds before try ``attempt + 1``: the provider's ``retry-after`` if it gave one, else
    exponential backoff with jitter (50-100 %); never more than ``backoff_max_s``."""
    if retry_after is not None:
        return min(s.backoff_max_s, retry_after)
    return min(s.backoff_max_s, s.backoff_base_s * 2 ** (attempt - 1)) * random.uniform(0.5, 1)


def _http_failure(status: int, headers: httpx.Headers, payload: bytes, s: Settings) -> Exception:
    text = _redact(_provider_message(payload), s.api_key)
    reason = f"{s.provider} returned HTTP {status}" + (f": {text}" if text else "")
    if status in RETRYABLE_STATUS or status >= 500:
        return _Retryable(reason, _retry_after(headers))
    return TurnFailed("provider_error", reason)


def _provider_message(payload: bytes) -> str:
    try:
        obj = json.loads(payload)
    except ValueError:
        return payload.decode("utf-8", "replace").strip()[:300]
    error = obj.get("error", obj) if isinstance(obj, dict) else obj
    if isinstance(error, dict):
        return str(error.get("message") or error.get("detail") or json.dumps(error))[:300]
    return str(error)[:300]


def _redact(text: str, secret: str | None) -> str:
    return text.replace(secret, "[redacted]") if secret else text


def _retry_after(headers: httpx.Headers) -> float | None:
    try:
        if "retry-after-ms" in headers:
            return max(0.0, float(headers["retry-after-ms"]) / 1000)
        value = headers.get("retry-after")
        if value is None:
            return None
        try:
            return max(0.0, float(value))
        except ValueError:
            return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def _json_object(data: str | bytes) -> dict[str, Any]:
    try:
        obj = json.loads(data)
    except ValueError:
        obj = None
    if not isinstance(obj, dict):
        shown = data if isinstance(data, str) else data.decode("utf-8", "replace")
        raise TurnFailed("provider_protocol_error", f"not a JSON object: {shown[:200]!r}")
    return obj


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error.get("code") or json.dumps(error))
    return str(error)


def _message_item(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": f"msg_{uuid.uuid4().hex[:24]}",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


# --- Server-Sent Events ----------------------------------------------------------------------


class _SSEParser:
    """Incremental ``text/event-stream`` parser: bytes in, ``(event, data)`` pairs out.

    Lines end in ``\\n`` or ``\\r\\n``; ``:`` comments, ``id`` and ``retry`` are ignored.
    """

    def __init__(self) -> None:
        self._buffer = b""
        self._event = ""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[tuple[str, str]]:
        *lines, self._buffer = (self._buffer + chunk).split(b"\n")
        if len(self._buffer) > MAX_SSE_LINE:
            raise TurnFailed("provider_protocol_error", "an SSE line longer than 16 MiB")
        out: list[tuple[str, str]] = []
        for raw in lines:
            try:
                line = raw.removesuffix(b"\r").decode()
            except UnicodeDecodeError:
                raise TurnFailed("provider_protocol_error", "an SSE line is not UTF-8") from None
            if not line:
                if self._data:
                    out.append((self._event, "\n".join(self._data)))
                self._event, self._data = "", []
                continue
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "data":
                self._data.append(value)
            elif name == "event":
                self._event = value
        return out

    def close(self) -> list[tuple[str, str]]:
        """The last event, when the stream ended without its blank line."""
        return self.feed(b"\n\n")


# --- the two APIs ----------------------------------------------------------------------------


class _Reader:
    """Consumes one streamed model call, emitting text and reasoning to the turn."""

    def __init__(self, loop: _AgentLoop) -> None:
        self.loop = loop
        self.turn = loop.turn
        self.emitted = False  # something of this attempt reached the turn: no retry
        self.done = False
        self.text: list[str] = []
        self.usage: dict[str, Any] | None = None

    async def _text(self, delta: Any) -> None:
        if not isinstance(delta, str):
            raise TurnFailed("provider_protocol_error", f"a text delta is not a string: {delta!r}")
        if delta:
            self.emitted = True
            self.text.append(delta)
            await self.turn.text(delta)

    async def _reasoning(self, delta: Any) -> None:
        if isinstance(delta, str) and delta:
            self.emitted = True
            await self.turn.reasoning(delta)

    @property
    def complete(self) -> bool:
        """Whether the model call ended properly (else the stream was cut short)."""
        return self.done

    async def event(self, name: str, data: str) -> None:
        raise NotImplementedError

    async def whole(self, obj: dict[str, Any]) -> None:
        """A provider that ignored ``stream: true`` and answered with one JSON object."""
        raise NotImplementedError

    def step(self) -> _Step:
        raise NotImplementedError


class _ResponsesReader(_Reader):
    def __init__(self, loop: _AgentLoop) -> None:
        super().__init__(loop)
        self.items: list[dict[str, Any]] = []

    async def event(self, name: str, data: str) -> None:
        if data.strip() == "[DONE]":
            return
        obj = _json_object(data)
        kind = obj.get("type") or name
        if kind in ("response.created", "response.in_progress", "response.queued"):
            self.loop.serve((obj.get("response") or {}).get("model"))
        elif kind == "response.output_text.delta":
            await self._text(obj.get("delta"))
        elif kind in ("response.reasoning_text.delta", "response.reasoning_summary_text.delta"):
            await self._reasoning(obj.get("delta"))
        elif kind == "response.output_item.done":
            if not isinstance(obj.get("item"), dict):
                raise TurnFailed("provider_protocol_error", f"{kind} without an item")
            self.items.append(obj["item"])
        elif kind in ("response.completed", "response.incomplete"):
            await self.whole(obj.get("response") or {})
        elif kind == "response.failed":
            error = (obj.get("response") or {}).get("error") or "the response failed"
            raise TurnFailed("provider_error", _redact(_error_text(error), self._key))
        elif kind == "error":
            raise TurnFailed(
                "provider_error", _redact(_error_text(obj.get("error", obj)), self._key)
            )

    @property
    def _key(self) -> str | None:
        return self.loop.settings.api_key

    async def whole(self, response: dict[str, Any]) -> None:
        self.loop.serve(response.get("model"))
        self.usage = response.get("usage") or None
        if not self.items and isinstance(response.get("output"), list):
            self.items = [i for i in response["output"] if isinstance(i, dict)]
            if not self.text:  # nothing was streamed: emit the answer whole
                for item in self.items:
                    if item.get("type") == "message":
                        await self._text(_item_text(item))
        self.done = True

    def step(self) -> _Step:
        calls = []
        for item in self.items:
            if item.get("type") != "function_call":
                continue
            if not item.get("name"):
                raise TurnFailed("provider_protocol_error", f"a function_call has no name: {item}")
            call_id = item.get("call_id") or item.get("id") or f"call_{uuid.uuid4().hex[:12]}"
            calls.append(
                _ToolCall(str(call_id), str(item["name"]), str(item.get("arguments") or ""))
            )
        return _Step("".join(self.text), calls, self.items, self.usage)


class _ChatReader(_Reader):
    def __init__(self, loop: _AgentLoop) -> None:
        super().__init__(loop)
        self.calls: dict[int, dict[str, str]] = {}
        self.finished = False

    async def event(self, name: str, data: str) -> None:
        if data.strip() == "[DONE]":
            self.done = True
            return
        obj = _json_object(data)
        if obj.get("error"):
            error = _redact(_error_text(obj["error"]), self.loop.settings.api_key)
            raise TurnFailed("provider_error", error)
        self.loop.serve(obj.get("model"))
        if obj.get("usage"):
            self.usage = obj["usage"]
        for choice in obj.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or choice.get("message") or {}
            await self._reasoning(delta.get("reasoning_content") or delta.get("reasoning"))
            await self._text(delta.get("content") or delta.get("refusal") or "")
            for call in delta.get("tool_calls") or []:
                self._add_call(call)
            self.finished = self.finished or bool(choice.get("finish_reason"))

    def _add_call(self, call: Any) -> None:
        if not isinstance(call, dict):
            raise TurnFailed("provider_protocol_error", f"a tool call is not an object: {call!r}")
        index = call.get("index", len(self.calls))
        acc = self.calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
        function = call.get("function") or {}
        acc["id"] = acc["id"] or str(call.get("id") or "")
        acc["name"] = acc["name"] or str(function.get("name") or "")
        acc["arguments"] += str(function.get("arguments") or "")

    @property
    def complete(self) -> bool:
        # ``[DONE]`` ends a stream; some servers close after the finish_reason without it.
        return self.done or self.finished

    async def whole(self, obj: dict[str, Any]) -> None:
        await self.event("", json.dumps(obj))
        self.done = True

    def step(self) -> _Step:
        calls = []
        for index in sorted(self.calls):
            acc = self.calls[index]
            if not acc["name"]:
                raise TurnFailed("provider_protocol_error", f"tool call #{index} has no name")
            call_id = acc["id"] or f"call_{uuid.uuid4().hex[:12]}"
            calls.append(_ToolCall(call_id, acc["name"], acc["arguments"]))
        return _Step("".join(self.text), calls, [], self.usage)


# --- conversations ---------------------------------------------------------------------------


_TEXT_PARTS = ("text", "input_text", "output_text")


def _history(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The §iv.1 ``content``: a list of items (or, leniently, one user string).

    A call the runner recorded twice (``in_progress``, then ``completed``) is kept once.
    """
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "message", "role": "user", "content": content}]
    items: list[dict[str, Any]] = []
    calls: set[str] = set()
    for item in content or []:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "function_call" and item.get("call_id"):
            if item["call_id"] in calls:
                continue
            calls.add(item["call_id"])
        items.append(item)
    return items


def _item_text(item: Mapping[str, Any]) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    return "".join(
        str(p.get("text") or "") for p in content or [] if isinstance(p, dict) and "text" in p
    )


class _ResponsesConversation:
    """The ``input`` of a Responses call: history items, then the turn's own items."""

    def __init__(self, history: list[dict], instructions: str | None, tools: list) -> None:
        self.instructions = instructions
        self.tools = [_responses_tool(t) for t in tools if isinstance(t, dict)]
        self.input = [_responses_item(i) for i in history]

    def add_step(self, step: _Step, outputs: list[tuple[_ToolCall, str]]) -> None:
        items = step.items
        if not items:  # a provider that sent no output items: rebuild them
            items = [_message_item(step.text)] if step.text else []
            items += [
                {
                    "type": "function_call",
                    "call_id": c.call_id,
                    "name": c.name,
                    "arguments": c.arguments,
                }
                for c in step.tool_calls
            ]
        self.input.extend(items)
        for call, output in outputs:
            self.input.append(
                {"type": "function_call_output", "call_id": call.call_id, "output": output}
            )

    def body(self, model: str) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, "input": list(self.input), "stream": True}
        if self.instructions:
            body["instructions"] = self.instructions
        if self.tools:
            body["tools"] = self.tools
        return body


#: Media types of an attached file whose content goes to the model as text.
_TEXT_FILE_TYPES = ("application/json", "application/xml", "application/yaml", "application/x-yaml")


def _inline_text_files(content: list[Any]) -> list[dict[str, Any]]:
    """Content blocks with each text file attached as ``input_text``.

    The server forwards an upload as ``{"type": "input_file", "filename", "file_data":
    "data:<type>;base64,..."}`` (PROTOCOL_0_19 §C.1). A text file (``text/*``, JSON, XML,
    YAML) becomes an ``input_text`` block holding its decoded content (UTF-8, undecodable
    bytes replaced), which every model and both APIs read. Any other file, and one whose
    data cannot be decoded, passes on as it came.
    """
    blocks: list[dict[str, Any]] = []
    for block in content:
        if not isinstance(block, dict):
            continue
        text = _text_file(block) if block.get("type") == "input_file" else None
        blocks.append(block if text is None else {"type": "input_text", "text": text})
    return blocks


def _text_file(block: dict[str, Any]) -> str | None:
    data = block.get("file_data")
    if not isinstance(data, str) or not data.startswith("data:"):
        return None
    header, comma, payload = data.partition(",")
    media_type, *params = header.removeprefix("data:").split(";")
    media_type = media_type.strip().lower()
    is_text = media_type.startswith("text/") or media_type.endswith("+json")
    if not comma or not (is_text or media_type in _TEXT_FILE_TYPES):
        return None
    try:
        raw = base64.b64decode(payload, validate=True) if "base64" in params else None
    except binascii.Error:
        return None
    return (raw if raw is not None else urllib.parse.unquote_to_bytes(payload)).decode(
        "utf-8", "replace"
    )


def _responses_tool(tool: dict[str, Any]) -> dict[str, Any]:
    function = tool.get("function")
    if tool.get("type") == "function" and isinstance(function, dict):
        return {"type": "function", **function}
    return tool


def _responses_item(item: dict[str, Any]) -> dict[str, Any]:
    """A history item the Responses API accepts (runner-only fields and ids dropped)."""
    kind = item.get("type") or ("message" if "role" in item else None)
    if kind == "message":
        role = item.get("role") or "user"
        content = item.get("content")
        if isinstance(content, list):
            text_type = "output_text" if role == "assistant" else "input_text"
            content = [
                {**p, "type": text_type} if p.get("type") in _TEXT_PARTS else p
                for p in _inline_text_files(content)
            ]
        return {"type": "message", "role": role, "content": content or ""}
    if kind == "function_call":
        keys = ("call_id", "name", "arguments")
        return {"type": kind, **{k: item.get(k) or "" for k in keys}}
    if kind == "function_call_output":
        return {"type": kind, "call_id": item.get("call_id") or "", "output": item.get("output")}
    return {k: v for k, v in item.items() if k != "agent"}


class _ChatConversation:
    """The ``messages`` of a Chat Completions call."""

    def __init__(self, history: list[dict], instructions: str | None, tools: list) -> None:
        self.messages: list[dict[str, Any]] = []
        if instructions:
            self.messages.append({"role": "system", "content": instructions})
        self.tools = [_chat_tool(t) for t in tools if isinstance(t, dict)]
        self.tools = [t for t in self.tools if t is not None]
        for item in history:
            self._add_item(item)

    def _add_item(self, item: dict[str, Any]) -> None:
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = item.get("role") or "user"
            role = "system" if role == "developer" else role
            self.messages.append({"role": role, "content": _chat_content(item.get("content"))})
        elif kind == "function_call":
            call = {
                "id": item.get("call_id") or "",
                "type": "function",
                "function": {"name": item.get("name") or "", "arguments": item.get("arguments")},
            }
            last = self.messages[-1] if self.messages else {}
            if last.get("role") == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                self.messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            output = output if isinstance(output, str) else json.dumps(output)
            self.messages.append(
                {"role": "tool", "tool_call_id": item.get("call_id") or "", "content": output}
            )

    def add_step(self, step: _Step, outputs: list[tuple[_ToolCall, str]]) -> None:
        message: dict[str, Any] = {"role": "assistant", "content": step.text or None}
        if step.tool_calls:
            message["tool_calls"] = [
                {
                    "id": c.call_id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in step.tool_calls
            ]
        self.messages.append(message)
        for call, output in outputs:
            self.messages.append({"role": "tool", "tool_call_id": call.call_id, "content": output})

    def body(self, model: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model,
            "messages": list(self.messages),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.tools:
            body["tools"] = self.tools
        return body


def _chat_tool(tool: dict[str, Any]) -> dict[str, Any] | None:
    if isinstance(tool.get("function"), dict):
        return tool
    if tool.get("type") == "function" and tool.get("name"):
        function = {k: v for k, v in tool.items() if k != "type"}
        return {"type": "function", "function": function}
    return None  # a provider-hosted tool: Chat Completions has no equivalent


def _chat_content(content: Any) -> Any:
    """Responses content parts → a Chat string (text only) or a list of Chat parts."""
    if not isinstance(content, list):
        return content if isinstance(content, str) else ""
    parts: list[dict[str, Any]] = []
    for part in _inline_text_files(content):
        if "text" in part and part.get("type") in _TEXT_PARTS:
            parts.append({"type": "text", "text": part["text"]})
        elif part.get("type") == "input_image":
            url = part.get("image_url")
            url = url.get("url") if isinstance(url, dict) else url
            parts.append({"type": "image_url", "image_url": {"url": url}})
    if all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts
