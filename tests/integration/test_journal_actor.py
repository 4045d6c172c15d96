"""The journal actor through a real host: appends, reads, summaries, snapshots, ordering
across many concurrent runs (J-32), kill -9 during durable appends, and bad input."""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import msgspec
import pytest
import trio
import zmq

from corral import ProtocolError, RemoteError
from corral.actors.journal import (
    JournalAppend,
    JournalAppended,
    JournalAppends,
    JournalEvent,
    JournalList,
    JournalListReply,
    JournalRead,
    JournalSnapshot,
    JournalSnapshotReply,
    JournalSummary,
)
from corral.bus import (
    Envelope,
    InspectRequest,
    Peer,
    Socket,
    configure,
    decode_envelope,
    encode_body,
    encode_envelope,
    open_peer,
    tag_of,
)
from corral.config import LivenessSettings
from corral.journal import RunJournal
from tests.conftest import FAST_LIVENESS, HostProcess

FAST = LivenessSettings(interval_s=0.2, liveness=3)

#: One host serves the module: each test writes runs of its own session ids and reads the
#: actor's counters as differences (the kill -9 test and those with journal options of their
#: own start their own host).
SHARE_HOST = True


async def _read(peer: Peer, session_id: str, run_id: str, **kw: Any) -> dict[str, Any]:
    reply = await peer.call("journal", JournalRead(session_id=session_id, run_id=run_id, **kw))
    return reply.result


async def _summary(peer: Peer, session_id: str, run_id: str) -> dict[str, Any]:
    reply = await peer.call("journal", JournalSummary(session_id=session_id, run_id=run_id))
    return reply.summary


async def _stats(peer: Peer) -> dict[str, Any]:
    reply = await peer.call("journal", InspectRequest(), timeout=5)
    return reply.state


class _RawClient:
    """A DEALER that sends hand-made envelopes: a durable message with a chosen id is how a
    redelivery looks to the actor."""

    def __init__(self, endpoint: str, name: str = "raw-journal-client") -> None:
        self.ctx = zmq.Context()
        sock = self.ctx.socket(zmq.DEALER)
        configure(sock, hwm=1000, linger_ms=0)
        sock.setsockopt(zmq.IDENTITY, name.encode())
        sock.connect(endpoint)
        self.sock = Socket(sock)
        self.name = name

    async def _send(self, message_id: str, msg: JournalAppend | JournalAppends) -> None:
        """``msg`` as a durable message of id ``message_id`` (a reply wanted for an append)."""
        env = Envelope(
            id=message_id,
            sender=self.name,
            recipient="journal",
            type=tag_of(type(msg)),
            body=encode_body(msg),
            durability="durable",
            created_at=time.time(),
            wants_reply=isinstance(msg, JournalAppend),
        )
        await self.sock.send([encode_envelope(env)])

    async def append(self, message_id: str, msg: JournalAppend) -> JournalAppended:
        await self._send(message_id, msg)
        with trio.fail_after(10):
            while True:
                reply = decode_envelope((await self.sock.receive())[0])
                if reply.correlation_id == message_id and reply.type == "journal.appended":
                    return msgspec.msgpack.decode(reply.body, type=JournalAppended)

    async def cast(self, message_id: str, msg: JournalAppends) -> None:
        """Send ``msg`` and wait for the broker's acceptance (no reply comes)."""
        await self._send(message_id, msg)
        with trio.fail_after(10):
            while decode_envelope((await self.sock.receive())[0]).type != "bus.accepted":
                pass

    def close(self) -> None:
        self.sock.close()
        self.ctx.term()


def _observation(session_id: str, run_id: str, model: str) -> dict[str, Any]:
    return {
        "session_id": session_id,
        "stream_id": run_id,
        "model": model,
        "provider": "custom",
        "fallback_active": True,
        "phase": "observed_output",
    }


# --- round trips -----------------------------------------------------------------------------


