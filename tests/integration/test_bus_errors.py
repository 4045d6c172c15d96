"""Bad input on the bus: malformed bytes, unknown types, oversized messages, dead peers.

Each case ends in a dead letter and/or a typed error; the broker and the actors go on
serving.
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec
import pytest
import trio
import zmq

from corral import CallTimeout, MessageTooLarge, ProtocolError, Unreachable
from corral.bus import (
    Envelope,
    ErrorReply,
    Socket,
    configure,
    decode_envelope,
    encode_body,
    encode_envelope,
    new_id,
    open_peer,
)
from corral.config import BusSettings, LivenessSettings
from tests._echo import EchoPing, EchoPong, EchoSleep
from tests.conftest import FAST_LIVENESS, HostProcess

#: These tests talk to the test-only echo actor (tests/_echo.py); their hosts run it, and
#: none of the built-in actors.
RUNS_ECHO = True
HOST_ACTORS: frozenset[str] = frozenset()
#: One host serves the module: each test looks only at the dead letters it caused (the
#: oversized-message test starts its own, with a smaller bus limit).
SHARE_HOST = True

FAST = LivenessSettings(interval_s=0.2, liveness=3)


#: The raw clients a test opened: closed after it whatever happened (below).
_OPEN: list[_Raw] = []


@pytest.fixture(autouse=True)
def _close_raw_clients() -> Iterator[None]:
    """A test that fails before its ``raw.close()`` must not leave its socket to the garbage
    collector: a zmq context collected with a socket open can block a later test in
    ``term()`` until pytest-timeout fires."""
    yield
    while _OPEN:
        _OPEN.pop().close()


class _Raw:
    """A raw DEALER that can send any bytes to the broker."""

    def __init__(self, endpoint: str, name: str = "raw-client") -> None:
        self.ctx = zmq.Context()
        sock = self.ctx.socket(zmq.DEALER)
        configure(sock, hwm=100, linger_ms=0)
        sock.setsockopt(zmq.IDENTITY, name.encode())
        sock.connect(endpoint)
        self.sock = Socket(sock)
        self.name = name
        _OPEN.append(self)

    async def send(self, frame: bytes) -> None:
        await self.sock.send([frame])

    async def receive_envelope(self) -> Envelope:
        with trio.fail_after(5):
            return decode_envelope((await self.sock.receive())[0])

    def envelope(self, type_: str, body: bytes, **kw: object) -> bytes:
        env = Envelope(
            id=new_id(),
            sender=self.name,
            recipient="echo",
            type=type_,
            body=msgspec.Raw(body),
            **kw,  # type: ignore[arg-type]
        )
        return encode_envelope(env)

    def close(self) -> None:
        if self.ctx.closed:
            return
        self.sock.close()
        self.ctx.term()


async def _still_serving(host: HostProcess) -> None:
    async with open_peer("checker", host.endpoint, liveness=FAST) as peer:
        assert await peer.call("echo", EchoPing(text="ok"), timeout=5) == EchoPong(text="ok")
    assert all(a["state"] == "running" and a["restarts"] == 0 for a in host.status()["actors"])


def _dead(host: HostProcess, since: int = 0) -> list[dict]:
    """The host's dead letters, oldest first, from the ``since``-th on."""
    return host.ask("dead_letters")["dead_letters"][since:]


async def _dead_when(host: HostProcess, since: int, count: int) -> list[dict]:
    """:func:`_dead` once it holds at least ``count`` letters (polled, with a deadline)."""
    with trio.fail_after(15):
        while len(dead := _dead(host, since)) < count:
            await trio.sleep(0.05)
    return dead


async def test_malformed_bytes_are_dead_lettered_and_the_broker_keeps_serving(
    host: HostProcess,
) -> None:
    before = len(_dead(host))
    raw = _Raw(host.endpoint)
    await raw.send(b"\xc1 this is not msgpack")
    await raw.send(msgspec.msgpack.encode({"hello": "world"}))
    await _still_serving(host)
    # The raw client's frames travel on a connection of their own: the checker's round trip
    # on another may come back before the broker has read them.
    dead = await _dead_when(host, before, 2)
    assert [d["type"] for d in dead] == ["<malformed>", "<malformed>"]
    assert all("malformed envelope" in d["error"] and "raw-client" in d["error"] for d in dead)
    raw.close()


async def test_unknown_message_type_gets_a_typed_error_reply(host: HostProcess) -> None:
    before = len(_dead(host))
    raw = _Raw(host.endpoint)
    frame = raw.envelope(
        "no.such.type", msgspec.msgpack.encode({"type": "no.such.type"}), wants_reply=True
    )
    await raw.send(frame)
    reply = await raw.receive_envelope()
    body = msgspec.msgpack.decode(reply.body, type=ErrorReply)
    assert body.code == "protocol_error"
    assert "unknown message type 'no.such.type'" in body.message
    assert reply.correlation_id == decode_envelope(frame).id
    assert _dead(host, before)[0]["type"] == "no.such.type"
    await _still_serving(host)
    raw.close()


