"""The ``scripted`` harness: deterministic turns from a script in the agent spec.

For tests, the demo agent and benchmarks. The format is ``docs/scripted-harness.md``::

    executor:
      harness: scripted
      script:
        turns:
          - - {text: "Let me check. "}
            - {tool: sys_os_shell, arguments: {command: "echo hi"}}
            - {elicit: {message: "May I deploy?"}}
            - {text: "Deployed.", on_decline: "Not deployed."}

Turn *i* of a session runs ``turns[i % len(turns)]``, where *i* counts the user messages in
the history the turn was given (so it survives worker restarts). Extra step kinds:
``{usage: {input_tokens, output_tokens}}`` sets the reported usage, ``{item: {...}}`` emits an
output item as is, ``{echo_history: true}`` streams the ``[role, text]`` pairs of the history
the turn was given, as JSON (for tests of history assembly), ``{echo_places: true}`` streams
the turn's ``{workdir, cli_home}`` as JSON (where a CLI harness would run), ``{gather: {tool,
marker, count, every_ms?, max_calls?, prefix?}}`` calls a tool until its outputs hold ``marker``
``count`` times and streams them merged (the demo ``team`` agent's wait for its
sub-agents), and ``{report: failed, code: C,
message: M}`` / ``{report: completed}`` stand for a relayed harness stream that reports its
end mid-turn (the turn goes on; the last report stands when it ends: D-19, D-21). A ``tool``
step with ``arguments_from_message: true`` takes its arguments from the turn's user message,
a JSON object (so a test can hand a script an id it learned at run time).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import trio

from ._turn import TurnContext, TurnFailed, Verdict

STEP_KINDS = (
    "text",
    "reasoning",
    "tool",
    "elicit",
    "fail",
    "crash",
    "hang",
    "serve",
    "status",
    "sleep_ms",
    "usage",
    "item",
    "echo_history",
    "echo_places",
    "report",
    "gather",
)


class ScriptError(ValueError):
    """The script in the agent spec is not valid; the message names the step."""


def script_turns(spec: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """The validated ``turns`` of a spec's script.

    Raises:
        ScriptError: naming the turn and step that is wrong.
    """
    executor = spec.get("executor") or {}
    script = executor.get("script", spec.get("script"))
    if not isinstance(script, dict) or not isinstance(script.get("turns"), list):
        raise ScriptError("executor.script.turns must be a list of turns")
    turns = script["turns"]
    if not turns:
        raise ScriptError("executor.script.turns is empty")
    for t, steps in enumerate(turns):
        if not isinstance(steps, list):
            raise ScriptError(f"turns[{t}] must be a list of steps")
        for s, step in enumerate(steps):
            where = f"turns[{t}][{s}]"
            if not isinstance(step, dict):
                raise ScriptError(f"{where} must be a mapping")
            kinds = [k for k in step if k in STEP_KINDS]
            if len(kinds) != 1:
                raise ScriptError(f"{where} needs exactly one of {', '.join(STEP_KINDS)}")
            _check_step(where, kinds[0], step)
    return turns


_FLAGS = ("hang", "echo_history", "echo_places")


def _check_step(where: str, kind: str, step: dict[str, Any]) -> None:
    value = step[kind]
    expect: dict[str, type | tuple[type, ...]] = {
        "text": str,
        "reasoning": str,
        "tool": str,
        "elicit": dict,
        "fail": dict,
        "crash": int,
        "hang": bool,
        "serve": dict,
        "status": str,
        "sleep_ms": (int, float),
        "usage": dict,
        "item": dict,
        "echo_history": bool,
        "echo_places": bool,
        "report": str,
        "gather": dict,
    }
    if not isinstance(value, expect[kind]) or isinstance(value, bool) != (kind in _FLAGS):
        raise ScriptError(f"{where}.{kind} has the wrong type ({type(value).__name__})")
    for key in ("repeat", "chunk", "delay_ms"):
        if key in step and (
            not isinstance(step[key], int) or step[key] < (0 if key == "delay_ms" else 1)
        ):
            raise ScriptError(f"{where}.{key} must be a positive integer")
    if kind == "report" and value not in ("failed", "completed"):
        raise ScriptError(f"{where}.report must be 'failed' or 'completed'")
    gather: dict[str, Any] = step.get("gather") or {}
    if kind == "gather" and not (
        isinstance(gather.get("tool"), str)
        and isinstance(gather.get("marker"), str)
        and isinstance(gather.get("count"), int)
        and gather["count"] >= 1
    ):
        raise ScriptError(f"{where}.gather needs tool, marker and a positive count")
    if kind == "tool" and not isinstance(step.get("arguments", {}), dict):
        raise ScriptError(f"{where}.arguments must be a mapping")
    if kind == "tool" and not isinstance(step.get("arguments_from_message", False), bool):
        raise ScriptError(f"{where}.arguments_from_message must be true or false")


def turn_index(message: dict[str, Any]) -> int:
    """Which turn of the session this is: the user messages in its history, minus one."""
    content = message.get("content")
    if isinstance(content, list):
        users = sum(
            1
            for item in content
            if isinstance(item, dict)
            and item.get("type", "message") == "message"
            and item.get("role") == "user"
        )
        return max(users - 1, 0)
    return 0


class ScriptedHarness:
    """Runs the script's steps as a turn."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options

    async def run_turn(self, turn: TurnContext) -> None:
        try:
            turns = script_turns(turn.spec)
        except ScriptError as exc:
            raise TurnFailed("invalid_script", str(exc)) from None
        steps = turns[turn_index(turn.message) % len(turns)]
        verdict: Verdict | None = None
        for step in steps:
            verdict = await self._step(turn, step, verdict)

    async def _step(
        self, turn: TurnContext, step: dict[str, Any], verdict: Verdict | None
    ) -> Verdict | None:
        if "text" in step:
            text = step["text"]
            if verdict is not None and not verdict.accepted and "on_decline" in step:
                text = step["on_decline"]
            await _stream(turn.text, text, step)
            return None
        if "reasoning" in step:
            await _stream(turn.reasoning, step["reasoning"], step)
        elif "tool" in step:
            arguments = step.get("arguments", {})
            if step.get("arguments_from_message"):
                arguments = _message_arguments(turn.message.get("content"))
            await turn.call_tool(step["tool"], arguments)
        elif "elicit" in step:
            return await turn.elicit(step["elicit"])
        elif "fail" in step:
            fail = step["fail"]
            raise TurnFailed(
                str(fail.get("code", "scripted_failure")), str(fail.get("message", ""))
            )
        elif "crash" in step:
            await turn.flush()
            os._exit(step["crash"])
        elif step.get("hang"):
            await turn.flush()
            # A hung process: the event loop blocks, so nothing runs — heartbeats included —
            # until someone kills it. (ZeroMQ's own thread still sends what was queued.)
            while True:
                time.sleep(3600)  # noqa: ASYNC251 - blocking the loop is the point
        elif "serve" in step:
            s = step["serve"]
            turn.serve(s.get("model"), s.get("provider"), bool(s.get("fallback", False)))
        elif "status" in step:
            await turn.status(step["status"])
        elif "sleep_ms" in step:
            await trio.sleep(step["sleep_ms"] / 1000)
        elif "usage" in step:
            turn.usage.update(step["usage"])
        elif "item" in step:
            await turn.item(step["item"])
        elif "report" in step:
            failure = (str(step.get("code", "scripted_failure")), str(step.get("message", "")))
            turn.report_end(failure if step["report"] == "failed" else None)
        elif "gather" in step:
            await _gather(turn, step)
        elif step.get("echo_history"):
            await turn.text(json.dumps(_history_texts(turn.message.get("content"))))
        elif step.get("echo_places"):
            places = {"workdir": str(turn.workdir), "cli_home": str(turn.cli_home)}
            await turn.text(json.dumps(places))
        return verdict