async def test_append_read_summary_snapshot_and_list_round_trip(host: HostProcess) -> None:
    observed = _observation("session-a", "run-a", "backup")
    async with open_peer("test-client", host.endpoint, liveness=FAST) as peer:
        start = await _stats(peer)
        one = await peer.call("journal", JournalAppend.one("session-a", "run-a", "token", None))
        assert one == JournalAppended(session_id="session-a", run_id="run-a", seqs=[1])
        batch = JournalAppend(
            session_id="session-a",
            run_id="run-a",
            events=[
                JournalEvent(event="runtime_model", payload=observed),
                JournalEvent(event="token", payload={"text": "Hel"}),
                JournalEvent(event="response.output_text.delta", payload={"delta": "lo"}),
            ],
        )
        assert (await peer.call("journal", batch)).seqs == [2, 3, 4]
        done = await peer.call(
            "journal", JournalAppend.one("session-a", "run-a", "done", {"usage": {}}), durable=True
        )
        assert isinstance(done, JournalAppended) and done.seqs == [5] and done.duplicates == 0

        result = await _read(peer, "session-a", "run-a")
        events = result["events"]
        assert [e["seq"] for e in events] == [1, 2, 3, 4, 5]
        assert [e["event_id"] for e in events] == [f"run-a:{n}" for n in range(1, 6)]
        assert [e["event"] for e in events] == [
            "token",
            "runtime_model",
            "token",
            "response.output_text.delta",
            "done",
        ]
        assert events[0]["payload"] == {}  # J-03
        assert events[1]["payload"] == observed
        assert events[4]["terminal"] is True and events[4]["terminal_state"] == "completed"
        # Only durable appends carry an idempotency key: "<bus message id>/<index>".
        assert [("key" in e) for e in events] == [False] * 4 + [True]
        assert events[4]["key"].endswith("/0")
        assert result["complete"] and result["last_seq"] == 5 and result["malformed"] == []
        # What the actor answers is what is on disk.
        on_disk = RunJournal(host.instance.journal_dir).read("session-a", "run-a")
        assert on_disk == result

        assert [e["seq"] for e in (await _read(peer, "session-a", "run-a", after=3))["events"]] == [
            4,
            5,
        ]
        page = await _read(peer, "session-a", "run-a", after="run-a:1", limit=2)
        assert [e["seq"] for e in page["events"]] == [2, 3]
        assert page["complete"] is False and page["next_after_seq"] == 3
        foreign = await _read(peer, "session-a", "run-a", after="other-run:4")
        assert foreign["cursor_reset"] is True and len(foreign["events"]) == 5

        summary = await _summary(peer, "session-a", "run-a")
        assert summary["terminal_state"] == "completed"
        assert summary["last_seq"] == 5 and summary["last_event_id"] == "run-a:5"
        assert summary["runtime_model"] == observed
        empty = await _summary(peer, "session-a", "another-run")  # J-15
        assert empty["runtime_model"] is None and empty["terminal_state"] == "unknown"

        snap = await peer.call("journal", JournalSnapshot(run_id="run-a"))
        assert isinstance(snap, JournalSnapshotReply) and snap.snapshot is not None
        assert snap.snapshot["session_id"] == "session-a"  # found by run id alone (J-16)
        assert snap.snapshot["last_assistant_text"] == "Hello"  # J-17
        assert snap.snapshot["runtime_model"] == observed  # J-18
        assert snap.session_payload is not None
        assert snap.session_payload["runtime_model"] == observed  # J-19
        missing = await peer.call("journal", JournalSnapshot(run_id="no-such-run"))
        assert missing == JournalSnapshotReply(snapshot=None, session_payload=None)

        listing = await peer.call("journal", JournalList())
        assert isinstance(listing, JournalListReply)
        (row,) = [r for r in listing.listing["sessions"] if r["session_id"] == "session-a"]
        assert row["runs"] == 1 and row["bytes"] > 0
        runs = await peer.call("journal", JournalList(session_id="session-a"))
        assert isinstance(runs, JournalListReply)
        (run,) = runs.listing["runs"]
        assert run["run_id"] == "run-a" and run["last_seq"] == 5
        assert run["terminal_state"] == "completed" and run["bytes"] > 0

        stats = await _stats(peer)
    assert stats["appends"] - start["appends"] == 5 and stats["policy"] == "every"
    assert 1 <= stats["fsync_rounds"] - start["fsync_rounds"] <= 3
    assert stats["open_runs"] == start["open_runs"]  # a finished run's file is closed at once
    assert stats["duplicates"] == start["duplicates"] and stats["held"] == 0


