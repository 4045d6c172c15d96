"""The ``openai`` worker kind against a fake OpenAI-compatible server on 127.0.0.1.

``run_turn`` is driven directly with a :class:`FakeTurn` that records what the worker emits
and answers tool calls, so no bus is involved. Every wait has a deadline; nothing sleeps to
synchronise.
"""

from __future__ import annotations

import base64
import json
from types import SimpleNamespace
from typing import Any

import httpx
import msgspec
import pytest
import trio

from corral.harnesses._turn import TurnContext, TurnFailed, Verdict
from corral.harnesses.openai import OpenAIHarness, resolve_settings
from corral.harnesses.protocol import (
    ElicitationRequest,
    PolicyDenied,
    PolicyEvaluationRequested,
    PolicyVerdict,
    TurnStart,
    to_json,
)
from tests.fake_openai import (
    FakeOpenAI,
    Reply,
    chat_events,
    error,
    responses_events,
    sse,
)

KEY = "sk-secret-123"
SERVED = "gpt-served-2026"
TOOL = {
    "type": "function",
    "function": {
        "name": "sys_os_shell",
        "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
    },
}


class FakeTurn:
    """Stands in for :class:`TurnContext`: records emitted events in order."""

    def __init__(self, spec: dict[str, Any], message: dict[str, Any] | None = None) -> None:
        self.spec = spec
        self.message = message or {
            "type": "message",
            "role": "user",
            "model": "agent-name",
            "content": [
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "hi"}],
                }
            ],
            "instructions": "terse",
            "tools": [TOOL],
        }
        self.start = SimpleNamespace(model_override=None, harness=None, harness_override=None)
        self.events: list[tuple[Any, ...]] = []
        self.usage: dict[str, Any] = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
        self.on_text: Any = None
        #: What the PHASE_LLM_REQUEST gate does: None lets the turn go on, else it raises.
        self.llm_gate: TurnFailed | None = None

    def kinds(self, kind: str) -> list[tuple[Any, ...]]:
        return [e for e in self.events if e[0] == kind]

    @property
    def text_out(self) -> str:
        return "".join(e[1] for e in self.kinds("text"))

    async def text(self, delta: str) -> None:
        self.events.append(("text", delta))
        if self.on_text is not None:
            self.on_text()

    async def reasoning(self, delta: str) -> None:
        self.events.append(("reasoning", delta))

    def serve(self, model: str | None, provider: str | None, fallback_active: bool = False) -> None:
        self.events.append(("serve", model, provider, fallback_active))

    async def status(self, text: str) -> None:
        self.events.append(("status", text))

    async def retry(self, attempt: int, max_attempts: int, delay_s: float, reason: str) -> None:
        self.events.append(("retry", attempt, max_attempts, delay_s, reason))

    async def item(self, item: dict[str, Any]) -> None:
        self.events.append(("item", item))

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        self.events.append(("call_tool", name, arguments))
        return f"output of {name}"

    async def check_llm_request(self, data: dict[str, Any]) -> None:
        self.events.append(("llm_request", data))
        if self.llm_gate is not None:
            raise self.llm_gate


def spec_for(server: FakeOpenAI, harness: str = "openai-agents", **executor: Any) -> dict:
    auth = {"type": "api_key", "api_key": KEY, "base_url": server.base_url}
    base = {"harness": harness, "model": "gpt-requested", "auth": auth, "backoff_base_s": 0.01}
    return {
        "name": "agent",
        "prompt": "terse",
        "executor": {**base, "idle_timeout_s": 5, **executor},
    }


async def run(turn: FakeTurn, timeout: float = 5.0) -> None:
    with trio.fail_after(timeout):
        await OpenAIHarness({}, environ={}).run_turn(turn)


async def failure(turn: FakeTurn, timeout: float = 5.0) -> TurnFailed:
    with pytest.raises(TurnFailed) as info:
        await run(turn, timeout)
    return info.value