def _message_arguments(content: Any) -> dict[str, Any]:
    """The JSON object the turn's user message holds (``arguments_from_message``).

    Raises:
        TurnFailed: the message is not a JSON object.
    """
    texts = _history_texts(content)
    users = [text for role, text in texts if role == "user"]
    try:
        arguments = json.loads(users[-1]) if users else None
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):
        raise TurnFailed("invalid_script", "the user message is not a JSON object of arguments")
    return arguments


async def _gather(turn: TurnContext, step: dict[str, Any]) -> None:
    """Call the tool until its outputs hold ``marker`` ``count`` times (every ``every_ms``,
    at most ``max_calls`` calls), then stream ``prefix`` and those outputs as one text: a
    scripted parent that waits for its sub-agents' answers in its inbox and merges them."""
    g = step["gather"]
    found: list[str] = []
    for call in range(int(g.get("max_calls", 100))):
        if sum(o.count(g["marker"]) for o in found) >= g["count"]:
            break
        if call:
            await trio.sleep(g.get("every_ms", 200) / 1000)
        output = await turn.call_tool(g["tool"], g.get("arguments", {}))
        if g["marker"] in output:
            found.append(output)
    await _stream(turn.text, str(g.get("prefix", "")) + "\n\n".join(found), step)


def _history_texts(content: Any) -> list[list[str]]:
    """``[role, text]`` per history item, for tests that check what a turn was given."""
    out = []
    for item in content if isinstance(content, list) else []:
        if isinstance(item, dict):
            blocks = v if isinstance(v := item.get("content"), list) else []
            text = "".join(b.get("text", "") for b in blocks if isinstance(b, dict))
            out.append([str(item.get("role")), text])
    return out


async def _stream(emit: Any, text: str, step: dict[str, Any]) -> None:
    chunk = step.get("chunk")
    pieces = [text[i : i + chunk] for i in range(0, len(text), chunk)] if chunk else [text]
    delay = step.get("delay_ms", 0) / 1000
    first = True
    for _ in range(step.get("repeat", 1)):
        for piece in pieces:
            if delay and not first:
                await trio.sleep(delay)
            first = False
            await emit(piece)
