"""Stream messages sent together travel as bundles: one frame per run, unpacked in order."""

from __future__ import annotations

from pathlib import Path

import trio
import zmq

from corral.bus import Broker, Bundle, open_peer
from corral.bus._bundle import BUNDLE_MAX
from corral.bus._codec import encode_body, encode_envelope
from corral.bus._messages import Envelope, new_id
from corral.config import BusSettings
from tests._echo import EchoCount, EchoRecord, Every


async def _broker(nursery: trio.Nursery, tmp: Path) -> Broker:
    broker = Broker(
        [f"ipc://{tmp}/bus.sock"], tmp / "mb.log", BusSettings(), ctx=zmq.Context.instance()
    )
    await nursery.start(broker.run)
    return broker


async def _connected(a, b) -> None:
    """Stream messages go only to a peer the broker has heard from: a round trip to the
    broker follows each peer's hello on its socket."""
    await a.parked()
    await b.parked()


async def _take(peer, n: int) -> list:
    got = []
    with trio.fail_after(10):
        while len(got) < n:
            got.append(await peer.inbox.receive())
    return got


async def test_a_run_of_stream_messages_is_routed_as_few_bundles(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        broker = await _broker(nursery, tmp_path)
        endpoint = f"ipc://{tmp_path}/bus.sock"
        async with (
            open_peer("a", endpoint, accepts=Every) as a,
            open_peer("b", endpoint, accepts=Every) as b,
        ):
            await _connected(a, b)
            routed = broker.stats["routed"]
            await a.cast_many("b", [EchoCount(n=i) for i in range(2000)], session_id="s")
            got = await _take(b, 2000)
            assert [g.msg.n for g in got] == list(range(2000))
            assert all(g.env.sender == "a" and g.env.session_id == "s" for g in got)
            assert len({g.env.id for g in got}) == 2000, "each message keeps its own id"
            assert broker.stats["routed"] - routed == -(-2000 // BUNDLE_MAX)
            assert b.stats["received"] >= 2000
        nursery.cancel_scope.cancel()


async def test_bundles_respect_the_size_limit(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        await _broker(nursery, tmp_path)
        endpoint = f"ipc://{tmp_path}/bus.sock"
        async with (
            open_peer("a", endpoint, accepts=Every) as a,
            open_peer("b", endpoint, accepts=Every) as b,
        ):
            await _connected(a, b)
            big = "x" * (a.bus.max_message_bytes // 3)
            await a.cast_many("b", [EchoRecord(key=f"{i}{big}") for i in range(7)])
            got = await _take(b, 7)
            assert [g.msg.key[0] for g in got] == [str(i) for i in range(7)]
        nursery.cancel_scope.cancel()


async def test_a_bundle_cannot_speak_for_another_sender(tmp_path: Path) -> None:
    """Only the outer envelope's sender is checked by the broker, so the peer checks that
    every item has the same sender — and is a stream message."""
    async with trio.open_nursery() as nursery:
        await _broker(nursery, tmp_path)
        endpoint = f"ipc://{tmp_path}/bus.sock"
        async with (
            open_peer("a", endpoint, accepts=Every) as a,
            open_peer("b", endpoint, accepts=Every) as b,
        ):
            await _connected(a, b)

            def item(sender: str, n: int, durability: str = "stream") -> bytes:
                env = Envelope(
                    id=new_id(),
                    sender=sender,
                    recipient="b",
                    type="echo.count",
                    body=encode_body(EchoCount(n=n)),
                    durability=durability,  # type: ignore[arg-type]
                )
                return encode_envelope(env)

            frames = [item("a", 1), item("mallory", 2), item("a", 3, "durable"), item("a", 4)]
            await a.cast("b", Bundle(frames=frames))
            got = await _take(b, 2)
            assert [g.msg.n for g in got] == [1, 4]
            with trio.move_on_after(0.2):
                extra = await b.inbox.receive()
                raise AssertionError(f"unexpected {extra}")
        nursery.cancel_scope.cancel()
