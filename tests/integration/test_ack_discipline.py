"""The actor runtime's one ack discipline, in this process with a real broker and sockets.

A handler's durable message is acked when it returns and nacked (redelivered, counted toward
dead-lettering) when it raises; a deferred one is resolved through its handle, exactly once;
an in-order job that raises nacks the handles it carries; a per-key queue goes away once it
drains; a message left deferred past ``[bus] stuck_after_s`` shows as stuck.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import zmq

from corral.actors._actor import ActorContext
from corral.bus import Broker, Dedup, Peer, open_peer
from corral.config import BusSettings
from tests._defer import DeferActor, DeferFailOnce, DeferHold, DeferRaise


@asynccontextmanager
async def _running(tmp: Path, **settings: Any) -> AsyncIterator[tuple[Broker, Peer, DeferActor]]:
    """A broker, a ``client`` peer and the defer actor (as ``defer``) serving."""
    endpoint = f"ipc://{tmp}/bus.sock"
    bus = BusSettings(**settings)
    broker = Broker([endpoint], tmp / "mb.log", bus, ctx=zmq.Context.instance())
    broker.register("defer")
    async with trio.open_nursery() as nursery:
        await nursery.start(broker.run)
        async with (
            open_peer("client", endpoint, bus=bus) as client,
            open_peer("defer", endpoint, bus=bus, accepts=DeferActor.inbound()) as peer,
        ):
            actor = DeferActor(ActorContext("defer", tmp / "state", {}), peer)
            nursery.start_soon(actor.serve)
            yield broker, client, actor
        nursery.cancel_scope.cancel()


async def _until(predicate: Callable[[], Any], timeout: float = 10) -> Any:
    with trio.fail_after(timeout):
        while not (value := predicate()):
            await trio.sleep(0.01)
    return value


def _row(broker: Broker) -> dict[str, Any]:
    row: dict[str, Any] = broker.mailboxes("defer", peek=5)[0]
    return row


def _records(actor: DeferActor) -> list[str]:
    return Dedup(actor.ctx.data_dir / "records.log").notes()


async def test_a_handler_that_raises_nacks_and_its_message_comes_again(tmp_path: Path) -> None:
    async with _running(tmp_path) as (broker, client, actor):
        await client.cast("defer", DeferRaise(key="k"), durable=True)
        await _until(lambda: _records(actor) == ["k"])
        await _until(lambda: _row(broker)["in_flight"] == 0)
        assert _row(broker)["redelivered"] == 1
        assert _row(broker)["dead_letters"] == 0


async def test_a_failing_in_order_job_nacks_the_message_it_deferred(tmp_path: Path) -> None:
    """Before: the runtime logged the failed job and dropped it, and its message stayed in
    flight until the actor restarted; now it is nacked, redelivered, and handled."""
    async with _running(tmp_path) as (broker, client, actor):
        await client.cast("defer", DeferFailOnce(key="k"), durable=True)
        await _until(lambda: _records(actor) == ["k"])
        await _until(lambda: _row(broker)["in_flight"] == 0)
        assert _row(broker)["redelivered"] == 1
        assert actor.snapshot()["deferred"] == 0


async def test_a_job_that_always_fails_ends_dead_lettered(tmp_path: Path) -> None:
    async with _running(tmp_path, max_attempts=1) as (broker, client, actor):
        await client.cast("defer", DeferFailOnce(key="k"), durable=True)
        await _until(lambda: _row(broker)["dead_letters"] == 1)
        assert _row(broker)["in_flight"] == 0
        assert _records(actor) == []


async def test_a_handle_resolves_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async with _running(tmp_path) as (broker, client, actor):
        await client.cast("defer", DeferHold(), durable=True)
        await _until(lambda: actor.held)
        handle = actor.held[0]
        assert actor.snapshot()["deferred"] == 1
        assert _row(broker)["in_flight"] == 1
        sent: list[str] = []
        ack = actor.peer.ack
        actor.peer.ack = lambda incoming: (sent.append(incoming.env.id), ack(incoming))  # type: ignore[method-assign]
        with caplog.at_level(logging.ERROR, logger="corral.actors"):
            handle.ack()
            handle.ack()
            await handle.nack("too late")
        assert sent == [handle.incoming.env.id]
        assert handle.resolution == "ack"
        twice = [r for r in caplog.records if "resolved twice" in r.getMessage()]
        assert len(twice) == 1
        assert actor.snapshot()["deferred"] == 0
        await _until(lambda: _row(broker)["in_flight"] == 0)


async def test_only_the_message_being_handled_can_be_deferred(tmp_path: Path) -> None:
    async with _running(tmp_path) as (_broker, client, actor):
        await client.cast("defer", DeferHold(), durable=True)
        await _until(lambda: actor.held)
        with pytest.raises(RuntimeError, match="not being handled"):
            actor.defer(actor.held[0].incoming)


async def test_a_deferred_message_past_the_bound_shows_as_stuck(tmp_path: Path) -> None:
    async with _running(tmp_path, stuck_after_s=0.2) as (broker, client, actor):
        await client.cast("defer", DeferHold(), durable=True)
        await _until(lambda: actor.held)
        assert _row(broker)["stuck"] == 0  # deferred, but not for long yet
        row = await _until(lambda: (r := _row(broker))["stuck"] == 1 and r)
        assert row["in_flight"] == 1
        assert [p["state"] for p in row["peek"]] == ["stuck"]
        # The broker counts from its delivery, the actor from its defer a little later (5 ms
        # under load): the actor's age is near the bound, not necessarily past it.
        assert actor.snapshot()["oldest_deferred_s"] >= 0.15
        actor.held[0].ack()
        await _until(lambda: _row(broker)["in_flight"] == 0)
        assert _row(broker)["stuck"] == 0


async def test_in_order_queues_are_reclaimed_over_10000_sessions(tmp_path: Path) -> None:
    """Bounded memory: one queue (a task and an entry) per key only while it has work."""
    async with _running(tmp_path) as (_broker, _client, actor):
        await _until(lambda: actor.nursery is not None)
        nursery = actor.nursery
        assert nursery is not None
        baseline = len(nursery.child_tasks)
        done = trio.Event()
        ran: list[str] = []

        async def job(key: str) -> None:
            ran.append(key)
            await trio.lowlevel.checkpoint()
            if len(ran) == 20_000:
                done.set()

        for n in range(10_000):
            key = f"session-{n}"
            actor.in_order(key, lambda key=key: job(key))
            actor.in_order(key, lambda key=key: job(key))
        assert len(actor._queues) == 10_000
        with trio.fail_after(30):
            await done.wait()
        await _until(lambda: len(nursery.child_tasks) == baseline)
        assert actor._queues == {}
        assert actor.snapshot()["queues"] == 0


async def test_a_job_queued_while_its_queue_drains_runs_after_the_earlier_ones(
    tmp_path: Path,
) -> None:
    async with _running(tmp_path) as (_broker, _client, actor):
        await _until(lambda: actor.nursery is not None)
        order: list[str] = []
        finished = trio.Event()

        async def first() -> None:
            order.append("first")
            # Queued while the queue runs its last job: it must still come after this one.
            actor.in_order("s", second)

        async def second() -> None:
            order.append("second")

        async def third() -> None:
            order.append("third")
            finished.set()

        actor.in_order("s", first)
        await _until(lambda: "s" not in actor._queues)
        actor.in_order("s", third)  # a new queue, after the old one is gone
        with trio.fail_after(10):
            await finished.wait()
        assert order == ["first", "second", "third"]
        await _until(lambda: "s" not in actor._queues)
