"""Encoding and strict decoding of envelopes and payloads.

Decoding happens only at process edges. Every failure becomes a :class:`ProtocolError`
whose message keeps msgspec's ``$.path`` text, so a dead letter says exactly what was wrong.
"""

from __future__ import annotations

from typing import Union

import msgspec

from .._exceptions import ProtocolError
from ._messages import Envelope, Message, registry

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


class BodyDecoder:
    """Decodes payloads against every registered :class:`Message` subclass.

    The registry may grow as modules are imported; the decoder is rebuilt when it does.
    """

    def __init__(self) -> None:
        self._tags: dict[str, type[Message]] = {}
        self._decoder: msgspec.msgpack.Decoder[Message] | None = None

    def knows(self, tag: str) -> bool:
        """Whether ``tag`` names a payload class imported in this process."""
        if tag not in self._tags:
            self._refresh()
        return tag in self._tags

    def _refresh(self) -> None:
        tags = registry()
        if tags.keys() != self._tags.keys() or self._decoder is None:
            self._tags = tags
            types = tuple(tags.values()) or (Message,)
            self._decoder = msgspec.msgpack.Decoder(Union[types])  # noqa: UP007

    def decode(self, env: Envelope) -> Message:
        """Decode an envelope's body; unknown tags and bad fields raise ProtocolError."""
        if not self.knows(env.type):
            raise ProtocolError(f"unknown message type {env.type!r}")
        assert self._decoder is not None
        try:
            msg = self._decoder.decode(env.body)
        except msgspec.ValidationError as exc:
            raise ProtocolError(f"invalid {env.type!r} message: {exc}") from exc
        except msgspec.DecodeError as exc:
            raise ProtocolError(f"malformed {env.type!r} body: {exc}") from exc
        if type(msg).__struct_config__.tag != env.type:
            raise ProtocolError(
                f"envelope says {env.type!r} but body is {type(msg).__struct_config__.tag!r}"
            )
        return msg