async def test_a_cast_append_is_visible_to_a_read_sent_after_it(host: HostProcess) -> None:
    async with open_peer("test-client", host.endpoint, liveness=FAST) as peer:
        for n in range(20):
            await peer.cast("journal", JournalAppend.one("s", "r", "token", {"n": n}))
        # No reply was awaited: the read itself must wait for what was submitted before it.
        result = await _read(peer, "s", "r")
    assert [e["payload"]["n"] for e in result["events"]] == list(range(20))


# --- ordering across many concurrent runs (J-32) ---------------------------------------------


async def _produce(peer: Peer, session_id: str, run_id: str, count: int) -> None:
    """Send a run's events the way the dispatch side does: deltas as stream appends (some
    batched), every 10th event durable, each stream append naming the durable one before it."""
    last_durable: str | None = None
    batch: list[JournalEvent] = []

    async def flush() -> None:
        if batch:
            msg = JournalAppend(
                session_id=session_id, run_id=run_id, events=list(batch), after=last_durable
            )
            await peer.cast("journal", msg)
            batch.clear()

    for n in range(count):
        if n % 10 == 9:
            await flush()
            msg = JournalAppend.one(session_id, run_id, "tool_call", {"n": n})
            last_durable = await peer.cast("journal", msg, durable=True)
        else:
            batch.append(JournalEvent(event="token", payload={"n": n, "text": f"{n} "}))
            if len(batch) == 1 + n % 3:
                await flush()
    await flush()


async def test_fifty_runs_appending_concurrently_keep_their_order(host: HostProcess) -> None:
    runs = [(f"session-{n}", f"run-{n}") for n in range(50)]
    count = 100
    async with (
        open_peer("dispatch-a", host.endpoint, liveness=FAST) as peer_a,
        open_peer("dispatch-b", host.endpoint, liveness=FAST) as peer_b,
    ):
        start = await _stats(peer_a)
        async with trio.open_nursery() as nursery:
            for index, (session_id, run_id) in enumerate(runs):
                peer = peer_a if index % 2 else peer_b
                nursery.start_soon(_produce, peer, session_id, run_id, count)
        with trio.fail_after(30):
            for session_id, run_id in runs:
                while (await _summary(peer_a, session_id, run_id))["last_seq"] < count:
                    await trio.sleep(0.02)
        for session_id, run_id in runs:
            result = await _read(peer_a, session_id, run_id, strict=True)
            assert result["malformed"] == [] and result["complete"], (run_id, result["malformed"])
            events = result["events"]
            assert [e["seq"] for e in events] == list(range(1, count + 1)), run_id
            assert [e["payload"]["n"] for e in events] == list(range(count)), run_id
            assert all(e["session_id"] == session_id and e["run_id"] == run_id for e in events)
        stats = await _stats(peer_a)
    appends = stats["appends"] - start["appends"]
    assert appends == len(runs) * count
    assert stats["hold_timeouts"] == start["hold_timeouts"]
    # Group commit: the runs shared fsync rounds instead of paying one per event.
    assert stats["fsync_rounds"] - start["fsync_rounds"] < appends / 3, stats