@pytest.fixture
async def server(nursery: trio.Nursery) -> FakeOpenAI:
    fake = FakeOpenAI()
    await fake.start(nursery)
    return fake


# --- streaming --------------------------------------------------------------------------------


async def test_responses_streams_deltas_after_reporting_the_serving_model(server) -> None:
    frames = responses_events(SERVED, ["Hel", "lo"], usage=(12, 3))
    # Harmless lines are skipped: a keep-alive comment and an event type we do not know.
    frames[1:1] = [b": keep-alive\n\n", sse({"type": "response.content_part.added"})]
    server.queue(Reply(frames=frames))
    turn = FakeTurn(spec_for(server))

    await run(turn)

    assert turn.text_out == "Hello"
    kinds = [e[0] for e in turn.events]
    assert kinds.index("serve") < kinds.index("text")
    assert turn.kinds("serve") == [("serve", SERVED, "127.0.0.1", False)]
    # E.1: the server persists the deltas as the assistant message; an item would be a copy.
    assert turn.kinds("item") == []
    assert turn.usage == {
        "input_tokens": 12,
        "output_tokens": 3,
        "total_tokens": 15,
        "context_tokens": 15,
        "model": SERVED,
    }
    [request] = server.requests
    assert request.path == "/v1/responses"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.json["model"] == "gpt-requested"
    assert request.json["stream"] is True
    assert request.json["instructions"] == "terse"
    assert request.json["input"] == [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    ]
    assert request.json["tools"] == [{"type": "function", **TOOL["function"]}]


async def test_chat_streams_deltas_and_usage(server) -> None:
    server.queue(Reply(frames=chat_events(SERVED, ["Hel", "lo"], usage=(7, 2))))
    turn = FakeTurn(spec_for(server, harness="openai"))

    await run(turn)

    assert turn.text_out == "Hello"
    kinds = [e[0] for e in turn.events]
    assert kinds.index("serve") < kinds.index("text")
    assert turn.kinds("serve") == [("serve", SERVED, "127.0.0.1", False)]
    assert turn.usage == {
        "input_tokens": 7,
        "output_tokens": 2,
        "total_tokens": 9,
        "context_tokens": 9,
        "model": SERVED,
    }
    [request] = server.requests
    assert request.path == "/v1/chat/completions"
    assert request.json["stream_options"] == {"include_usage": True}
    assert request.json["messages"] == [
        {"role": "system", "content": "terse"},
        {"role": "user", "content": "hi"},
    ]
    assert request.json["tools"] == [TOOL]


