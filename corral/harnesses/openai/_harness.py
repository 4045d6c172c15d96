"""The ``openai`` worker kind itself, and what its LLM-request policy check is shown."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import httpx
import trio

from ..._jsonlines import JsonObject
from ..._tls import default_context
from .._llm_request import LlmRequestData, llm_request
from .._turn import TurnFailed
from ..spawn_env import env_prefix
from ._conversations import _history
from ._loop import _AgentLoop
from ._settings import DEFAULT_BASE_URL, Settings, resolve_settings

if TYPE_CHECKING:
    from .._turn import TurnContext


class OpenAIHarness:
    """The ``openai`` worker kind (also serves ``openai-agents`` and ``open-responses``).

    Args:
        options: worker options from the harness actor; the same keys as ``executor``.
        environ: where the ``HARNESS_*`` variables are read; ``os.environ`` by default.
    """

    def __init__(
        self, options: JsonObject | None = None, *, environ: Mapping[str, str] | None = None
    ) -> None:
        self.options = dict(options or {})
        self.environ = os.environ if environ is None else environ
        self._client: httpx.AsyncClient | None = None

    def client(self) -> httpx.AsyncClient:
        """The worker's one HTTP client, made at its first turn: every later turn reuses its
        open connections to the provider, as an SDK client kept by a long-lived process does
        (its TLS setup is the process's, :mod:`corral._tls`). An interrupted or failed call's
        connection is closed, never reused."""
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=None, verify=default_context())
        return self._client

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
            await _AgentLoop(settings, self.client(), turn).run()
        if watchdog.cancelled_caught:
            raise TurnFailed("timeout", f"the turn took longer than {limit:g}s (turn_timeout_s)")


def llm_request_data(
    settings: Settings, message: Mapping[str, Any], spec: Mapping[str, Any]
) -> LlmRequestData:
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
    return llm_request(
        model=settings.model,
        messages=len(history),
        tools=sum(1 for t in message.get("tools") or [] if isinstance(t, dict)),
        instructions=str(instructions),
        last_user_message=last_user,
    )