async def test_a_stream_append_waits_for_the_durable_append_it_follows(host: HostProcess) -> None:
    raw = _RawClient(host.endpoint)
    try:
        async with open_peer("test-client", host.endpoint, liveness=FAST) as peer:
            # The stream append overtakes the durable one it names: it must be held...
            follow = JournalAppend.one(
                "s-held", "r-held", "token", {"text": "after"}, after="durable-1"
            )
            await peer.cast("journal", follow)
            with trio.fail_after(5):
                while (await _stats(peer))["held"] != 1:
                    await trio.sleep(0.02)
            # ...until the durable one is applied.
            first = JournalAppend.one("s-held", "r-held", "tool_call", {"text": "first"})
            assert (await raw.append("durable-1", first)).seqs == [1]
            with trio.fail_after(5):
                while (await _summary(peer, "s-held", "r-held"))["last_seq"] < 2:
                    await trio.sleep(0.02)
            events = (await _read(peer, "s-held", "r-held"))["events"]
            assert [e["payload"]["text"] for e in events] == ["first", "after"]
            assert (await _stats(peer))["held"] == 0
    finally:
        raw.close()


async def test_a_held_append_is_given_up_on_after_the_hold_timeout(host_factory) -> None:
    host = host_factory(FAST_LIVENESS + "[actors.journal]\noptions = { hold_timeout_s = 0.3 }\n")
    host.start()
    async with open_peer("test-client", host.endpoint, liveness=FAST) as peer:
        started = trio.current_time()
        reply = await peer.call(
            "journal", JournalAppend.one("s", "r", "token", {"n": 1}, after="never-sent")
        )
        assert reply.seqs == [1]
        assert trio.current_time() - started >= 0.25
        # The lost id now counts as applied: a later append naming it is not held again.
        again = await peer.call(
            "journal", JournalAppend.one("s", "r", "token", {"n": 2}, after="never-sent")
        )
        assert isinstance(again, JournalAppended) and again.seqs == [2]
        stats = await _stats(peer)
    assert stats["hold_timeouts"] == 1 and stats["held"] == 0


# --- durability and idempotency ----------------------------------------------------------------


async def test_a_redelivered_durable_append_is_stored_once(host: HostProcess) -> None:
    # Before the "crash", the first event of the batch was stored with its key.
    pre = RunJournal(host.instance.journal_dir)
    pre.append("s-redo", "run-redo", "tool_call", {"n": 0}, key="message-1/0")
    pre.close()
    batch = JournalAppend(
        session_id="s-redo",
        run_id="run-redo",
        events=[JournalEvent(event="tool_call", payload={"n": n}) for n in range(3)],
    )
    raw = _RawClient(host.endpoint)
    try:
        first = await raw.append("message-1", batch)
        assert first.seqs == [1, 2, 3] and first.duplicates == 1
        again = await raw.append("message-1", batch)
        assert again.seqs == [1, 2, 3] and again.duplicates == 3
        other = await raw.append("message-2", batch)
        assert other.seqs == [4, 5, 6] and other.duplicates == 0
    finally:
        raw.close()
    events = RunJournal(host.instance.journal_dir).read("s-redo", "run-redo", strict=True)["events"]
    assert [e["payload"]["n"] for e in events] == [0, 1, 2, 0, 1, 2]
    assert [e["key"] for e in events] == [f"message-{m}/{i}" for m in (1, 2) for i in range(3)]