async def test_invalid_body_reaches_recipient_and_is_rejected(host: HostProcess) -> None:
    before = len(_dead(host))
    raw = _Raw(host.endpoint)
    bad = msgspec.msgpack.encode({"type": "echo.ping", "text": 42})
    frame = raw.envelope("echo.ping", bad, wants_reply=True)
    await raw.send(frame)
    with trio.fail_after(5):
        while not _dead(host, before):
            await trio.sleep(0.02)
    dead = _dead(host, before)[0]
    assert dead["actor"] == "echo"
    assert "Expected `str`, got `int` - at `$.text`" in dead["error"]
    await _still_serving(host)
    raw.close()


async def test_invalid_durable_body_is_rejected_by_its_recipient(host: HostProcess) -> None:
    """The broker forwards a body it never decodes (it is stored and delivered); the
    recipient rejects it, and the broker dead-letters it and tells the sender."""
    before = host.ask("mailboxes", actor="echo")["mailboxes"][0]["dead_letters"]
    raw = _Raw(host.endpoint)
    bad = msgspec.msgpack.encode({"type": "echo.sleep", "seconds": "soon"})
    frame = raw.envelope("echo.sleep", bad, durability="durable")
    await raw.send(frame)
    reply = await raw.receive_envelope()
    if reply.type == "bus.accepted":  # the acceptance and the rejection race
        reply = await raw.receive_envelope()
    assert reply.correlation_id == decode_envelope(frame).id
    error = msgspec.msgpack.decode(reply.body, type=ErrorReply)
    assert error.code == "protocol_error"
    assert "Expected `float`, got `str` - at `$.seconds`" in error.message
    rows = host.ask("mailboxes", actor="echo")["mailboxes"][0]
    assert rows["queued"] == rows["in_flight"] == 0
    assert rows["dead_letters"] == before + 1
    raw.close()


async def test_oversized_message_is_refused_with_an_error(host_factory) -> None:
    host = host_factory(FAST_LIVENESS + "[bus]\nmax_message_bytes = 10000\n").start()
    raw = _Raw(host.endpoint)
    frame = raw.envelope(
        "echo.ping",
        msgspec.msgpack.encode({"type": "echo.ping", "text": "x" * 20000}),
        wants_reply=True,
    )
    await raw.send(frame)
    reply = await raw.receive_envelope()
    err = msgspec.msgpack.decode(reply.body, type=ErrorReply)
    assert err.code == "too_large"
    assert "exceeds the limit of 10000" in err.message
    assert _dead(host)[0]["type"] == "echo.ping"
    # The sending side refuses before sending at all.
    async with open_peer(
        "client", host.endpoint, bus=BusSettings(max_message_bytes=10000), liveness=FAST
    ) as peer:
        with pytest.raises(MessageTooLarge):
            await peer.call("echo", EchoPing(text="y" * 20000))
        assert await peer.call("echo", EchoPing(text="small")) == EchoPong(text="small")
    raw.close()
    host.stop()


async def test_send_to_unknown_peer_is_a_typed_error(host: HostProcess) -> None:
    async with open_peer("client", host.endpoint, liveness=FAST) as peer:
        with pytest.raises(Unreachable, match="no running peer named 'ghost'"):
            await peer.call("ghost", EchoPing(text="?"), timeout=5)
        with pytest.raises(Unreachable, match="no actor named 'ghost'"):
            await peer.cast("ghost", EchoPing(text="?"), durable=True, timeout=5)


async def test_call_deadline(host: HostProcess) -> None:
    async with open_peer("client", host.endpoint, liveness=FAST) as peer:
        with pytest.raises(CallTimeout):
            await peer.call("echo", EchoSleep(seconds=2), timeout=0.2)


async def test_sender_spoofing_another_name_is_dead_lettered(host: HostProcess) -> None:
    before = len(_dead(host))
    raw = _Raw(host.endpoint)
    env = Envelope(
        id=new_id(),
        sender="dispatch",
        recipient="echo",
        type="echo.ping",
        body=encode_body(EchoPing(text="spoof")),
    )
    await raw.send(encode_envelope(env))
    with trio.fail_after(5):
        while not _dead(host, before):
            await trio.sleep(0.02)
    assert "is not the peer 'raw-client'" in _dead(host, before)[0]["error"]
    raw.close()


def test_protocol_error_names_the_path() -> None:
    from corral.bus import BodyDecoder
    from tests._echo import Inbound

    env = Envelope(
        id="1",
        sender="a",
        recipient="b",
        type="echo.ping",
        body=msgspec.Raw(msgspec.msgpack.encode({"type": "echo.ping", "text": 1})),
    )
    with pytest.raises(ProtocolError, match=r"\$\.text"):
        BodyDecoder(Inbound).decode(env)


async def test_a_bad_endpoint_is_an_error_not_a_hang() -> None:
    """Name and endpoint swapped: the peer fails at once and closes what it opened."""
    with trio.fail_after(5), pytest.raises(BaseExceptionGroup) as failed:
        async with open_peer("not-an-endpoint", "bench-peer"):
            pass
    assert failed.group_contains(zmq.ZMQError)
