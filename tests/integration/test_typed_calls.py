"""Typed calls and opaque bodies over a real broker and real sockets, in this process.

A call's reply is decoded against the type its request declares (``Request[R]``), so a reply
of another type, or one that does not decode, fails that call with a typed error. The broker
forwards bodies without decoding them: what a recipient does not declare, or cannot decode,
the recipient rejects, and the broker dead-letters it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import zmq

from corral import ProtocolError, UnexpectedReply
from corral.bus import Broker, Envelope, Message, Peer, encode_envelope, new_id, open_peer
from corral.config import BusSettings
from tests._echo import EchoPing, EchoPong, EchoRecord, Every


class BadSleep(Message, tag="echo.sleep"):
    """An ``echo.sleep`` whose ``seconds`` is a string: a body its recipient cannot decode."""

    seconds: str


@asynccontextmanager
async def _bus(tmp: Path, accepts: object = Every) -> AsyncIterator[tuple[Broker, Peer, Peer]]:
    """A broker, a ``client`` and a ``worker`` that decodes ``accepts``."""
    endpoint = f"ipc://{tmp}/bus.sock"
    broker = Broker([endpoint], tmp / "mb.log", BusSettings(), ctx=zmq.Context.instance())
    broker.register("worker")
    async with trio.open_nursery() as nursery:
        await nursery.start(broker.run)
        async with (
            open_peer("client", endpoint) as client,
            open_peer("worker", endpoint, accepts=accepts) as worker,
        ):
            yield broker, client, worker
        nursery.cancel_scope.cancel()


async def _answer_with(worker: Peer, answer: Callable[[Envelope], bytes]) -> None:
    """Answer the first request the worker gets with the frame ``answer`` makes of it."""
    incoming = await worker.inbox.receive()
    await worker._sock().send([answer(incoming.env)])


def _reply_frame(request: Envelope, tag: str, body: dict[str, Any]) -> bytes:
    return encode_envelope(
        Envelope(
            id=new_id(),
            sender="worker",
            recipient=request.sender,
            type=tag,
            body=msgspec.Raw(msgspec.msgpack.encode({"type": tag, **body})),
            correlation_id=request.id,
        )
    )


async def _until(predicate: Callable[[], Any], timeout: float = 5) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.01)


async def test_a_call_returns_the_reply_its_request_declares(tmp_path: Path) -> None:
    async with _bus(tmp_path) as (_, client, worker), trio.open_nursery() as nursery:
        nursery.start_soon(
            _answer_with, worker, lambda env: _reply_frame(env, "echo.pong", {"text": "hi"})
        )
        reply: EchoPong = await client.call("worker", EchoPing(text="hi"), timeout=5)
        assert reply == EchoPong(text="hi")


async def test_a_reply_of_another_type_fails_the_call_with_unexpected_reply(
    tmp_path: Path,
) -> None:
    async with _bus(tmp_path) as (_, client, worker), trio.open_nursery() as nursery:
        nursery.start_soon(
            _answer_with, worker, lambda env: _reply_frame(env, "echo.count_reply", {"count": 1})
        )
        with pytest.raises(
            UnexpectedReply,
            match=r"^'worker' answered 'echo\.ping' with 'echo\.count_reply', not 'echo\.pong'$",
        ):
            await client.call("worker", EchoPing(text="hi"), timeout=5)


async def test_a_reply_that_does_not_decode_fails_the_call_with_protocol_error(
    tmp_path: Path,
) -> None:
    async with _bus(tmp_path) as (_, client, worker), trio.open_nursery() as nursery:
        nursery.start_soon(
            _answer_with, worker, lambda env: _reply_frame(env, "echo.pong", {"text": 5})
        )
        with pytest.raises(ProtocolError, match=r"Expected `str`, got `int` - at `\$\.text`"):
            await client.call("worker", EchoPing(text="hi"), timeout=5)


async def test_a_type_its_recipient_does_not_declare_is_rejected_there(tmp_path: Path) -> None:
    """The broker decodes no body it forwards; the recipient, which declares only
    ``echo.record``, rejects the ping: the caller gets ``protocol_error`` at once and the
    broker dead-letters the message under its own type."""
    async with _bus(tmp_path, accepts=EchoRecord) as (broker, client, worker):
        with pytest.raises(ProtocolError, match=r"^unknown message type 'echo\.ping'$"):
            await client.call("worker", EchoPing(text="hi"), timeout=5)
        await _until(broker.dead_letters)
        (dead,) = broker.dead_letters()
        assert (dead["actor"], dead["type"]) == ("worker", "echo.ping")
        assert worker.stats["errors"] == 1
        assert len(worker.inbox) == 0


async def test_the_broker_stores_and_forwards_a_durable_body_it_cannot_decode(
    tmp_path: Path,
) -> None:
    """Stored and delivered (the broker never decodes it), rejected by its recipient, then
    dead-lettered: nothing stays queued or in flight."""
    async with _bus(tmp_path) as (broker, client, worker):
        # The acceptance and the recipient's rejection race: the cast either returns or
        # raises the rejection.
        with contextlib.suppress(ProtocolError):
            await client.cast("worker", BadSleep(seconds="soon"), durable=True, timeout=5)
        await _until(broker.dead_letters)
        (dead,) = broker.dead_letters()
        assert (dead["actor"], dead["type"]) == ("worker", "echo.sleep")
        assert "Expected `float`, got `str` - at `$.seconds`" in dead["error"]
        assert worker.stats["errors"] == 1, "delivered, and rejected by the recipient"
        row = broker.mailboxes("worker")[0]
        assert row["queued"] == row["in_flight"] == 0