async def test_appends_to_many_runs_in_one_message_are_each_stored_once(
    host: HostProcess,
) -> None:
    """``JournalAppends``: dispatch's feed sends a round's appends, one per run, in one
    durable message (#20). Each is applied as a durable append of its own, keyed
    ``<message id>#<index>/<event>``: a redelivery, whole or torn by a crash after part of
    it was stored, stores nothing twice. An append that fails the checks is refused alone;
    the message is acked, not dead-lettered."""
    pre = RunJournal(host.instance.journal_dir)
    pre.append("s-many-b", "run-b", "token", {"n": 0}, key="many-1#1/0")  # torn by a crash
    pre.close()

    def append(session_id: str, run_id: str, *ns: int) -> JournalAppend:
        events = [JournalEvent(event="token", payload={"n": n}) for n in ns]
        return JournalAppend(session_id=session_id, run_id=run_id, events=events)

    batch = JournalAppends(
        appends=[
            append("s-many-a", "run-a", 0, 1),
            append("s-many-b", "run-b", 0, 1, 2),
            append("../x", "run-x", 0),  # an invalid id: refused alone
            append("s-many-a", "run-c", 0),
        ]
    )
    raw = _RawClient(host.endpoint, "raw-many-client")
    bus = host.status()["host"]["bus"]  # the broker's counters (corral status --json)
    async with open_peer("test-client", host.endpoint, liveness=FAST) as peer:
        start = await _stats(peer)
        try:
            await raw.cast("many-1", batch)
            await raw.cast("many-1", batch)  # a redelivery
            await raw.cast("many-2", JournalAppends(appends=[append("s-many-a", "run-a", 2)]))
        finally:
            raw.close()
        # Reads wait for what was submitted before them.
        stored = {
            run: [(e["payload"]["n"], e["key"]) for e in (await _read(peer, sid, run))["events"]]
            for sid, run in (("s-many-a", "run-a"), ("s-many-b", "run-b"), ("s-many-a", "run-c"))
        }
        stats = await _stats(peer)
    assert stored == {
        "run-a": [(0, "many-1#0/0"), (1, "many-1#0/1"), (2, "many-2#0/0")],
        "run-b": [(0, "many-1#1/0"), (1, "many-1#1/1"), (2, "many-1#1/2")],
        "run-c": [(0, "many-1#3/0")],
    }
    assert stats["rejected"] - start["rejected"] == 2  # the bad append, in each delivery
    assert stats["duplicates"] - start["duplicates"] == 1 + 6
    assert stats["append_messages"] - start["append_messages"] == 3
    with trio.fail_after(10):
        while (row := host.ask("mailboxes", actor="journal")["mailboxes"][0])["in_flight"]:
            await trio.sleep(0.02)
    assert row["queued"] == 0
    assert host.ask("dead_letters")["dead_letters"] == []
    now = host.status()["host"]["bus"]
    assert now["durable"] - bus["durable"] >= 3 and now["commits"] > bus["commits"]


def _numbered(*session_seqs: int) -> list[JournalEvent]:
    return [JournalEvent(event="token", payload={"n": n}, session_seq=n) for n in session_seqs]


async def test_a_redelivery_of_a_complete_message_gets_its_first_answer_whatever_its_seqs(
    host: HostProcess,
) -> None:
    """What the actor keeps of a complete message is its seqs, as compactly as they fit: a
    range when they are consecutive, an array when a replay left a 0 among them. A
    redelivery gets the first answer from either, and stores nothing again."""
    raw = _RawClient(host.endpoint)

    def batch(*seqs: int) -> JournalAppend:
        return JournalAppend(session_id="s-kept", run_id="run-kept", events=_numbered(*seqs))

    try:
        first = await raw.append("kept-1", batch(1, 2, 3))
        assert first.seqs == [1, 2, 3] and first.duplicates == 0
        second = await raw.append("kept-2", batch(2, 3, 4, 5))
        assert second.seqs == [0, 0, 4, 5] and second.duplicates == 2
        for message_id, sent, answer in (
            ("kept-1", (1, 2, 3), first),
            ("kept-2", (2, 3, 4, 5), second),
        ):
            again = await raw.append(message_id, batch(*sent))
            assert again.seqs == answer.seqs and again.duplicates == len(sent)
    finally:
        raw.close()
    events = RunJournal(host.instance.journal_dir).read("s-kept", "run-kept", strict=True)
    assert [e["payload"]["n"] for e in events["events"]] == [1, 2, 3, 4, 5]


