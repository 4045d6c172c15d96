"""The worker's turn bookkeeping against a peer whose durable sends wait for a commit."""

from __future__ import annotations

from typing import Any

import msgspec
import trio

from corral.bus import Envelope, Incoming, Message
from corral.config import BusSettings, LivenessSettings
from corral.harnesses._turn import POLICY_HEARTBEAT_S, TurnContext, TurnFailed, final_usage
from corral.harnesses._worker import Worker
from corral.harnesses.protocol import (
    Output,
    OutputItemDone,
    OutputTextDelta,
    PolicyEvaluationRequested,
    PolicyVerdict,
    ResponseCompleted,
    ResponseFailed,
    ResponseHeartbeat,
    TurnStart,
    Warning,
)


class _SlowCommitPeer:
    """A stand-in for a bus peer: durable sends return when the test releases the commit."""

    name = "harness/s1"
    incarnation = "test"
    bus = BusSettings()

    def __init__(self) -> None:
        self.commit = trio.Event()
        self.sent: list[Message] = []
        #: Set once a ``response.completed`` has been sent, for a test to wait on.
        self.completed = trio.Event()

    async def cast(self, to: str, msg: Message, *, durable: bool = False, **_: Any) -> str:
        self.sent.append(msg)
        if isinstance(msg, ResponseCompleted):
            self.completed.set()
        if durable:
            await self.commit.wait()
        return "id"

    async def cast_many(self, to: str, msgs: list[Message], **_: Any) -> list[str]:
        self.sent.extend(msgs)
        return []


class _OneLine:
    async def run_turn(self, turn: TurnContext) -> None:
        await turn.text("hi")


def _start(turn_id: str) -> Incoming:
    msg = TurnStart(session_id="s1", turn_id=turn_id, spec={}, message={})
    env = Envelope(
        id=turn_id,
        sender="harness",
        recipient="harness/s1",
        type="harness.turn",
        body=msgspec.Raw(b""),
    )
    return Incoming(env, msg)


async def test_h03_next_turn_is_taken_while_the_last_terminal_commits() -> None:
    """The broker hands a terminal on before its commit ends, so the next turn's start can
    arrive while the worker still awaits the terminal's acceptance: the turn is over by then
    (before, the worker answered 409 and the next turn failed ``harness_busy``)."""
    peer = _SlowCommitPeer()
    worker = Worker(peer, "s1", _OneLine(), LivenessSettings())  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        first = await worker._on_input(_start("turn_1"), nursery)
        assert first is not None and first.status == 200
        with trio.fail_after(5):
            await peer.completed.wait()
        second = await worker._on_input(_start("turn_2"), nursery)
        assert second is not None and second.status == 200, second
        assert worker.turn is not None and worker.turn.turn_id == "turn_2"
        peer.commit.set()
        with trio.fail_after(5):
            while worker.turn is not None:
                await trio.sleep(0.01)
        ends = [m.turn_id for m in peer.sent if isinstance(m, ResponseCompleted)]
        assert ends == ["turn_1", "turn_2"]


class _Recorder:
    """A worker stand-in that records what a turn emits; ``answers`` resolve what it waits on
    (by wait key) as soon as the request goes out."""

    def __init__(self) -> None:
        self.sent: list[Message] = []
        self.turn: TurnContext | None = None
        self.answers: dict[str, Any] = {}

    async def send_output(self, reply_to: str, event: Message, *, durable: bool = False) -> None:
        self.sent.append(event)
        key = None
        if isinstance(event, OutputItemDone) and event.item.get("status") == "action_required":
            key = f"tool:{event.item['call_id']}"
        elif isinstance(event, PolicyEvaluationRequested):
            key = f"policy:{event.evaluation_id}"
        if key is not None and "*" in self.answers:
            assert self.turn is not None
            self.turn.resolve(key, self.answers["*"])


def _turn(recorder: _Recorder, **message: Any) -> TurnContext:
    start = TurnStart(session_id="s1", turn_id="t1", spec={"name": "spec-name"}, message=message)
    recorder.turn = TurnContext(recorder, start)  # type: ignore[arg-type]
    return recorder.turn


