"""The bus's message types: one envelope, payloads as tagged Structs, typed requests.

Every message on the bus is an :class:`Envelope` whose ``body`` is the msgpack encoding of a
:class:`Message` subclass. The envelope travels as one ZeroMQ frame; its body stays opaque
(:class:`msgspec.Raw`) to the broker, which routes on the header alone and never decodes a
body it only forwards. A recipient decodes a body against the union of types it declares
(see :mod:`corral.bus._codec`); each actor's union is in its ``messages`` module.

Payload classes name their wire tag explicitly, e.g.::

    class Ping(Request[Pong], tag="echo.ping"):
        text: str

and encode as ``{"type": "echo.ping", "text": ...}``. A :class:`Request` names the type of
its reply, so ``await peer.call(to, Ping(...))`` is typed as returning ``Pong``. New fields
get defaults so that old logs and peers keep decoding.
"""

from __future__ import annotations

import os
import time
from itertools import count
from typing import Any, Generic, Literal, TypeVar, dataclass_transform

import msgspec

Durability = Literal["stream", "durable"]

#: The address of the broker itself, for control messages.
BROKER = "broker"


class Envelope(msgspec.Struct, array_like=True, frozen=True):
    """The header every bus message carries, with its payload left encoded.

    ``type`` repeats the payload's tag so that the broker can route, count and show
    messages (``corral mailboxes --peek``) without decoding bodies.
    """

    id: str
    sender: str
    recipient: str
    type: str
    body: msgspec.Raw
    durability: Durability = "stream"
    correlation_id: str | None = None
    session_id: str | None = None
    attempt: int = 1
    created_at: float = 0.0
    #: True when the sender waits for a reply (a failure to deliver must be answered).
    wants_reply: bool = False


# msgspec subclasses inherit ``frozen`` and ``kw_only``, but a type checker reads each class
# statement alone (PEP 681) and would take every payload for a mutable, positional dataclass
# under a frozen one. Re-declaring the transform with these defaults tells it what msgspec does.
@dataclass_transform(frozen_default=True, kw_only_default=True, field_specifiers=(msgspec.field,))
class Message(msgspec.Struct, tag_field="type", frozen=True, kw_only=True):
    """Base of every bus payload. Subclasses pass ``tag="area.name"``."""


#: The reply type a request declares.
R = TypeVar("R", bound=Message, covariant=True)


class Request(Message, Generic[R]):
    """A message that is answered with an ``R``: ``class Ping(Request[Pong], tag=...)``.

    :meth:`~corral.bus.Peer.call` takes only requests, returns their ``R`` (checked by the
    type checker) and decodes the reply against ``R`` alone, so a reply of another type is a
    :class:`~corral.UnexpectedReply` at the call, not an AttributeError later. ``R`` is not
    a field: the wire encoding is that of a plain :class:`Message`.
    """


def tag_of(cls: type[Message]) -> str:
    """The wire tag of a payload class.

    Raises:
        TypeError: ``cls`` names no tag of its own (:class:`Message` itself).
    """
    tag = cls.__struct_config__.tag
    if not isinstance(tag, str):
        raise TypeError(f"{cls.__qualname__} has no message tag")
    return tag


# --- control messages between peers and the broker -------------------------------------------


class Welcome(Message, tag="bus.welcome"):
    """The broker's answer to a Hello that wants one: it now routes messages to the peer."""


class Hello(Request[Welcome], tag="bus.hello"):
    """A peer announces itself; a new ``incarnation`` means it restarted."""

    name: str
    pid: int
    incarnation: str


class Heartbeat(Message, tag="bus.heartbeat"):
    """Sent by an otherwise silent peer so the broker knows it is alive."""


class Ack(Message, tag="bus.ack"):
    """The recipient handled these durable messages; the broker may forget them."""

    ids: list[str]


class Nack(Message, tag="bus.nack"):
    """Handling a durable message failed; redeliver it (or dead-letter it past N attempts)."""

    id: str
    error: str


class Reject(Message, tag="bus.reject"):
    """The recipient cannot decode a message at all: dead-letter it now."""

    id: str
    error: str
    #: The message's tag, for the dead letter of a stream message (the broker kept no copy).
    message_type: str = "?"