async def test_an_event_sent_again_after_a_restart_is_stored_once(host: HostProcess) -> None:
    """Events carry their ``session_seq`` (dispatch's numbering, which a replay keeps): one at
    or below the highest the run holds is dropped, in either durability class, and what the
    run holds is read from its file — as after a restart of the journal actor (the run is
    new to it here) — not from memory. A run written before ``session_seq`` existed stores
    every event."""
    pre = RunJournal(host.instance.journal_dir)
    pre.append("s-replay", "run-replay", "token", {"n": 1024}, session_seq=1024)
    pre.append("s-replay", "run-replay", "token", {"n": 2048}, session_seq=2048)
    pre.append("s-replay", "run-replay", "state", {"n": 0})  # not numbered: no bearing
    pre.append("s-replay", "old-run", "token", {"n": 0})  # version-1 form
    pre.close()
    async with open_peer("test-client", host.endpoint, liveness=FAST) as peer:
        start = await _stats(peer)

        async def send(run_id: str, *seqs: int, durable: bool = False) -> JournalAppended:
            msg = JournalAppend(session_id="s-replay", run_id=run_id, events=_numbered(*seqs))
            reply = await peer.call("journal", msg, durable=durable)
            assert isinstance(reply, JournalAppended)
            return reply

        again = await send("run-replay", 1024, 2048, 3072)
        assert again.seqs == [0, 0, 4] and again.duplicates == 2
        assert (await send("run-replay", 3072, 4096, durable=True)).seqs == [0, 5]
        assert (await send("run-replay", 2048)).seqs == [0]
        assert (await send("old-run", 1, 2)).seqs == [2, 3]
        stats = await _stats(peer)
    events = RunJournal(host.instance.journal_dir).read("s-replay", "run-replay", strict=True)
    assert [e["payload"]["n"] for e in events["events"]] == [1024, 2048, 0, 3072, 4096]
    assert [e.get("session_seq") for e in events["events"]] == [1024, 2048, None, 3072, 4096]
    assert stats["replayed"] - start["replayed"] == 4
    assert stats["duplicates"] == start["duplicates"]


async def test_a_bad_session_seq_does_not_decode(host: HostProcess) -> None:
    async with open_peer("test-client", host.endpoint, liveness=FAST) as peer:
        bad = JournalAppend(
            session_id="s-bad-seq",
            run_id="run",
            events=[JournalEvent(event="token", payload={}, session_seq=0)],
        )
        with pytest.raises(ProtocolError, match=r"session_seq"):
            await peer.call("journal", bad, timeout=5)
    assert not (host.instance.journal_dir / "s-bad-seq").exists()


async def _produce_durable(peer: Peer, session_id: str, run_id: str, messages: int) -> None:
    for n in range(messages):
        events = [JournalEvent(event="state", payload={"n": 2 * n + i}) for i in range(2)]
        msg = JournalAppend(session_id=session_id, run_id=run_id, events=events)
        with trio.fail_after(20):
            await peer.cast("journal", msg, durable=True)


async def test_an_encoded_payload_is_stored_as_it_is_and_checked_like_any(
    host: HostProcess,
) -> None:
    """``payload_json``: dispatch hands each event over JSON-encoded (it has it so for the
    stream), and the journal stores those bytes without decoding them (#20), after checking
    they are one JSON value of bounded depth; one spanning lines is stored on one line; a
    terminal event's encoded payload still decides the run's terminal state."""
    run = "run-json"

    def encoded(event: str, data: bytes) -> JournalEvent:
        return JournalEvent(event=event, payload_json=data)

    async with open_peer("test-client", host.endpoint, liveness=FAST) as peer:
        for bad in (b'{"delta": "x"', b"NaN", b"", b"[1] [2]", json.dumps(_nested(150)).encode()):
            append = JournalAppend(session_id="s-json", run_id=run, events=[encoded("t", bad)])
            assert "JSON" in await _expect(peer, append, "invalid_payload")
        events = [
            encoded("response.output_text.delta", b'{"delta":"h\\u00e9"}'),
            encoded("tool_call", b'{\n  "name": "x",\n  "args": [1, 2]\n}'),
            encoded("error", b'{"type":"cancelled","message":"stop"}'),
        ]
        append = JournalAppend(session_id="s-json", run_id=run, events=events)
        assert (await peer.call("journal", append, durable=True)).seqs == [1, 2, 3]
        stored = (await _read(peer, "s-json", run))["events"]
    assert [e["payload"] for e in stored] == [
        {"delta": "h\u00e9"},
        {"name": "x", "args": [1, 2]},
        {"type": "cancelled", "message": "stop"},
    ]
    assert stored[2]["terminal_state"] == "interrupted-by-user"
    lines = next(host.instance.journal_dir.rglob(f"{run}*")).read_bytes().splitlines()
    assert len(lines) == 3 and b'{"delta":"h\\u00e9"}' in lines[0]