async def test_completed_calls_and_assistant_messages_carry_the_agent() -> None:
    """PROTOCOL_0_19 §E.1: the server drops a completed function_call or an assistant message
    without ``agent``; the agent is the message's ``model`` (the agent name), the same value
    as the ``model`` of the turn's response events (§D.3)."""
    recorder = _Recorder()
    recorder.answers["*"] = "listed"
    turn = _turn(recorder, model="helper")
    with trio.fail_after(5):
        assert await turn.call_tool("sys_os_shell", {"command": "ls"}) == "listed"
        await turn.item({"type": "message", "role": "assistant", "content": []})
        await turn.item({"type": "message", "role": "assistant", "agent": "other", "content": []})
        await turn.item({"type": "message", "role": "user", "content": []})
    items = [(e.item["type"], e.item.get("status"), e.item.get("agent")) for e in recorder.sent]
    assert items == [
        ("function_call", "in_progress", None),
        ("function_call", "action_required", None),
        ("function_call", "completed", "helper"),
        ("function_call_output", None, None),
        ("message", None, "helper"),
        ("message", None, "other"),
        ("message", None, None),
    ]
    assert turn.response("in_progress")["model"] == "helper"


async def test_usage_names_the_serving_model_when_the_kind_did_not() -> None:
    """``response.completed.response.usage.model`` makes the server publish ``session.model``
    (PROTOCOL_0_19 §D.3); a kind that reported a serving model but no usage model gets it."""
    recorder = _Recorder()
    turn = _turn(recorder, model="helper")
    assert "model" not in final_usage(turn)
    turn.serve("served-1", "p")
    assert final_usage(turn)["model"] == "served-1"
    turn.usage["model"] = "from-kind"
    assert final_usage(turn)["model"] == "from-kind"


async def test_a_held_policy_evaluation_keeps_the_turn_audible(autojump_clock) -> None:
    """The server may hold an evaluation until a person answers (§F.3); meanwhile the turn
    sends a ``response.heartbeat`` every POLICY_HEARTBEAT_S, so dispatch's idle watchdog does
    not end a turn that waits on a person."""
    recorder = _Recorder()
    turn = _turn(recorder, model="helper")
    async with trio.open_nursery() as nursery:
        verdicts: list[PolicyVerdict] = []

        async def ask() -> None:
            verdicts.append(await turn.policy("PHASE_LLM_REQUEST", {"model": "m"}))

        nursery.start_soon(ask)
        await trio.sleep(POLICY_HEARTBEAT_S * 2.5)
        [request] = [e for e in recorder.sent if isinstance(e, PolicyEvaluationRequested)]
        verdict = PolicyVerdict(
            session_id="s1", evaluation_id=request.evaluation_id, action="POLICY_ACTION_ALLOW"
        )
        assert turn.resolve(f"policy:{request.evaluation_id}", verdict)
    assert verdicts == [verdict]
    beats = [e for e in recorder.sent if isinstance(e, ResponseHeartbeat)]
    assert len(beats) == 2
    await trio.sleep(POLICY_HEARTBEAT_S * 2)
    assert len([e for e in recorder.sent if isinstance(e, ResponseHeartbeat)]) == 2


async def test_streamed_text_is_sent_whole_as_one_message_before_the_next_item() -> None:
    """Deltas name their message (``message_id``) and the message follows whole, before the
    next item: the real server saves it whole even when its relay of the stream restarted
    in between (docs/protocol-0.19.md), and in transcript order."""
    recorder = _Recorder()
    recorder.answers["*"] = "out"
    turn = _turn(recorder, model="helper")
    with trio.fail_after(5):
        await turn.text("let me ")
        await turn.text("look")
        await turn.call_tool("sys_os_shell", {"command": "ls"})
        await turn.text("found it")
        await turn.end_message()
        await turn.end_message()  # nothing streamed since: nothing sent
    kinds = [
        (e.item["type"], e.item.get("status")) if isinstance(e, OutputItemDone) else e.delta
        for e in recorder.sent
    ]
    assert kinds == [
        "let me ",
        "look",
        ("message", "completed"),
        ("function_call", "in_progress"),
        ("function_call", "action_required"),
        ("function_call", "completed"),
        ("function_call_output", None),
        "found it",
        ("message", "completed"),
    ]
    first, second = (
        e for e in recorder.sent if isinstance(e, OutputItemDone) and e.item["type"] == "message"
    )
    deltas = [e for e in recorder.sent if isinstance(e, OutputTextDelta)]
    assert [d.message_id for d in deltas] == [first.item["id"]] * 2 + [second.item["id"]]
    assert first.item["content"][0]["text"] == "let me look"
    assert (first.item["agent"], second.item["content"][0]["text"]) == ("helper", "found it")


