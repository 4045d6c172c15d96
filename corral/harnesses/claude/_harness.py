"""The ``claude-sdk`` worker kind: a turn is one user message to the worker's Claude Code."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import trio

from ... import clis
from ..._jsonlines import JsonObject
from .._llm_request import LlmRequestData, llm_request
from .._turn import TurnContext, TurnFailed
from ._relay import Relay
from ._session import ClaudeSession, collapsed, deadline, load_state, resumable, start
from ._settings import Settings, argv, cli_env, resolve

KIND = "claude-sdk"
CLI = "claude"


class ClaudeHarness:
    """Claude Code driven through its stream-json mode (docs/harnesses.md, *claude-sdk*).

    Args:
        options: worker options from the harness actor; the same keys as ``executor``.
        environ: where the ``HARNESS_*`` variables and ``CORRAL_CLI_PATH`` are read;
            ``os.environ`` by default.
    """

    def __init__(
        self, options: JsonObject | None = None, *, environ: Mapping[str, str] | None = None
    ) -> None:
        self.options = dict(options or {})
        self.environ = os.environ if environ is None else environ
        self.session: ClaudeSession | None = None

    async def run_turn(self, turn: TurnContext) -> None:
        start_ = turn.start
        executor = turn.spec.get("executor") or {}
        harness = start_.harness or start_.harness_override or executor.get("harness") or KIND
        cli = clis.find(CLI, self.environ)
        if cli is None:
            package = clis.CLIS[CLI]
            raise TurnFailed(
                "harness_unavailable",
                f"harness {harness!r} needs the {CLI!r} CLI on PATH, which was not found. "
                f"Install it with: {package.install}",
            )
        settings = resolve(
            turn.spec,
            turn.message,
            self.options,
            self.environ,
            harness=harness,
            model_override=start_.model_override,
        )
        history = _messages(turn.message)
        if not history or history[-1].get("role") != "user":
            raise TurnFailed("invalid_message", "the turn's history ends with no user message")
        home = turn.cli_home
        session, seed = await self._session(turn, cli, settings, home, len(history) > 1)
        relay = Relay(turn, session, settings, home)
        try:
            with collapsed():
                async with trio.open_nursery() as handlers:
                    relay.handlers = handlers
                    # The policy question and the CLI's start at once: the start is most of a
                    # new session's first turn. The question comes before the turn's
                    # watchdog: the server may hold it until a person answers.
                    async with trio.open_nursery() as first:
                        first.start_soon(
                            turn.check_llm_request, _llm_request_data(settings, history)
                        )
                        if session.fresh:
                            first.start_soon(relay.control, "initialize")
                    session.fresh = False
                    await self._relay(relay, _content(history, seed), settings.turn_timeout_s)
                    handlers.cancel_scope.cancel()
        except BaseException:
            if not relay.settled:
                # Whatever state it was left in, the next turn starts it again (and resumes).
                session.stop()
            raise

    async def _session(
        self, turn: TurnContext, cli: str, settings: Settings, home: Path, seeds: bool
    ) -> tuple[ClaudeSession, bool]:
        """The worker's Claude Code for ``settings``, started (resuming the session's
        conversation) unless it runs; and whether the turn must seed the conversation."""
        session = self.session
        if session is not None and session.alive and session.key == settings.key:
            return session, False
        if session is not None:
            session.stop()
        resume = resumable(home, await trio.to_thread.run_sync(load_state, home))
        self.session = await start(
            turn.services,
            argv(cli, settings, resume=resume),
            cli_env(cli, settings, home, self.environ),
            turn.workdir,
            settings,
        )
        return self.session, resume is None and seeds

    @staticmethod
    async def _relay(relay: Relay, content: list[dict[str, Any]], limit: float) -> None:
        """The turn's message relayed, within ``limit`` seconds; an interrupt (or the limit)
        ends Claude Code's turn through its own control request."""
        with trio.move_on_at(deadline(limit)) as watchdog:
            try:
                await relay.run(content)
            except trio.Cancelled:
                with trio.CancelScope(shield=True):
                    await relay.interrupt()
                raise
        if watchdog.cancelled_caught:
            raise TurnFailed("timeout", f"the turn took longer than {limit:g}s (turn_timeout_s)")


def _messages(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The history's messages (the turn's own last), each ``{role, text, images}``."""
    out = []
    for item in message.get("content") or []:
        if not isinstance(item, dict) or item.get("type", "message") != "message":
            continue
        role = item.get("role")
        if role not in ("user", "assistant"):
            continue
        parts = item.get("content")
        parts = [{"type": "input_text", "text": parts}] if isinstance(parts, str) else parts or []
        texts = [
            str(p.get("text") or "")
            for p in parts
            if isinstance(p, dict) and p.get("type") in ("input_text", "output_text", "text")
        ]
        images = [_image(p) for p in parts if isinstance(p, dict)]
        out.append({"role": role, "text": "\n".join(texts), "images": [i for i in images if i]})
    return out


def _image(part: dict[str, Any]) -> dict[str, Any] | None:
    """An ``input_image`` with a ``data:`` URL as a Messages API image block."""
    if part.get("type") != "input_image":
        return None
    url = part.get("image_url")
    url = url.get("url") if isinstance(url, dict) else url
    if not isinstance(url, str) or not url.startswith("data:") or ";base64," not in url:
        return None
    media_type, _, data = url.removeprefix("data:").partition(";base64,")
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}


def _content(history: list[dict[str, Any]], seed: bool) -> list[dict[str, Any]]:
    """The user message's content blocks; seeded with the earlier conversation when Claude
    Code starts a session without it (its own could not be resumed)."""
    last = history[-1]
    text = last["text"]
    if seed:
        lines = [f"{m['role'].capitalize()}: {m['text']}" for m in history[:-1] if m["text"]]
        text = (
            "The conversation so far (carried over; your own session of it was lost):\n\n"
            + "\n\n".join(lines)
            + "\n\nThe user's new message:\n\n"
            + text
        )
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    return [*blocks, *last["images"]] or [{"type": "text", "text": ""}]


def _llm_request_data(settings: Settings, history: list[dict[str, Any]]) -> LlmRequestData:
    """The ``PHASE_LLM_REQUEST`` data (PROTOCOL_0_19 §F.4) of the turn's first model call."""
    return llm_request(
        model=settings.model or "",
        messages=len(history),
        tools=len(settings.tools),
        instructions=settings.instructions,
        last_user_message=history[-1]["text"],
    )
