"""The agent loop of one turn: model calls, their retries, and the tools they ask for.

:class:`_AgentLoop` calls the model (streaming, through :mod:`._streams`), runs the tool
calls through the runner and calls again, until an answer without tool calls or
``max_steps``; the functions here turn provider failures into retries or turn failures.
"""

from __future__ import annotations

import email.utils
import json
import logging
import random
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import httpx
import trio

from ..._jsonlines import JsonObject
from .._turn import TurnFailed
from ._conversations import _ChatConversation, _history, _ResponsesConversation
from ._settings import Settings
from ._step import _Step, _ToolCall
from ._streams import _ChatReader, _json_object, _Reader, _redact, _ResponsesReader, _SSEParser

if TYPE_CHECKING:
    from .._turn import TurnContext

log = logging.getLogger("corral.harnesses.openai")


RETRYABLE_STATUS = frozenset({408, 409, 429})


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

    def _add_usage(self, usage: JsonObject | None) -> None:
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
                await self.turn.retry(attempt + 1, s.max_attempts, delay, exc.reason)
                await trio.sleep(delay)
        raise AssertionError("unreachable")

    async def _attempt(self, body: JsonObject) -> _Step:
        s = self.settings
        url = s.base_url + ("/responses" if s.api == "responses" else "/chat/completions")
        headers = {"accept": "text/event-stream", **s.headers}
        if s.api_key:
            headers["authorization"] = f"Bearer {s.api_key}"
        reader = (_ResponsesReader if s.api == "responses" else _ChatReader)(self)
        try:
            request = self.client.stream(
                "POST", url, json=body, headers=headers, timeout=s.timeout()
            )
            async with request as resp:
                if resp.status_code != 200:
                    payload = await _read_capped(resp, 64 * 1024)
                    raise _http_failure(resp.status_code, resp.headers, payload, s)
                if resp.headers.get("content-type", "").startswith("application/json"):
                    await reader.whole(_json_object(await resp.aread()))
                else:
                    await self._read_events(resp, reader)
        except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
            raise TurnFailed("config_error", f"bad base_url {s.base_url!r}: {exc}") from None
        except httpx.TimeoutException:
            raise TurnFailed(
                "timeout", f"no data from {s.provider} for {s.idle_timeout_s:g}s (idle_timeout_s)"
            ) from None
        except httpx.TransportError as exc:
            what = f"connection to {s.provider} failed: {type(exc).__name__}: {exc}".rstrip(": ")
            if reader.emitted:
                raise TurnFailed("provider_disconnected", what) from None
            raise _Retryable(what) from None
        except httpx.DecodingError as exc:
            raise TurnFailed("provider_protocol_error", f"undecodable body: {exc}") from None
        if not reader.complete:
            what = f"the stream from {s.provider} ended before the response was complete"
            if reader.emitted:
                raise TurnFailed("provider_disconnected", what)
            raise _Retryable(what)
        return reader.step()

    async def _read_events(self, resp: httpx.Response, reader: _Reader) -> None:
        parser = _SSEParser()
        chunks = resp.aiter_bytes()
        async for chunk in chunks:
            for event, data in parser.feed(chunk):
                await reader.event(event, data)
                if reader.done:
                    await _drain(chunks)
                    return
        for event, data in parser.close():
            await reader.event(event, data)

    def serve(self, model: Any) -> None:
        """Report the model the provider says is serving (never the requested one)."""
        if isinstance(model, str) and model and model != self.served:
            self.served = model
            self.turn.serve(model, self.settings.provider, False)


#: What may follow a complete answer before the body ends (a chat stream's ``[DONE]``, the
#: chunked body's end), and how long it may take to come.
DRAIN_BYTES = 64 * 1024
DRAIN_S = 1.0


async def _drain(chunks: AsyncIterator[bytes]) -> None:
    """Read a complete answer's body to its end, so that its connection goes back to the
    client's pool for the next call; a provider that sends more, or holds the body open,
    costs that connection instead (it is closed, as a call cut off is)."""
    left = DRAIN_BYTES
    with trio.move_on_after(DRAIN_S):
        async for chunk in chunks:
            left -= len(chunk)
            if left < 0:
                return


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