class _Streams:
    """Streams a partial answer, then fails or waits to be interrupted."""

    def __init__(self, fail: bool) -> None:
        self.fail = fail
        self.streamed = trio.Event()

    async def run_turn(self, turn: TurnContext) -> None:
        await turn.text("half an ans")
        self.streamed.set()
        if self.fail:
            raise TurnFailed("provider_error", "the provider went away")
        await trio.sleep_forever()


async def _ended_turn(fail: bool) -> list[Message]:
    peer = _SlowCommitPeer()
    peer.commit.set()
    kind = _Streams(fail)
    worker = Worker(peer, "s1", kind, LivenessSettings())  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await worker._on_input(_start("turn_1"), nursery)
        with trio.fail_after(5):
            await kind.streamed.wait()
            if not fail:
                assert worker._turn_scope is not None
                worker._turn_scope.cancel()  # what an Interrupt does
            await worker._turn_done.wait()
    return [m for m in peer.sent if isinstance(m, Output)]  # not the WorkerAlive casts


async def test_a_failed_turn_keeps_its_partial_text_an_interrupted_one_does_not() -> None:
    """A failed turn's text is saved, as the server saves a failed turn's narration; an
    interrupted turn's is not (PROTOCOL_0_19 §E.4: no partial answer in the transcript)."""
    failed = await _ended_turn(fail=True)
    tags = [m.__struct_config__.tag for m in failed]
    assert tags[-2:] == ["response.output_item.done", "response.failed"]
    assert failed[-2].item["content"][0]["text"] == "half an ans"
    interrupted = await _ended_turn(fail=False)
    assert interrupted[-1].__struct_config__.tag == "response.cancelled"
    assert not [m for m in interrupted if isinstance(m, OutputItemDone)]


class _OneHugeDelta:
    async def run_turn(self, turn: TurnContext) -> None:
        await turn.text("x" * 100_000)


async def test_an_event_larger_than_the_bus_carries_fails_the_turn_and_keeps_its_number() -> None:
    """Sent, a delta or item over the bus's message limit failed in the outbox's task and took
    the worker down (``harness_crashed``). It goes as a ``warning`` with its number instead
    (dispatch waits for every number), and the turn fails ``output_too_large``."""
    peer = _SlowCommitPeer()
    peer.bus = BusSettings(max_message_bytes=64 * 1024)
    peer.commit.set()
    worker = Worker(peer, "s1", _OneHugeDelta(), LivenessSettings())  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.outbox.run)
        await worker._on_input(_start("turn_1"), nursery)
        with trio.fail_after(5):
            await worker._turn_done.wait()
        nursery.cancel_scope.cancel()
    sent = [m for m in peer.sent if isinstance(m, Output)]
    assert [m.sequence_number for m in sent] == list(range(len(sent))), "no number skipped"
    warnings = [m for m in sent if isinstance(m, Warning)]
    assert [w.kind for w in warnings] == ["output_too_large"] * 2  # the delta, then the item
    assert "response.output_text.delta event of 100" in warnings[0].message
    assert "response.output_item.done event of" in warnings[1].message
    assert not any(isinstance(m, OutputTextDelta | OutputItemDone) for m in sent)
    terminal = sent[-1]
    assert isinstance(terminal, ResponseFailed)
    assert terminal.error["code"] == "output_too_large"
