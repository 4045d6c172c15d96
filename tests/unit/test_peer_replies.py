"""A peer's matching of replies and acceptances to the calls waiting for them."""

from __future__ import annotations

import msgspec
import pytest
import zmq

from corral.bus import Message
from corral.bus._codec import encode_body, encode_envelope
from corral.bus._messages import BROKER, Accepted, Envelope, new_id
from corral.bus._peer import Peer
from corral.config import BusSettings, LivenessSettings
from tests._echo import EchoPong, Every


def _frame(sender: str, msg: Message, correlation_id: str | None = None) -> bytes:
    env = Envelope(
        id=new_id(),
        sender=sender,
        recipient="client",
        type=msg.__struct_config__.tag,  # type: ignore[arg-type]
        body=encode_body(msg),
        correlation_id=correlation_id,
    )
    return encode_envelope(env)


def _client() -> Peer:
    """A peer that is never started: frames are fed to it by hand."""
    return Peer(
        "client",
        "ipc://unused",
        bus=BusSettings(),
        liveness=LivenessSettings(),
        ctx=zmq.Context.instance(),
        accepts=Every,
    )


@pytest.mark.parametrize("reply_first", [True, False])
async def test_a_reply_is_never_overwritten_by_a_late_acceptance(reply_first: bool) -> None:
    """The broker delivers a durable request while its commit runs, so the reply can come
    before the Accepted — both in one receive batch, before the caller wakes."""
    peer = _client()
    with peer._waiters.expect(["m1"], acceptance=False) as (waiter,):
        reply = _frame("worker", EchoPong(text="pong"), correlation_id="m1")
        accepted = _frame(BROKER, Accepted(ids=["m1"]))
        for frame in [reply, accepted] if reply_first else [accepted, reply]:
            await peer._on_frames([frame])
        assert waiter.event.is_set()
        assert waiter.env is not None
        assert msgspec.msgpack.decode(waiter.env.body, type=EchoPong) == EchoPong(text="pong")


async def test_a_reply_nobody_waits_for_is_dropped_not_handled() -> None:
    """A reply that comes after its caller gave up (a call held while its callee restarted,
    say) must not reach the owner's handlers, which have none for it."""
    peer = _client()
    await peer._on_frames([_frame("worker", EchoPong(text="late"), correlation_id="gone")])
    assert len(peer.inbox) == 0
    assert peer.stats["late_replies"] == 1
    await peer._on_frames([_frame("worker", EchoPong(text="a message"))])
    assert len(peer.inbox) == 1, "a message that answers nothing is still delivered"