async def _produce_rounds(peer: Peer, runs: list[tuple[str, str]], rounds: int) -> None:
    """What dispatch's feed sends: each round one durable message, two events per run."""
    for n in range(rounds):
        appends = [
            JournalAppend(
                session_id=session_id,
                run_id=run_id,
                events=[JournalEvent(event="state", payload={"n": 2 * n + i}) for i in range(2)],
            )
            for session_id, run_id in runs
        ]
        with trio.fail_after(20):
            await peer.cast("journal", JournalAppends(appends=appends), durable=True)


@pytest.mark.chaos
@pytest.mark.parametrize("sent", ["per_run", "in_rounds"])
async def test_kill9_during_durable_appends_loses_and_duplicates_nothing(
    host: HostProcess, sent: str
) -> None:
    """Durable appends from 20 runs at once, the journal killed a quarter of the way:
    ``per_run`` a ``JournalAppend`` per run and message; ``in_rounds`` what dispatch's feed
    sends, one ``JournalAppends`` a round for every run, a round torn by the kill being
    redelivered and completed (#20)."""
    runs = [(f"crash-{sent}-{n}", f"run-{n}") for n in range(20)]
    messages = 60
    total = len(runs) * messages * 2
    pid = host.actor("journal")["pid"]
    async with open_peer("test-client", host.endpoint, liveness=FAST) as peer:
        async with trio.open_nursery() as nursery:
            if sent == "in_rounds":
                nursery.start_soon(_produce_rounds, peer, runs, messages)
            else:
                for session_id, run_id in runs:
                    nursery.start_soon(_produce_durable, peer, session_id, run_id, messages)
            with trio.fail_after(20):
                while (await _stats(peer))["appends"] < total // 4:
                    await trio.sleep(0.005)
            os.kill(pid, signal.SIGKILL)
            await trio.to_thread.run_sync(
                lambda: host.wait_actor(
                    "journal",
                    lambda a: a["state"] == "running" and a["pid"] not in (None, pid),
                    15,
                    "the journal actor to restart",
                )
            )
        # Every message was accepted by the broker; wait until each was applied.
        with trio.fail_after(30):
            while True:
                row = host.ask("mailboxes", actor="journal")["mailboxes"][0]
                if row["queued"] == row["in_flight"] == 0:
                    break
                await trio.sleep(0.05)
        for session_id, run_id in runs:
            result = await _read(peer, session_id, run_id, strict=True)
            assert result["malformed"] == [] and not result["incomplete_tail"]
            assert [e["payload"]["n"] for e in result["events"]] == list(range(2 * messages)), (
                run_id
            )
            keys = [e["key"] for e in result["events"]]
            assert len(set(keys)) == len(keys)
            assert all(("#" in key) == (sent == "in_rounds") for key in keys)
    journal = host.actor("journal")
    assert journal["restarts"] == 1 and journal["last_exit"]["code"] == -9
    assert host.ask("dead_letters")["dead_letters"] == []


# --- bad input -----------------------------------------------------------------------------------

BAD_IDS = ["../x", "a/b", "", ".", "..", "x" * 201, "sp ace"]


async def _expect(peer: Peer, msg: Any, code: str, *, durable: bool = False) -> str:
    with pytest.raises(RemoteError) as info:
        await peer.call("journal", msg, durable=durable, timeout=5)
    assert info.value.code == code, (msg, str(info.value))
    return str(info.value)


