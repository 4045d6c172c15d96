"""The gateway's open session streams (issue #20): a stream is a record, and a task runs for
it only while something is due — its events, a heartbeat, the ``[DONE]`` of a deletion.

The stream's tunnel and response are stand-ins here (the tunnel's nursery is the test's, the
response records what it would have sent); the buffer is the real one, on a file. The whole
path through a real host and the fake tunnel server is
``test_open_streams_hold_no_task_beat_and_go_with_their_connection`` in
``tests/integration/test_gateway.py``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import msgspec
import pytest
import trio
import trio.testing

from corral.actors.gateway import StreamBuffer, TunnelDown
from corral.actors.gateway._open_streams import STALLED_S, OpenStreams
from corral.actors.gateway._options import GatewayOptions
from corral.actors.gateway._sse import DONE, HEARTBEAT

HEARTBEAT_S = 10.0


class Responder:
    """What a stream's response would have sent: its head, then each body piece."""

    def __init__(
        self, request_id: str, fail_on: str | None = None, gate: trio.Event | None = None
    ) -> None:
        self.id = request_id
        self.head_status: int | None = None
        self.texts: list[str] = []
        self.ended = False
        self.fail_on = fail_on
        #: A server slow to read: body pieces wait for it, and are read (confirmed) after it.
        self.gate = gate

    async def head(self, status: int, headers: list[tuple[str, str]]) -> None:
        self.head_status = status
        await trio.lowlevel.checkpoint()

    async def text(
        self,
        text: str,
        on_sent: Callable[[], None] | None = None,
        on_read: Callable[[], None] | None = None,
    ) -> None:
        await trio.lowlevel.checkpoint()
        if self.fail_on is not None and self.fail_on in text:
            raise RuntimeError("the response broke")
        if self.gate is not None and text != HEARTBEAT:
            await self.gate.wait()
        self.texts.append(text)
        if on_sent is not None:
            on_sent()
        if self.gate is not None and on_read is not None:
            on_read()

    async def end(self) -> None:
        self.ended = True
        await trio.lowlevel.checkpoint()

    def events(self) -> list[Any]:
        return [
            json.loads(line[len("data: ") :])
            for text in self.texts
            for line in text.split("\n")
            if line.startswith("data: {") and "session.heartbeat" not in line
        ]

    def heartbeats(self) -> int:
        return sum(text.count(HEARTBEAT) for text in self.texts)