async def test_chat_answer_sent_whole_as_json_is_accepted(server) -> None:
    completion = {
        "model": SERVED,
        "choices": [{"index": 0, "message": {"content": "whole"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
    server.queue(Reply(body=json.dumps(completion).encode()))
    turn = FakeTurn(spec_for(server, harness="openai", api="chat"))

    await run(turn)

    assert turn.text_out == "whole"
    assert turn.usage["total_tokens"] == 2


async def test_a_chat_stream_may_end_after_its_finish_reason_without_done(server) -> None:
    frames = chat_events(SERVED, ["fine"])
    assert frames[-1] == b"data: [DONE]\n\n"
    server.queue(Reply(frames=frames[:-1]))
    turn = FakeTurn(spec_for(server, harness="openai"))

    await run(turn)

    assert turn.text_out == "fine"
    assert len(server.requests) == 1


# --- tool calls -------------------------------------------------------------------------------


async def test_responses_tool_call_then_final_answer(server) -> None:
    args = json.dumps({"command": "echo hi"})
    server.queue(
        Reply(frames=responses_events(SERVED, calls=[("call_1", "sys_os_shell", args)])),
        Reply(frames=responses_events(SERVED, ["done"])),
    )
    turn = FakeTurn(spec_for(server))

    await run(turn)

    assert turn.kinds("call_tool") == [("call_tool", "sys_os_shell", {"command": "echo hi"})]
    assert turn.text_out == "done"
    assert turn.usage["total_tokens"] == 30
    second = server.requests[1].json["input"]
    assert second[1] == {
        "type": "function_call",
        "id": "fc_call_1",
        "call_id": "call_1",
        "name": "sys_os_shell",
        "arguments": args,
        "status": "completed",
    }
    assert second[2] == {
        "type": "function_call_output",
        "call_id": "call_1",
        "output": "output of sys_os_shell",
    }


async def test_chat_parallel_tool_calls_then_final_answer(server) -> None:
    calls = [("call_a", "sys_os_shell", '{"command": "ls"}'), ("call_b", "load_skill", "{}")]
    server.queue(
        Reply(frames=chat_events(SERVED, ["let me look"], calls=calls)),
        Reply(frames=chat_events(SERVED, ["done"])),
    )
    turn = FakeTurn(spec_for(server, harness="openai", api="chat"))

    await run(turn)

    assert [e[1:] for e in turn.kinds("call_tool")] == [
        ("sys_os_shell", {"command": "ls"}),
        ("load_skill", {}),
    ]
    assert turn.text_out == "let me lookdone"
    messages = server.requests[1].json["messages"]
    assert messages[2] == {
        "role": "assistant",
        "content": "let me look",
        "tool_calls": [
            {
                "id": "call_a",
                "type": "function",
                "function": {"name": "sys_os_shell", "arguments": '{"command": "ls"}'},
            },
            {
                "id": "call_b",
                "type": "function",
                "function": {"name": "load_skill", "arguments": "{}"},
            },
        ],
    }
    assert messages[3:] == [
        {"role": "tool", "tool_call_id": "call_a", "content": "output of sys_os_shell"},
        {"role": "tool", "tool_call_id": "call_b", "content": "output of load_skill"},
    ]


async def test_arguments_that_are_not_json_go_back_to_the_model(server) -> None:
    server.queue(
        Reply(frames=responses_events(SERVED, calls=[("call_1", "sys_os_shell", "{oops")])),
        Reply(frames=responses_events(SERVED, ["sorry"])),
    )
    turn = FakeTurn(spec_for(server))

    await run(turn)

    assert turn.kinds("call_tool") == []
    output = server.requests[1].json["input"][2]
    assert output["type"] == "function_call_output"
    assert output["output"].startswith("error: the arguments of sys_os_shell are not valid JSON")


async def test_tool_calls_stop_at_max_steps(server) -> None:
    for n in range(2):
        server.queue(Reply(frames=responses_events(SERVED, calls=[(f"c{n}", "load_skill", "{}")])))
    turn = FakeTurn(spec_for(server, max_steps=2))

    exc = await failure(turn)

    assert exc.code == "max_steps"
    assert exc.message == "the model was still calling tools after 2 steps (max_steps)"
    assert len(server.requests) == 2


# --- provider failures ------------------------------------------------------------------------


async def test_429_then_success_honours_retry_after(server) -> None:
    # With backoff_base_s=30 only retry-after (0.2 s) lets the turn finish inside the deadline.
    server.queue(error(429, "slow down", **{"retry-after": "0.2"}))
    server.queue(Reply(frames=responses_events(SERVED, ["ok"])))
    turn = FakeTurn(spec_for(server, backoff_base_s=30))

    await run(turn, timeout=3)

    assert turn.text_out == "ok"
    first, second = server.requests
    assert second.received_at - first.received_at >= 0.19
    # The turn says it waits, and for what: attempt 2 of 5, in the provider's 0.2 s.
    assert turn.kinds("retry") == [("retry", 2, 5, 0.2, "127.0.0.1 returned HTTP 429: slow down")]


async def test_500_until_attempts_run_out_fails_the_turn(server) -> None:
    server.queue(*[error(500, "upstream exploded") for _ in range(3)])
    turn = FakeTurn(spec_for(server, max_attempts=3))

    exc = await failure(turn)

    assert exc.code == "provider_unavailable"
    assert exc.message == (
        "127.0.0.1 returned HTTP 500: upstream exploded; gave up after 3 attempts"
    )
    assert len(server.requests) == 3
    assert turn.kinds("serve") == []


async def test_401_fails_at_once_without_the_key(server) -> None:
    server.queue(error(401, f"Incorrect API key provided: {KEY}."))
    turn = FakeTurn(spec_for(server))

    exc = await failure(turn)

    assert exc.code == "provider_error"
    assert exc.message == "127.0.0.1 returned HTTP 401: Incorrect API key provided: [redacted]."
    assert KEY not in exc.message
    assert len(server.requests) == 1


async def test_a_malformed_chunk_fails_the_turn(server) -> None:
    frames = responses_events(SERVED, ["a", "b"])
    frames.insert(2, b"data: {not json\n\n")
    server.queue(Reply(frames=frames))
    turn = FakeTurn(spec_for(server))

    exc = await failure(turn)

    assert exc.code == "provider_protocol_error"
    assert exc.message == "not a JSON object: '{not json'"
    assert turn.text_out == "a"


async def test_a_failed_response_event_fails_the_turn(server) -> None:
    failed = {"type": "response.failed", "response": {"error": {"message": "model overloaded"}}}
    server.queue(Reply(frames=[*responses_events(SERVED)[:1], sse(failed)]))
    turn = FakeTurn(spec_for(server))

    exc = await failure(turn)

    assert (exc.code, exc.message) == ("provider_error", "model overloaded")


async def test_a_disconnect_before_any_output_is_retried(server) -> None:
    server.queue(Reply(frames=responses_events(SERVED, ["lost"]), drop_after=1))
    server.queue(Reply(frames=responses_events(SERVED, ["ok"])))
    turn = FakeTurn(spec_for(server))

    await run(turn)

    assert turn.text_out == "ok"
    assert len(server.requests) == 2


async def test_a_disconnect_after_output_fails_the_turn(server) -> None:
    server.queue(Reply(frames=chat_events(SERVED, ["w0 ", "w1 ", "w2 "]), drop_after=3))
    turn = FakeTurn(spec_for(server, harness="openai", api="chat"))

    exc = await failure(turn)

    assert exc.code == "provider_disconnected"
    assert exc.message.startswith("connection to 127.0.0.1 failed: RemoteProtocolError")
    assert turn.text_out == "w0 w1 "
    assert len(server.requests) == 1


# --- watchdogs and interrupts -----------------------------------------------------------------


async def test_idle_watchdog_fails_a_silent_stream(server) -> None:
    server.queue(Reply(frames=responses_events(SERVED, ["a", "b"]), hang_after=2))
    turn = FakeTurn(spec_for(server, idle_timeout_s=0.3))

    exc = await failure(turn, timeout=3)

    assert exc.code == "timeout"
    assert exc.message == "no data from 127.0.0.1 for 0.3s (idle_timeout_s)"
    with trio.fail_after(2):
        await server.requests[0].closed.wait()


async def test_turn_watchdog_fails_a_stream_that_trickles_forever(server) -> None:
    # A frame every 50 ms keeps the idle watchdog (3 s) quiet; the turn watchdog still fires,
    # long after the first frames (1.5 s: a loaded machine is slow to deliver the first).
    deltas = [f"w{n} " for n in range(200)]
    server.queue(Reply(frames=responses_events(SERVED, deltas), pace_s=0.05))
    turn = FakeTurn(spec_for(server, idle_timeout_s=3, turn_timeout_s=1.5))

    exc = await failure(turn, timeout=6)

    assert exc.code == "timeout"
    assert exc.message == "the turn took longer than 1.5s (turn_timeout_s)"
    assert 0 < len(turn.kinds("text")) < 200


async def test_interrupt_closes_the_http_stream(server) -> None:
    server.queue(Reply(frames=responses_events(SERVED, ["a", "b", "c"]), hang_after=3))
    turn = FakeTurn(spec_for(server))
    streamed = trio.Event()
    turn.on_text = lambda: streamed.set() if turn.text_out == "ab" else None

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(OpenAIHarness({}, environ={}).run_turn, turn)
            await streamed.wait()
            assert not server.requests[0].closed.is_set()
            nursery.cancel_scope.cancel()
        await server.requests[0].closed.wait()

    assert turn.text_out == "ab"


async def test_a_workers_turns_share_one_connection_and_an_interrupted_call_is_not_reused(
    server,
) -> None:
    """One harness per worker: its turns reuse the client's TLS setup and its open connection
    to the provider; a call cut off mid-stream closes its connection, and the next turn opens
    another rather than read the cut call's leftovers."""
    harness = OpenAIHarness({}, environ={})
    server.queue(
        Reply(frames=responses_events(SERVED, ["one"])),
        Reply(frames=responses_events(SERVED, ["two"])),
        Reply(frames=responses_events(SERVED, ["a", "b", "c"]), hang_after=2),
        Reply(frames=responses_events(SERVED, ["four"])),
    )
    first, second = FakeTurn(spec_for(server)), FakeTurn(spec_for(server))
    with trio.fail_after(5):
        await harness.run_turn(first)
        await harness.run_turn(second)
    assert (first.text_out, second.text_out) == ("one", "two")
    assert [r.connection for r in server.requests] == [1, 1]

    cut = FakeTurn(spec_for(server))
    streamed = trio.Event()
    cut.on_text = lambda: streamed.set() if cut.text_out == "a" else None
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(harness.run_turn, cut)
            await streamed.wait()
            nursery.cancel_scope.cancel()
        await server.requests[2].closed.wait()
        last = FakeTurn(spec_for(server))
        await harness.run_turn(last)
    assert last.text_out == "four"
    assert [r.connection for r in server.requests] == [1, 1, 1, 2]


def test_the_workers_zygote_builds_the_tls_context_that_every_workers_client_uses(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    """Loading the CA bundle costs ~17 ms of CPU: the harness actor's zygote does it once
    (a preload item) for every worker it forks, whose client then builds none; a worker
    whose environment names other CA files builds its own."""
    from corral import _tls
    from corral._zygote._template import preload
    from corral.actors.harness._base import worker_preload

    item = "corral._tls:DEFAULT_CONTEXT"
    assert item in worker_preload()
    real, built = httpx.create_ssl_context, []
    monkeypatch.setattr(httpx, "create_ssl_context", lambda: built.append(1) or real())
    monkeypatch.setattr(_tls, "_contexts", {})
    for name in ("SSL_CERT_FILE", "SSL_CERT_DIR"):
        monkeypatch.delenv(name, raising=False)

    preload(item)  # in the zygote
    assert len(built) == 1
    OpenAIHarness({}, environ={}).client()
    OpenAIHarness({}, environ={}).client()
    assert len(built) == 1

    monkeypatch.setenv("SSL_CERT_DIR", str(tmp_path))
    OpenAIHarness({}, environ={}).client()
    assert len(built) == 2


# --- settings ---------------------------------------------------------------------------------


def test_settings_come_from_the_spec_first() -> None:
    spec = {
        "executor": {
            "harness": "openai-agents",
            "model": "m-spec",
            "auth": {"type": "api_key", "api_key": "k-spec", "base_url": "http://h:1/v1/"},
        }
    }
    env = {"HARNESS_OPENAI_AGENTS_MODEL": "m-env", "HARNESS_OPENAI_AGENTS_API_KEY": "k-env"}

    s = resolve_settings(spec, {}, env)

    assert (s.api, s.model, s.api_key, s.base_url) == (
        "responses",
        "m-spec",
        "k-spec",
        "http://h:1/v1",
    )
    assert s.provider == "h"
    assert "k-spec" not in repr(s)
    assert resolve_settings(spec, {}, env, model_override="m-override").model == "m-override"


def test_settings_fall_back_to_the_environment() -> None:
    env = {
        "HARNESS_OPENAI_AGENTS_MODEL": "m-env",
        "HARNESS_OPENAI_AGENTS_API_KEY": "k-env",
        "HARNESS_OPENAI_AGENTS_GATEWAY_BASE_URL": "https://gw.example/v1",
    }

    s = resolve_settings({"executor": {"harness": "open-responses"}}, {}, env)

    assert (s.api, s.model, s.api_key) == ("responses", "m-env", "k-env")
    assert s.base_url == "https://gw.example/v1"
    plain = resolve_settings({}, {}, {"HARNESS_OPENAI_MODEL": "m"})
    assert (plain.harness, plain.api, plain.base_url) == (
        "openai",
        "chat",
        "https://api.openai.com/v1",
    )
    assert plain.provider == "openai"
    assert plain.api_key is None
    assert (
        resolve_settings({}, {"api": "responses"}, {"HARNESS_OPENAI_MODEL": "m"}).api == "responses"
    )


@pytest.mark.parametrize(
    ("executor", "message"),
    [
        ({}, "no model: set executor.model or HARNESS_OPENAI_MODEL"),
        ({"model": "m", "api": "soap"}, "executor.api must be 'responses' or 'chat', got 'soap'"),
        ({"model": "m", "max_steps": 0}, "max_steps must be an integer >= 1, got 0"),
        ({"model": "m", "idle_timeout_s": "1"}, "idle_timeout_s must be a number >= 0, got '1'"),
    ],
)
def test_bad_settings_are_config_errors(executor: dict, message: str) -> None:
    with pytest.raises(TurnFailed) as info:
        resolve_settings({"executor": executor}, {}, {})
    assert (info.value.code, info.value.message) == ("config_error", message)


def test_a_key_reference_is_read_from_the_worker_environment() -> None:
    spec = {"executor": {"harness": "openai-agents", "model": "m", "auth": {"api_key": "$MY_KEY"}}}

    s = resolve_settings(spec, {}, {"HARNESS_OPENAI_AGENTS_API_KEY": "k-expanded"})

    assert s.api_key == "k-expanded"
    with pytest.raises(TurnFailed) as info:
        resolve_settings(spec, {}, {})
    assert (info.value.code, info.value.message) == (
        "config_error",
        "the api key $MY_KEY is not set",
    )


# --- with the real TurnContext ----------------------------------------------------------------


class _Worker:
    """Just enough of :class:`Worker` for a :class:`TurnContext` to emit into; it answers a
    policy evaluation with ``verdict`` and an elicitation with ``answer``, as the runner
    would, and notes how many model calls the provider had seen at each evaluation."""

    def __init__(self, server: FakeOpenAI, verdict: PolicyVerdict | None = None) -> None:
        self.server = server
        self.sent: list[Any] = []
        self.turn: TurnContext | None = None
        self.verdict = verdict or PolicyVerdict(
            session_id="s1", evaluation_id="", action="POLICY_ACTION_ALLOW"
        )
        self.answer = Verdict("accept")
        self.calls_at_evaluation: list[int] = []

    async def send_output(self, reply_to: str, event: Any, *, durable: bool = False) -> None:
        self.sent.append(event)
        assert self.turn is not None
        if isinstance(event, PolicyEvaluationRequested):
            self.calls_at_evaluation.append(len(self.server.requests))
            verdict = msgspec.structs.replace(self.verdict, evaluation_id=event.evaluation_id)
            assert self.turn.resolve(f"policy:{event.evaluation_id}", verdict)
        elif isinstance(event, ElicitationRequest):
            assert self.turn.resolve(f"elicit:{event.elicitation_id}", self.answer)

    async def park(self, turn: TurnContext, elicitation_id: str, params: dict) -> None:
        pass


def _real_turn(worker: _Worker, fake: FakeTurn) -> TurnContext:
    start = TurnStart(session_id="s1", turn_id="t1", spec=fake.spec, message=fake.message)
    turn = TurnContext(worker, start)  # type: ignore[arg-type]
    worker.turn = turn
    return turn


def _verdict(action: str, reason: str | None = None, failed: bool = False) -> PolicyVerdict:
    return PolicyVerdict(
        session_id="s1",
        evaluation_id="",
        action=f"POLICY_ACTION_{action}",
        reason=reason,
        failed=failed,
    )


async def test_the_runtime_observes_the_serving_model_before_the_text(server) -> None:
    server.queue(Reply(frames=responses_events(SERVED, ["Hel", "lo"])))
    fake = FakeTurn(spec_for(server))
    worker = _Worker(server)
    turn = _real_turn(worker, fake)

    with trio.fail_after(5):
        await OpenAIHarness({}, environ={}).run_turn(turn)

    kinds = [type(e).__name__ for e in worker.sent]
    assert kinds == [
        "PolicyEvaluationRequested",
        "RuntimeModel",
        "OutputTextDelta",
        "OutputTextDelta",
    ]
    observed = worker.sent[1]
    assert (observed.model, observed.provider, observed.fallback_active) == (
        SERVED,
        "127.0.0.1",
        False,
    )
    assert [e.sequence_number for e in worker.sent] == [0, 1, 2, 3]
    assert turn.usage == {
        "input_tokens": 10,
        "output_tokens": 5,
        "total_tokens": 15,
        "context_tokens": 15,
        "model": SERVED,
    }


async def test_llm_request_is_evaluated_once_before_the_first_model_call(server) -> None:
    args = json.dumps({"command": "ls"})
    server.queue(
        Reply(frames=responses_events(SERVED, calls=[("call_1", "sys_os_shell", args)])),
        Reply(frames=responses_events(SERVED, ["done"], usage=(40, 2))),
    )
    fake = FakeTurn(spec_for(server))
    fake.message["instructions"] = "x" * 300
    fake.message["content"].insert(
        0, {"type": "message", "role": "assistant", "content": [{"type": "output_text"}]}
    )
    fake.message["content"][-1]["content"].append({"type": "input_text", "text": "there"})
    worker = _Worker(server)
    turn = _real_turn(worker, fake)

    async def answer_tools() -> None:
        while True:
            for event in worker.sent:
                item = getattr(event, "item", {})
                if item.get("status") == "action_required":
                    turn.resolve(f"tool:{item['call_id']}", "files")
            await trio.sleep(0.01)

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(answer_tools)
            await OpenAIHarness({}, environ={}).run_turn(turn)
            nursery.cancel_scope.cancel()

    [request] = [e for e in worker.sent if isinstance(e, PolicyEvaluationRequested)]
    assert request.phase == "PHASE_LLM_REQUEST"
    assert request.data == {
        "model": "gpt-requested",
        "messages_count": 2,
        "tools_count": 1,
        "system_prompt_preview": "x" * 200,
        "last_user_message": "hi there",
    }
    assert worker.calls_at_evaluation == [0], "asked before the first model call, and only then"
    assert len(server.requests) == 2
    # Tokens add up over the turn's calls; the context is what the last call held.
    assert turn.usage == {
        "input_tokens": 50,
        "output_tokens": 7,
        "total_tokens": 57,
        "context_tokens": 42,
        "model": SERVED,
    }


async def test_a_denied_llm_request_fails_the_turn_before_any_model_call(server) -> None:
    fake = FakeTurn(spec_for(server))
    worker = _Worker(server, _verdict("DENY", "over budget"))
    turn = _real_turn(worker, fake)

    with trio.fail_after(5), pytest.raises(TurnFailed) as info:
        await OpenAIHarness({}, environ={}).run_turn(turn)

    assert (info.value.code, info.value.message) == (
        "policy_denied",
        "the model call was denied by policy: over budget",
    )
    assert server.requests == []
    denied = [e for e in worker.sent if isinstance(e, PolicyDenied)]
    assert [(d.conversation_id, d.reason, d.phase) for d in denied] == [
        ("s1", "over budget", "llm_request")
    ]
    assert msgspec.json.decode(to_json(denied[0]))["type"] == "response.policy_denied"


async def test_p03_a_failed_llm_request_evaluation_fails_the_turn_closed(server) -> None:
    fake = FakeTurn(spec_for(server))
    reason = "the policy check failed, so the model was not called"
    worker = _Worker(server, _verdict("DENY", reason, failed=True))
    turn = _real_turn(worker, fake)

    with trio.fail_after(5), pytest.raises(TurnFailed) as info:
        await OpenAIHarness({}, environ={}).run_turn(turn)

    assert (info.value.code, info.value.message) == (
        "policy_unavailable",
        f"the policy check before the model call failed: {reason}",
    )
    assert server.requests == []
    assert not any(isinstance(e, PolicyDenied) for e in worker.sent)


@pytest.mark.parametrize("action", ["accept", "decline"])
async def test_an_ask_the_server_did_not_hold_is_put_to_a_person(server, action) -> None:
    server.queue(Reply(frames=responses_events(SERVED, ["ok"])))
    fake = FakeTurn(spec_for(server))
    worker = _Worker(server, _verdict("ASK", "Spend money on a model call?"))
    worker.answer = Verdict(action)
    turn = _real_turn(worker, fake)

    with trio.fail_after(5):
        if action == "accept":
            await OpenAIHarness({}, environ={}).run_turn(turn)
        else:
            with pytest.raises(TurnFailed) as info:
                await OpenAIHarness({}, environ={}).run_turn(turn)

    [asked] = [e for e in worker.sent if isinstance(e, ElicitationRequest)]
    assert asked.params["message"] == "Spend money on a model call?"
    assert asked.params["phase"] == "llm_request"
    if action == "accept":
        assert len(server.requests) == 1
    else:
        assert info.value.code == "policy_denied"
        assert server.requests == []


# --- attachments ------------------------------------------------------------------------------


def _file(media_type: str, payload: bytes, name: str = "notes.txt") -> dict[str, Any]:
    data = f"data:{media_type};base64,{base64.b64encode(payload).decode()}"
    return {"type": "input_file", "filename": name, "file_data": data}


@pytest.mark.parametrize("harness", ["openai-agents", "openai"])
async def test_a_text_attachment_reaches_the_model_as_text(server, harness) -> None:
    """§C.1, what-corral-did-wrong #14: the server forwards an upload as a data URL; a text
    file becomes its decoded text (as omnigent's openai-agents harness does), other files
    pass on as they came."""
    frames = chat_events if harness == "openai" else responses_events
    server.queue(Reply(frames=frames(SERVED, ["ok"])))
    image = _file("image/png", b"\x89PNG", "pic.png")
    content = [
        {"type": "input_text", "text": "read this"},
        _file("text/plain", "héllo file\n".encode()),
        _file("application/json", b'{"a": 1}', "a.json"),
        image,
    ]
    fake = FakeTurn(spec_for(server, harness=harness))
    fake.message["content"] = [{"type": "message", "role": "user", "content": content}]

    await run(fake)

    [request] = server.requests
    if harness == "openai":
        # Chat Completions carries text and images only: the two text files are text now
        # (before, they were dropped with the other file).
        [_, user] = request.json["messages"]
        assert user["content"] == 'read this\nhéllo file\n\n{"a": 1}'
    else:
        assert request.json["input"][0]["content"] == [
            {"type": "input_text", "text": "read this"},
            {"type": "input_text", "text": "héllo file\n"},
            {"type": "input_text", "text": '{"a": 1}'},
            image,
        ]


def test_a_file_that_is_not_decodable_text_passes_on_as_it_came() -> None:
    from corral.harnesses.openai._conversations import _inline_text_files

    broken = {"type": "input_file", "filename": "x.txt", "file_data": "data:text/plain;base64,@@"}
    pdf = _file("application/pdf", b"%PDF-1.7", "x.pdf")
    plain = {"type": "input_file", "file_data": "data:text/plain,a%20b"}
    assert _inline_text_files([broken, pdf, plain, "junk"]) == [
        broken,
        pdf,
        {"type": "input_text", "text": "a b"},
    ]
