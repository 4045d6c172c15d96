"""Encoding and strict decoding of envelopes and payloads.

Decoding happens only at process edges, and only against types the process declares: a
:class:`BodyDecoder` is built from message unions (an actor's ``Inbound``, a request's reply
type plus :class:`~corral.bus.ErrorReply`, the broker's control messages), with one msgspec
decoder for the whole union. There is no registry of every :class:`Message` subclass: what a
process can decode is what its code names, whatever else happens to be imported.

Every failure becomes a :class:`ProtocolError` whose message keeps msgspec's ``$.path`` text,
so a dead letter says exactly what was wrong; a tag outside the union is ``unknown message
type '<tag>'``.
"""

from __future__ import annotations

import sys
import types
import typing
from typing import Any, Union

import msgspec

from .._exceptions import ProtocolError
from ._messages import Envelope, ErrorReply, Message, Request, tag_of

_envelope_encoder = msgspec.msgpack.Encoder()
_envelope_decoder = msgspec.msgpack.Decoder(Envelope)
_body_encoder = msgspec.msgpack.Encoder()


def encode_envelope(env: Envelope) -> bytes:
    """Encode an envelope to one wire frame."""
    return _envelope_encoder.encode(env)


def decode_envelope(frame: bytes) -> Envelope:
    """Decode one wire frame to an envelope (its body stays encoded)."""
    try:
        return _envelope_decoder.decode(frame)
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"malformed envelope: {exc}") from exc


def encode_body(msg: Message) -> msgspec.Raw:
    """Encode a payload for an envelope's ``body``."""
    return msgspec.Raw(_body_encoder.encode(msg))


def members(*declared: object) -> tuple[type[Message], ...]:
    """The message classes of unions (``A | B``, ``Union[A, B]``), classes and tuples of them.

    Raises:
        TypeError: something other than a tagged :class:`Message` class, or two classes that
            claim one tag.
    """
    found: dict[str, type[Message]] = {}
    stack = list(declared)
    while stack:
        item = stack.pop(0)
        if isinstance(item, tuple):
            stack[:0] = item
            continue
        if isinstance(item, types.UnionType) or typing.get_origin(item) is Union:
            stack[:0] = typing.get_args(item)
            continue
        if not (isinstance(item, type) and issubclass(item, Message)):
            raise TypeError(f"{item!r} is not a message class")
        tag = tag_of(item)
        other = found.setdefault(tag, item)
        if other is not item:
            raise TypeError(
                f"message tag {tag!r} used by {other.__qualname__} and {item.__qualname__}"
            )
    return tuple(found.values())


class BodyDecoder:
    """Decodes payloads of exactly the declared message types (see :func:`members`)."""

    def __init__(self, *declared: object) -> None:
        self.types = members(*declared)
        self.tags: dict[str, type[Message]] = {tag_of(t): t for t in self.types}
        self._decoder: msgspec.msgpack.Decoder[Any] | None = (
            msgspec.msgpack.Decoder(Union[self.types]) if self.types else None  # noqa: UP007
        )

    def knows(self, tag: str) -> bool:
        """Whether ``tag`` names one of the declared types."""
        return tag in self.tags

    def decode(self, env: Envelope) -> Message:
        """Decode an envelope's body; unknown tags and bad fields raise ProtocolError."""
        if self._decoder is None or env.type not in self.tags:
            raise ProtocolError(f"unknown message type {env.type!r}")
        try:
            msg: Message = self._decoder.decode(env.body)
        except msgspec.ValidationError as exc:
            raise ProtocolError(f"invalid {env.type!r} message: {exc}") from exc
        except msgspec.DecodeError as exc:
            raise ProtocolError(f"malformed {env.type!r} body: {exc}") from exc
        if type(msg).__struct_config__.tag != env.type:
            raise ProtocolError(
                f"envelope says {env.type!r} but body is {type(msg).__struct_config__.tag!r}"
            )
        return msg


def reply_type(request: type[Request[Any]]) -> type[Message]:
    """The reply type ``R`` a request class declares by deriving from ``Request[R]``.

    ``R`` may be a string naming a class of the request's module (``Request["Pong"]``).

    Raises:
        TypeError: the class derives from :class:`Request` without naming ``R``.
    """
    found = _reply_types.get(request)
    if found is not None:
        return found
    for klass in request.__mro__:
        for base in klass.__dict__.get("__orig_bases__", ()):
            if typing.get_origin(base) is Request:
                (arg,) = typing.get_args(base)
                if isinstance(arg, typing.ForwardRef):
                    # ``Request["Pong"]``: a reply defined later in the module, or the
                    # request's own class (a request answered with its like).
                    arg = vars(sys.modules[klass.__module__]).get(arg.__forward_arg__)
                if isinstance(arg, type) and issubclass(arg, Message):
                    _reply_types[request] = arg
                    return arg
    raise TypeError(f"{request.__qualname__} does not name its reply type (Request[R])")


def reply_decoder(request: type[Request[Any]]) -> BodyDecoder:
    """The decoder of a request's replies: its declared reply type, or an ErrorReply."""
    decoder = _reply_decoders.get(request)
    if decoder is None:
        decoder = _reply_decoders[request] = BodyDecoder(reply_type(request), ErrorReply)
    return decoder


_reply_types: dict[type[Request[Any]], type[Message]] = {}
_reply_decoders: dict[type[Request[Any]], BodyDecoder] = {}
