"""The broker in this process with real sockets: durability, redelivery, nacks, compaction."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing
import zmq

from corral.bus import Broker, Peer, open_peer
from corral.config import BusSettings
from tests._echo import EchoPing, EchoRecord, Every


async def _start(nursery: trio.Nursery, tmp: Path, **settings: object) -> Broker:
    broker = Broker(
        [f"ipc://{tmp}/bus.sock"],
        tmp / "mb.log",
        BusSettings(**settings),
        ctx=zmq.Context.instance(),
    )
    broker.register("worker")
    await nursery.start(broker.run)
    return broker


@asynccontextmanager
async def _small_inbox(nursery: trio.Nursery, tmp: Path) -> AsyncIterator[tuple[Peer, Peer]]:
    """A broker, a ``client`` and a ``worker`` whose inbox holds 100 messages."""
    await _start(nursery, tmp)
    endpoint = f"ipc://{tmp}/bus.sock"
    async with (
        open_peer("client", endpoint, accepts=Every) as client,
        open_peer("worker", endpoint, inbox_size=100, accepts=Every) as worker,
    ):
        yield client, worker


async def _drain(peer, n: int, *, ack: bool = True) -> list:
    got = []
    with trio.fail_after(10):
        while len(got) < n:
            incoming = await peer.inbox.receive()
            got.append(incoming)
            if ack:
                peer.ack(incoming)
    return got


async def test_durable_messages_wait_for_their_recipient(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        broker = await _start(nursery, tmp_path)
        async with open_peer("client", f"ipc://{tmp_path}/bus.sock", accepts=Every) as client:
            for i in range(5):
                await client.cast("worker", EchoRecord(key=str(i)), durable=True)
        assert broker.mailboxes("worker")[0]["queued"] == 5
        async with open_peer("worker", f"ipc://{tmp_path}/bus.sock", accepts=Every) as worker:
            got = await _drain(worker, 5)
            assert [g.msg.key for g in got] == ["0", "1", "2", "3", "4"]
            with trio.fail_after(5):
                while broker.mailboxes("worker")[0]["in_flight"]:
                    await trio.sleep(0.01)
        nursery.cancel_scope.cancel()


async def test_restarted_recipient_gets_unacked_messages_again(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        broker = await _start(nursery, tmp_path)
        async with open_peer("client", f"ipc://{tmp_path}/bus.sock", accepts=Every) as client:
            async with open_peer("worker", f"ipc://{tmp_path}/bus.sock", accepts=Every) as worker:
                for i in range(3):
                    await client.cast("worker", EchoRecord(key=str(i)), durable=True)
                first = await _drain(worker, 3, ack=False)
                assert all(g.env.attempt == 1 for g in first)
            # A new incarnation of the same name: everything unacked comes back, in order.
            async with open_peer("worker", f"ipc://{tmp_path}/bus.sock", accepts=Every) as worker:
                again = await _drain(worker, 3)
                assert [g.env.id for g in again] == [g.env.id for g in first]
                assert [g.env.attempt for g in again] == [2, 1, 1]
        assert broker.mailboxes("worker")[0]["redelivered"] == 3
        nursery.cancel_scope.cancel()


async def test_nacked_message_is_retried_then_dead_lettered(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        broker = await _start(nursery, tmp_path, max_attempts=3)
        async with (
            open_peer("client", f"ipc://{tmp_path}/bus.sock", accepts=Every) as client,
            open_peer("worker", f"ipc://{tmp_path}/bus.sock", accepts=Every) as worker,
        ):
            await client.cast("worker", EchoRecord(key="poison"), durable=True)
            attempts = []
            for _ in range(3):
                incoming = await _drain(worker, 1, ack=False)
                attempts.append(incoming[0].env.attempt)
                await worker.nack(incoming[0], "ValueError: bad")
            with trio.fail_after(5):
                while not broker.dead_letters():
                    await trio.sleep(0.01)
        assert attempts == [1, 2, 3]
        (dead,) = broker.dead_letters()
        assert dead["attempts"] == 3 and "ValueError: bad" in dead["error"]
        assert dead["type"] == "echo.record"
        nursery.cancel_scope.cancel()


async def test_a_held_message_is_not_charged_for_its_recipients_restarts(tmp_path: Path) -> None:
    """A message its recipient holds (its own work on it done, waiting on another process:
    a turn's start) comes back after every restart without counting an attempt; the restart
    is charged to the oldest one it had not said so of, which is dead-lettered in the end."""
    endpoint = f"ipc://{tmp_path}/bus.sock"
    async with trio.open_nursery() as nursery:
        broker = await _start(nursery, tmp_path, max_attempts=3)
        box = broker._store.mailbox("worker")
        async with open_peer("client", endpoint, accepts=Every) as client:
            await client.cast("worker", EchoRecord(key="held"), durable=True)
            await client.cast("worker", EchoRecord(key="handled"), durable=True)
        seen: list[tuple[str, int]] = []
        for _ in range(3):
            async with open_peer("worker", endpoint, accepts=Every) as worker:
                got = await _drain(worker, 2, ack=False)
                seen += [(g.msg.key, g.env.attempt) for g in got]
                await worker.hold(got[0])
                with trio.fail_after(5):
                    while not box.in_flight[got[0].env.id].held:
                        await trio.sleep(0.01)
        async with open_peer("worker", endpoint, accepts=Every) as worker:
            (last,) = await _drain(worker, 1)
            seen.append((last.msg.key, last.env.attempt))
        assert [a for k, a in seen if k == "held"] == [1, 1, 1, 1]
        assert [a for k, a in seen if k == "handled"] == [1, 2, 3]
        (dead,) = broker.dead_letters()
        assert dead["type"] == "echo.record" and "gave up after 3 attempts" in dead["error"]
        nursery.cancel_scope.cancel()


async def test_log_is_compacted_and_recovers(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        broker = await _start(nursery, tmp_path, compact_min_bytes=20_000)
        async with (
            open_peer("client", f"ipc://{tmp_path}/bus.sock", accepts=Every) as client,
            open_peer("worker", f"ipc://{tmp_path}/bus.sock", accepts=Every) as worker,
        ):
            for i in range(600):
                await client.cast("worker", EchoRecord(key=f"{i:04}" * 10), durable=True)
            await _drain(worker, 600)
            await worker.flush()
            # One more, never acked: it must survive compaction and a restart.
            await client.cast("worker", EchoRecord(key="keep"), durable=True)
            await _drain(worker, 1, ack=False)
            with trio.fail_after(10):
                while broker.stats["compactions"] == 0:
                    await trio.sleep(0.02)
        size = (tmp_path / "mb.log").stat().st_size
        nursery.cancel_scope.cancel()
    assert size < 45_000, "compacted (600 uncompacted puts and acks are > 80 kB)"
    async with trio.open_nursery() as nursery:
        broker = await _start(nursery, tmp_path)
        row = broker.mailboxes("worker")[0]
        assert row["queued"] == 1
        async with open_peer("worker", f"ipc://{tmp_path}/bus.sock", accepts=Every) as worker:
            (last,) = await _drain(worker, 1)
            assert last.msg == EchoRecord(key="keep")
        nursery.cancel_scope.cancel()


async def test_acks_are_lazily_durable_but_never_lost_from_memory(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        broker = await _start(nursery, tmp_path)
        async with (
            open_peer("client", f"ipc://{tmp_path}/bus.sock", accepts=Every) as client,
            open_peer("worker", f"ipc://{tmp_path}/bus.sock", accepts=Every) as worker,
        ):
            await client.cast("worker", EchoRecord(key="a"), durable=True)
            await _drain(worker, 1)
            await worker.flush()
            with trio.fail_after(5):
                while broker.mailboxes("worker")[0]["in_flight"]:
                    await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    async with trio.open_nursery() as nursery:
        broker = await _start(nursery, tmp_path)
        assert broker.mailboxes("worker")[0]["queued"] == 0
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("durable", [False, True])
async def test_message_to_a_name_nobody_knows(tmp_path: Path, durable: bool) -> None:
    from corral import Unreachable

    async with trio.open_nursery() as nursery:
        await _start(nursery, tmp_path)
        async with open_peer("client", f"ipc://{tmp_path}/bus.sock", accepts=Every) as client:
            with pytest.raises(Unreachable):
                await client.call("nobody", EchoPing(text="?"), durable=durable, timeout=5)
        nursery.cancel_scope.cancel()


async def test_a_started_peer_is_known_to_the_broker(tmp_path: Path) -> None:
    """``open_peer`` returns once the broker has taken the peer's hello (its Welcome came),
    so a stream message sent to it at once is routed, not refused as unreachable."""
    async with trio.open_nursery() as nursery:
        broker = await _start(nursery, tmp_path)
        endpoint = f"ipc://{tmp_path}/bus.sock"
        for round_ in range(20):
            async with open_peer(f"p{round_}", endpoint, accepts=Every):
                assert broker.last_seen(f"p{round_}") is not None
        nursery.cancel_scope.cancel()


async def test_a_peer_started_before_its_broker_still_starts(tmp_path: Path) -> None:
    """A broker that does not answer the hello is not waited for past the request timeout."""
    endpoint = f"ipc://{tmp_path}/bus.sock"
    with trio.fail_after(5):
        async with (
            open_peer("early", endpoint, bus=BusSettings(request_timeout_s=0.2), accepts=Every),
            trio.open_nursery() as nursery,
        ):
            broker = await _start(nursery, tmp_path)
            # The hello was queued by the socket and reaches the broker once it binds.
            while broker.last_seen("early") is None:
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()


async def test_a_call_waits_for_room_in_a_full_socket(tmp_path: Path) -> None:
    """A call sends without a scheduler pass when the socket takes its frame at once; when
    the socket is full (here: no broker yet, and its queue at the high-water mark) it waits
    for room, as any send does, rather than failing."""
    endpoint = f"ipc://{tmp_path}/bus.sock"
    settings = BusSettings(hwm=10, request_timeout_s=0.2)
    async with open_peer("early", endpoint, bus=settings, accepts=Every) as peer:
        with pytest.raises(trio.WouldBlock):
            for _ in range(1000):
                peer.send_nowait("nobody", EchoPing(text="filler"))
        answers: list[object] = []
        answered = trio.Event()
        async with trio.open_nursery() as nursery:

            async def ask() -> None:
                answers.append(await peer.parked(timeout=10))
                answered.set()

            nursery.start_soon(ask)
            await trio.testing.wait_all_tasks_blocked()
            assert answers == []
            await _start(nursery, tmp_path)
            with trio.fail_after(10):
                await answered.wait()
            nursery.cancel_scope.cancel()
        assert answers == [[]]


async def test_a_call_to_an_actor_still_starting_waits_for_its_hello(tmp_path: Path) -> None:
    """Actors start together: a stream call to one whose process has not said hello yet is
    held by the broker and delivered, in order, when it does."""
    from tests._echo import EchoPong

    async with trio.open_nursery() as nursery:
        broker = await _start(nursery, tmp_path)
        broker.starting("late")
        endpoint = f"ipc://{tmp_path}/bus.sock"
        async with open_peer("client", endpoint, accepts=Every) as client:
            replies = []

            async def ask(text: str) -> None:
                replies.append(await client.call("late", EchoPing(text=text), timeout=10))

            async with trio.open_nursery() as callers:
                callers.start_soon(ask, "first")
                with trio.fail_after(5):
                    while len(broker._held["late"]) < 1:
                        await trio.sleep(0.01)
                await client.cast("late", EchoPing(text="second"))
                while len(broker._held["late"]) < 2:
                    await trio.sleep(0.01)
                async with open_peer("late", endpoint, accepts=Every) as late:
                    first, second = await _drain(late, 2)
                    assert [first.msg.text, second.msg.text] == ["first", "second"]
                    await late.reply(first, EchoPong(text="hello"))
            assert replies == [EchoPong(text="hello")]
            assert "late" not in broker._held, "held only until the first hello"
        nursery.cancel_scope.cancel()


async def test_a_restarting_actor_gets_what_was_sent_to_it_meanwhile(tmp_path: Path) -> None:
    """Between an actor's exit and its new incarnation's hello, stream messages to it are
    held (a turn's deltas must survive a restart of dispatch); replies are not, since
    their caller died."""
    async with trio.open_nursery() as nursery:
        broker = await _start(nursery, tmp_path)
        endpoint = f"ipc://{tmp_path}/bus.sock"
        broker.starting("w")
        async with open_peer("client", endpoint, accepts=Every) as client:
            async with (
                open_peer("w", endpoint, accepts=Every) as first,
                trio.open_nursery() as calls,
            ):
                calls.start_soon(first.call, "client", EchoPing(text="asked by the first"))
                with trio.fail_after(5):
                    request = await client.inbox.receive()
                calls.cancel_scope.cancel()
            broker.peer_down("w")  # the supervisor saw it exit ...
            broker.starting("w")  # ... and spawns it again
            await client.reply(request, EchoPing(text="too late"))
            await client.cast("w", EchoRecord(key="meanwhile"))
            with trio.fail_after(5):
                while len(broker._held["w"]) < 1:
                    await trio.sleep(0.01)
            async with open_peer("w", endpoint, accepts=Every) as second:
                (got,) = await _drain(second, 1)
                assert got.msg == EchoRecord(key="meanwhile")
                assert len(second.inbox) == 0, "the reply was not held for the new one"
        nursery.cancel_scope.cancel()


async def test_what_waits_for_a_starting_actor_is_bounded(tmp_path: Path) -> None:
    from corral import Unreachable

    async with trio.open_nursery() as nursery:
        broker = await _start(nursery, tmp_path, max_backlog=2)
        broker.starting("late")
        async with open_peer("client", f"ipc://{tmp_path}/bus.sock", accepts=Every) as client:
            for key in ("a", "b"):
                await client.cast("late", EchoRecord(key=key))
            with pytest.raises(Unreachable, match="is starting and 2 messages wait for it"):
                await client.call("late", EchoPing(text="one too many"), timeout=5)
            assert len(broker._held["late"]) == 2, "the refused call was not held"
        nursery.cancel_scope.cancel()


async def test_a_call_to_an_actor_that_dies_before_its_hello_is_refused(tmp_path: Path) -> None:
    from corral import Unreachable

    async with trio.open_nursery() as nursery:
        broker = await _start(nursery, tmp_path)
        broker.starting("doomed")
        async with open_peer("client", f"ipc://{tmp_path}/bus.sock", accepts=Every) as client:

            async def exit_soon() -> None:
                with trio.fail_after(5):
                    while not broker._held["doomed"]:
                        await trio.sleep(0.01)
                broker.peer_down("doomed")

            nursery.start_soon(exit_soon)
            with pytest.raises(Unreachable, match="exited before it started"):
                await client.call("doomed", EchoPing(text="?"), timeout=5)
            # Once down, a call is refused at once, as for any peer that is not running.
            with pytest.raises(Unreachable, match="no running peer"):
                await client.call("doomed", EchoPing(text="?"), timeout=5)
        nursery.cancel_scope.cancel()


async def test_a_full_inbox_stops_reading_unless_its_owner_awaits_a_reply(
    tmp_path: Path,
) -> None:
    """A flood past the inbox's bound waits in the broker (backpressure, nothing lost)."""
    from tests._echo import EchoCount

    async with trio.open_nursery() as nursery, _small_inbox(nursery, tmp_path) as (client, worker):
        await client.cast_many("worker", [EchoCount(n=i) for i in range(5000)])
        with trio.fail_after(10):
            while len(worker.inbox) < 100:
                await trio.sleep(0.01)
        # Reading stopped at the bound...
        with trio.move_on_after(0.3):
            while len(worker.inbox) <= 100:
                await trio.sleep(0.01)
        assert len(worker.inbox) == 100
        got = await _drain(worker, 5000)
        # ... and every message came, in order.
        assert [g.msg.n for g in got] == list(range(5000))
        assert worker.stats["dropped"] == 0
        nursery.cancel_scope.cancel()


async def test_a_full_inbox_never_stalls_an_owner_awaiting_a_reply(tmp_path: Path) -> None:
    """The owner awaits a reply queued behind a flood: the peer keeps reading; past four
    times its bound it drops stream messages (a caller is told at once), never durable ones,
    and accounts for every message."""
    from corral import Unreachable
    from tests._echo import EchoCount, EchoPong

    async with trio.open_nursery() as nursery, _small_inbox(nursery, tmp_path) as (client, worker):
        answered = trio.Event()

        async def owner_waits() -> None:
            await worker.call("client", EchoPing(text="hold"), timeout=10)
            answered.set()

        nursery.start_soon(owner_waits)
        with trio.fail_after(10):
            hold = await client.inbox.receive()
            await client.cast_many("worker", [EchoCount(n=i) for i in range(5000)])
            with pytest.raises(Unreachable, match="overloaded"):
                await client.call("worker", EchoPing(text="?"), timeout=5)
            await client.cast("worker", EchoRecord(key="x"), durable=True)
            while len(worker.inbox) + worker.stats["dropped"] < 5002:
                await trio.sleep(0.01)
            await client.reply(hold, EchoPong(text="go"))
            await answered.wait()
        got = []
        while True:
            try:
                got.append(worker.inbox.receive_nowait())
            except trio.WouldBlock:
                break
        counts = [g.msg.n for g in got if isinstance(g.msg, EchoCount)]
        assert len(counts) + worker.stats["dropped"] == 5000 + 1, "and the call"
        assert len(got) == 4 * 100 + 1, "the durable one came past the hard limit"
        assert counts == list(range(len(counts)))
        assert got[-1].msg == EchoRecord(key="x")
        nursery.cancel_scope.cancel()


async def test_durable_message_reaches_its_recipient_while_its_commit_runs(
    tmp_path: Path,
) -> None:
    """Only the sender's Accepted waits for the fsync; the log still orders cause before effect."""
    import threading

    release = threading.Event()
    async with trio.open_nursery() as nursery:
        broker = await _start(nursery, tmp_path)
        write = broker._store._write_sync

        def slow_write(data: bytes) -> None:
            release.wait(10)
            write(data)

        broker._store._write_sync = slow_write  # type: ignore[method-assign]
        endpoint = f"ipc://{tmp_path}/bus.sock"
        async with (
            open_peer("client", endpoint, accepts=Every) as client,
            open_peer("worker", endpoint, accepts=Every) as worker,
        ):
            accepted = {"acked": trio.Event(), "kept": trio.Event()}

            async def send(key: str) -> None:
                await client.cast("worker", EchoRecord(key=key), durable=True)
                accepted[key].set()

            nursery.start_soon(send, "acked")
            (first,) = await _drain(worker, 1)
            assert first.msg == EchoRecord(key="acked")
            await worker.flush()
            assert not accepted["acked"].is_set(), "Accepted must wait for the commit"
            nursery.start_soon(send, "kept")
            await _drain(worker, 1, ack=False)
            release.set()
            with trio.fail_after(10):
                for event in accepted.values():
                    await event.wait()
                while broker.mailboxes("worker")[0]["in_flight"] != 1:
                    await trio.sleep(0.01)
                while broker._store._pending:
                    await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    async with trio.open_nursery() as nursery:
        broker = await _start(nursery, tmp_path)
        row = broker.mailboxes("worker")[0]
        assert row["queued"] == 1, "the acked one stays acked, the unacked one comes back"
        async with open_peer("worker", endpoint, accepts=Every) as worker:
            (again,) = await _drain(worker, 1)
            assert again.msg == EchoRecord(key="kept")
        nursery.cancel_scope.cancel()


async def test_parking_and_unparking_tell_the_owner(tmp_path: Path) -> None:
    """``on_parked`` fires on each park and unpark: the host bumps its change counter on it,
    which wakes a ``wait`` for ``corral elicitations``."""
    async with trio.open_nursery() as nursery:
        broker = await _start(nursery, tmp_path)
        changed = trio.Event()
        broker.on_parked = changed.set
        endpoint = f"ipc://{tmp_path}/bus.sock"
        async with (
            open_peer("client", endpoint, accepts=Every) as client,
            open_peer("worker", endpoint, accepts=Every) as worker,
        ):
            await client.cast("worker", EchoRecord(key="ask"), durable=True)
            (incoming,) = await _drain(worker, 1, ack=False)
            await worker.park(incoming)
            with trio.fail_after(5):
                await changed.wait()
            assert [row["state"] for row in broker.parked()] == ["parked"]
            changed = trio.Event()
            broker.on_parked = changed.set
            await worker.unpark(incoming.env.id, "resolved")
            with trio.fail_after(5):
                await changed.wait()
            assert [row["state"] for row in broker.parked()] == ["resolved"]
        nursery.cancel_scope.cancel()


async def test_a_call_whose_callee_exits_before_answering_fails_at_once(tmp_path: Path) -> None:
    """A stream call the callee took and never answered fails ``unreachable`` as soon as the
    supervisor reports the callee's exit (``peer_down``), not at the caller's deadline; a call
    already answered is forgotten, so its caller hears nothing more."""
    from corral import Unreachable
    from tests._echo import EchoPong

    async with trio.open_nursery() as nursery:
        broker = await _start(nursery, tmp_path)
        broker.exit_reason = lambda name: "killed by signal 9 (SIGKILL)"
        endpoint = f"ipc://{tmp_path}/bus.sock"
        async with (
            open_peer("client", endpoint, accepts=Every) as client,
            open_peer("worker", endpoint, accepts=Every) as worker,
        ):

            async def answer_first_then_die() -> None:
                first = await worker.inbox.receive()
                await worker.reply(first, EchoPong(text="one"))
                await worker.inbox.receive()  # taken, never answered
                broker.peer_down("worker")

            nursery.start_soon(answer_first_then_die)
            assert await client.call("worker", EchoPing(text="one"), timeout=5) == EchoPong(
                text="one"
            )
            with trio.fail_after(5):  # far below the call's own 60 s deadline
                with pytest.raises(Unreachable, match=r"exited before it answered .*SIGKILL"):
                    await client.call("worker", EchoPing(text="two"), timeout=60)
        nursery.cancel_scope.cancel()