class Tunnel:
    """A connection's part of a tunnel: its nursery, and the responses it keeps open."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery: trio.Nursery | None = nursery
        self.detached: dict[str, Callable[[], None]] = {}

    def detach(self, request_id: str, on_end: Callable[[], None]) -> None:
        self.detached[request_id] = on_end

    def forget(self, request_id: str) -> None:
        self.detached.pop(request_id, None)

    def start_soon(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        if self.nursery is None:
            raise TunnelDown("not connected")
        self.nursery.start_soon(fn, *args)

    def tasks(self) -> int:
        assert self.nursery is not None
        return len(self.nursery.child_tasks)


class Streams:
    def __init__(self, streams: OpenStreams, buffer: StreamBuffer, tunnel: Tunnel) -> None:
        self.streams = streams
        self.buffer = buffer
        self.tunnel = tunnel
        self.seq = 0

    async def open(self, session_id: str, **kw: Any) -> Responder:
        responder = Responder(f"req-{session_id}-{len(self.tunnel.detached)}", **kw)
        await self.streams.serve(cast("Any", self.tunnel), cast("Any", responder), session_id, None)
        return responder

    def publish(self, session_id: str, *texts: str) -> None:
        for text in texts:
            self.seq += 1
            event = {"type": "response.output_text.delta", "delta": text}
            assert self.buffer.add(session_id, self.seq, msgspec.json.encode(event))
        self.streams.notify(session_id)


@asynccontextmanager
async def streams_on(tmp_path: Path, max_events: int = 1000) -> AsyncIterator[Streams]:
    buffer = StreamBuffer(tmp_path / "streams.log", max_events=max_events, compact_bytes=1 << 20)
    buffer.load()
    options = msgspec.convert({"heartbeat_s": HEARTBEAT_S}, GatewayOptions)
    streams = OpenStreams(buffer, options, inbox=[])
    try:
        async with trio.open_nursery() as nursery:
            yield Streams(streams, buffer, Tunnel(nursery))
            nursery.cancel_scope.cancel()
    finally:
        buffer.close()


async def settle() -> None:
    await trio.testing.wait_all_tasks_blocked()


async def test_an_open_stream_holds_no_task_until_something_is_due(tmp_path: Path) -> None:
    async with streams_on(tmp_path) as s:
        quiet = await s.open("quiet")
        busy = await s.open("busy")
        assert quiet.head_status == 200 and quiet.texts == [HEARTBEAT]
        assert s.tunnel.tasks() == 0
        assert sorted(s.streams.newest) == ["busy", "quiet"]
        assert len(s.tunnel.detached) == 2
        s.publish("busy", "a", "b")
        s.publish("busy", "c")
        await settle()
        assert [e["delta"] for e in busy.events()] == ["a", "b", "c"]
        assert quiet.events() == [] and s.tunnel.tasks() == 0
        assert not busy.ended and s.buffer.unsent_count() == 0


async def test_what_was_pending_goes_on_a_stream_at_its_open(tmp_path: Path) -> None:
    async with streams_on(tmp_path) as s:
        s.publish("early", "x", "y")  # nobody holds it open yet
        early = await s.open("early")
        assert early.texts[0] == HEARTBEAT
        assert [e["delta"] for e in early.events()] == ["x", "y"]
        assert s.tunnel.tasks() == 0


async def test_the_newest_stream_of_a_session_takes_its_events(tmp_path: Path) -> None:
    async with streams_on(tmp_path) as s:
        old = await s.open("twice")
        new = await s.open("twice")
        s.publish("twice", "n")
        await settle()
        assert old.events() == [] and [e["delta"] for e in new.events()] == ["n"]
        assert s.streams.sessions_held() == 1


async def test_one_task_beats_every_quiet_stream(tmp_path: Path, autojump_clock: Any) -> None:
    async with streams_on(tmp_path) as s:
        many = [await s.open(f"s{i}") for i in range(20)]
        await trio.sleep(HEARTBEAT_S * 3 + 1)
        assert all(r.heartbeats() == 1 for r in many)  # nothing beats without the task
        s.tunnel.start_soon(s.streams.run_heartbeats)
        await trio.sleep(HEARTBEAT_S * 3 + 0.5)  # between two looks (every second)
        assert all(r.heartbeats() >= 4 for r in many), [r.heartbeats() for r in many]
        assert s.tunnel.tasks() == 1  # the heartbeat task, and no other


async def test_a_deleted_session_ends_each_of_its_streams_with_done(tmp_path: Path) -> None:
    async with streams_on(tmp_path) as s:
        first, second = await s.open("gone"), await s.open("gone")
        kept = await s.open("kept")
        assert await s.streams.finish("gone") == 2
        for r in (first, second):
            assert r.texts[-1] == DONE and r.ended
        assert s.streams.sessions_held() == 1 and "gone" not in s.streams.newest
        assert list(s.tunnel.detached) == [kept.id]
        assert await s.streams.finish("never-open") == 0


async def test_a_cancel_or_a_lost_connection_forgets_the_stream(tmp_path: Path) -> None:
    async with streams_on(tmp_path) as s:
        cancelled = await s.open("c")
        await s.open("lost")
        s.tunnel.detached.pop(cancelled.id)()  # the server's request.cancel
        assert "c" not in s.streams.newest and s.streams.sessions_held() == 1
        s.tunnel.nursery = None  # the connection went: its responses end with it
        s.publish("lost", "z")
        assert s.streams.newest == {} and s.streams.sessions_held() == 0
        for on_end in list(s.tunnel.detached.values()):
            on_end()  # what the tunnel does at the end of a connection; nothing is left
        assert s.streams.sessions_held() == 0


async def test_a_stream_that_fails_ends_alone(tmp_path: Path, caplog: Any) -> None:
    async with streams_on(tmp_path) as s:
        broken = await s.open("broken", fail_on="boom")
        fine = await s.open("fine")
        s.publish("broken", "boom")
        s.publish("fine", "ok")
        await settle()
        assert broken.ended and "broken" not in s.streams.newest
        assert "its stream failed" in caplog.text
        assert [e["delta"] for e in fine.events()] == ["ok"] and not fine.ended
        # What it failed to send is still pending: the server's next stream gets it.
        assert s.buffer.pending_in("broken") == 1


# --- flow control (OpenStreams.room) -----------------------------------------------------------


async def _room_returned(s: Streams, session_id: str) -> trio.Event:
    """Call ``room`` in a task of its own; the event is set when it returns."""
    returned = trio.Event()

    async def wait() -> None:
        await s.streams.room(session_id)
        returned.set()

    s.tunnel.start_soon(wait)
    await settle()
    return returned


async def test_a_full_session_waits_until_its_stream_moves(tmp_path: Path) -> None:
    """A session at its bound with an open stream waits while the server is slow to read,
    and goes on once the stream sends and the server confirms: nothing is dropped."""
    async with streams_on(tmp_path, max_events=4) as s:
        gate = trio.Event()
        slow = await s.open("slow", gate=gate)
        s.publish("slow", "a", "b", "c", "d")
        assert s.buffer.full("slow")
        returned = await _room_returned(s, "slow")
        assert not returned.is_set()
        gate.set()
        await returned.wait()
        assert not s.buffer.full("slow")
        s.publish("slow", "e")
        await settle()
        assert [e["delta"] for e in slow.events()] == ["a", "b", "c", "d", "e"]
        assert s.buffer.stats["dropped"] == 0


async def test_a_stalled_stream_is_waited_for_once_then_the_bound_drops(
    tmp_path: Path, autojump_clock: Any, caplog: Any
) -> None:
    """A stream that moves nothing for STALLED_S stops holding the gateway: the wait ends,
    the warning says so, and the session's next events do not wait again until its stream
    moves; once it has, a full session waits again."""
    async with streams_on(tmp_path, max_events=2) as s:
        gate = trio.Event()
        stuck = await s.open("stuck", gate=gate)
        s.publish("stuck", "a", "b")
        start = trio.current_time()
        await s.streams.room("stuck")
        assert trio.current_time() - start == pytest.approx(STALLED_S)
        assert "sent and confirmed nothing for 10 s" in caplog.text
        s.publish("stuck", "c")
        assert s.buffer.stats["dropped"] == 1  # the bound, as before flow control
        again = trio.current_time()
        await s.streams.room("stuck")
        assert trio.current_time() == again  # stalled: not waited for again
        gate.set()
        await settle()
        # "a" was dropped from the buffer, but the frame in flight already held it.
        assert [e["delta"] for e in stuck.events()] == ["a", "b", "c"]
        # It moved: the next time it is full and stuck, the session waits again.
        stuck.gate = trio.Event()
        s.publish("stuck", "d", "e")
        start = trio.current_time()
        await s.streams.room("stuck")
        assert trio.current_time() - start == pytest.approx(STALLED_S)


async def test_a_full_session_without_a_stream_does_not_wait(tmp_path: Path) -> None:
    """No stream open (the tunnel down, the server not listening): the bound drops the
    oldest at once, as it always did; waiting would hold every other session up."""
    async with streams_on(tmp_path, max_events=2) as s:
        s.publish("nobody", "a", "b")
        assert s.buffer.full("nobody")
        with trio.fail_after(1):
            await s.streams.room("nobody")


async def test_a_full_session_stops_waiting_when_its_stream_closes(tmp_path: Path) -> None:
    """The connection went while a full session waited for its stream: the wait ends at
    once (no stream, the bound applies), not after STALLED_S."""
    async with streams_on(tmp_path, max_events=2) as s:
        stuck = await s.open("gone", gate=trio.Event())
        s.publish("gone", "a", "b")
        returned = await _room_returned(s, "gone")
        assert not returned.is_set()
        s.tunnel.detached.pop(stuck.id)()  # the server cancelled the request
        with trio.fail_after(1):
            await returned.wait()