class Park(Message, tag="bus.park"):
    """Move an in-flight durable message of the sender's to its *parked* set.

    A parked entry is neither redelivered nor dead-lettered: it waits, durably, until its
    owner resolves it with :class:`Unpark` (an elicitation waiting on a human's verdict).
    """

    id: str


class Hold(Message, tag="bus.hold"):
    """The sender's own work on an in-flight durable message is done: it stays in flight
    only until another process answers (a turn's start waits on its worker's terminal).

    The sender restarting then says nothing against the message, so the broker redelivers it
    without counting an attempt: attempts find a message that kills its handler, and one
    held across a dozen unrelated crashes is not that.
    """

    id: str


class Unpark(Message, tag="bus.unpark"):
    """Resolve a parked entry: ``state`` is ``resolved`` or ``cancelled``."""

    id: str
    state: str
    reason: str | None = None


class ParkedEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One parked durable message, as :class:`ParkedEntries` lists it."""

    id: str
    owner: str | None
    type: str
    #: The message's encoded envelope.
    frame: bytes
    #: Seconds since it entered the mailbox.
    age_s: float


class ParkedEntries(Message, tag="bus.parked_entries"):
    """The sender's parked entries, answering :class:`ListParked`."""

    entries: list[ParkedEntry]


class ListParked(Request[ParkedEntries], tag="bus.list_parked"):
    """Ask the broker for the sender's parked entries (to rebuild state after a restart)."""


class Accepted(Message, tag="bus.accepted"):
    """The broker has made these durable messages durable (one per sender per commit)."""

    ids: list[str]


class Bundle(Message, tag="bus.bundle"):
    """Several stream messages from one sender to one recipient, as one frame.

    Each item is a complete encoded :class:`Envelope` with the bundle's sender and
    recipient. The broker routes a bundle like any stream message, and the receiving peer
    unpacks it, so a run of deltas costs one routing decision and one socket operation at
    each hop instead of one per delta.
    """

    frames: list[bytes]


class ErrorReply(Message, tag="bus.error"):
    """A typed failure answering a message (its correlation id names the message)."""

    code: str
    message: str


class InspectReply(Message, tag="bus.inspect_reply"):
    """An actor's state snapshot, for ``corral status`` and tests."""

    name: str
    state: dict[str, Any]


class InspectRequest(Request[InspectReply], tag="bus.inspect"):
    """Ask an actor for a snapshot of its state."""


class Stop(Message, tag="bus.stop"):
    """Ask a peer to stop in an orderly way."""


class DrainReply(Message, tag="bus.drain_reply"):
    """How much work an actor still has in flight (0: drained)."""

    in_flight: int


class DrainRequest(Request[DrainReply], tag="bus.drain"):
    """The host is about to stop: take no new work, and answer once the work in flight is
    done, or after ``wait_s`` seconds with what is left (docs/supervision.md, *Draining*)."""

    wait_s: float


#: What the broker decodes: the control messages peers address to it (``recipient=BROKER``).
BrokerInbound = Hello | Heartbeat | Ack | Nack | Reject | Park | Hold | Unpark | ListParked
#: What every actor accepts besides its handlers' messages (the runtime answers them).
ActorControl = InspectRequest | Stop | DrainRequest


# --- ids and clocks --------------------------------------------------------------------------


def _fresh_prefix() -> str:
    return f"{os.getpid():x}-{os.urandom(3).hex()}"


_prefix = _fresh_prefix()
_counter = count(1)


def _after_fork() -> None:
    """A forked process's ids start afresh: a worker forked from the zygote
    (:mod:`corral._zygote`) would otherwise number its messages as every sibling forked
    from the same zygote does, and the broker takes one id for one message (a second
    worker's parked elicitation, acked as the first's, was never answered: #20)."""
    global _prefix, _counter
    _prefix = _fresh_prefix()
    _counter = count(1)


os.register_at_fork(after_in_child=_after_fork)


def new_id() -> str:
    """A message id unique across processes and restarts (pid, random, counter), forked
    processes too."""
    return f"{_prefix}-{next(_counter):x}"


def now() -> float:
    """Wall-clock time for ``created_at`` fields (seconds since the epoch)."""
    return time.time()