async def test_bad_input_gets_typed_errors_and_leaves_the_journal_intact(
    host: HostProcess,
) -> None:
    dirs = (
        set(os.listdir(host.instance.journal_dir)) if host.instance.journal_dir.exists() else set()
    )
    async with open_peer("test-client", host.endpoint, liveness=FAST) as peer:
        start = await _stats(peer)
        for n in range(2):
            await peer.call("journal", JournalAppend.one("good", "run", "token", {"n": n}))
        before = await _read(peer, "good", "run")
        for bad in BAD_IDS:
            for session_id, run_id in ((bad, "run"), ("good", bad)):
                append = JournalAppend.one(session_id, run_id, "token", {"n": 9})
                await _expect(peer, append, "invalid_id")
                await _expect(peer, append, "invalid_id", durable=True)
                await _expect(peer, JournalRead(session_id=session_id, run_id=run_id), "invalid_id")
                summary = JournalSummary(session_id=session_id, run_id=run_id)
                await _expect(peer, summary, "invalid_id")
            await _expect(peer, JournalSnapshot(run_id=bad), "invalid_id")
            await _expect(peer, JournalList(session_id=bad), "invalid_id")

        empty = JournalAppend(session_id="good", run_id="run", events=[])
        await _expect(peer, empty, "invalid_argument")
        await _expect(peer, JournalAppend.one("good", "run", "  ", {}), "invalid_event")
        for payload in (b"\x00bytes", {1: "int key"}, {"deep": [[[[b"x"]]]]}, _nested(150)):
            message = await _expect(
                peer, JournalAppend.one("good", "run", "token", payload), "invalid_payload"
            )
            assert "JSON" in message
        # One bad event spoils the whole batch: nothing of it is written.
        mixed = JournalAppend(
            session_id="good",
            run_id="run",
            events=[JournalEvent(event="token", payload={"ok": 1}), JournalEvent(event="")],
        )
        await _expect(peer, mixed, "invalid_event", durable=True)
        await _expect(
            peer, JournalRead(session_id="good", run_id="run", after="x"), "invalid_cursor"
        )
        await _expect(
            peer, JournalRead(session_id="good", run_id="run", limit=-1), "invalid_argument"
        )
        # A field of the wrong type does not even decode: the broker refuses it, typed.
        wrong = JournalAppend(session_id="good", run_id=5, events=[])  # type: ignore[arg-type]
        with pytest.raises(ProtocolError, match=r"Expected `str`, got `int` - at `\$\.run_id`"):
            await peer.call("journal", wrong, durable=True, timeout=5)

        assert await _read(peer, "good", "run") == before
        after = await peer.call("journal", JournalAppend.one("good", "run", "token", {"n": 2}))
        assert isinstance(after, JournalAppended) and after.seqs == [3]
        stats = await _stats(peer)
    assert sorted(set(os.listdir(host.instance.journal_dir)) - dirs) == ["good"]
    assert os.listdir(host.instance.journal_dir / "good") == ["run.jsonl"]
    assert not (host.state_dir / "x").exists() and not (host.state_dir.parent / "x").exists()
    assert stats["rejected"] - start["rejected"] >= 4 * len(BAD_IDS)
    assert stats["appends"] - start["appends"] == 3
    assert host.actor("journal")["restarts"] == 0


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


async def test_fsync_policy_and_window_come_from_the_config(host_factory) -> None:
    host = host_factory(
        FAST_LIVENESS + '[actors.journal]\noptions = { fsync = "terminal", window_ms = 2 }\n'
    )
    host.start()
    async with open_peer("test-client", host.endpoint, liveness=FAST) as peer:
        for n in range(5):
            await peer.call("journal", JournalAppend.one("s", "r", "token", {"n": n}))
        assert (await _stats(peer))["fsync_rounds"] == 0  # nothing terminal yet
        await peer.call("journal", JournalAppend.one("s", "r", "done", {}))
        stats = await _stats(peer)
    assert stats["policy"] == "terminal" and stats["fsync_rounds"] == 1
