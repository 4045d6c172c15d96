"""The text of the session streams the gateway relays: SSE frames of the events, as §ii.6
writes them (``json.dumps``'s separators and escapes), and the ``type`` an event names.

On the hot path: every relayed delta is read here once for its type and once re-serialised.
"""

from __future__ import annotations

import json

import msgspec

SSE_HEADERS = [
    ("cache-control", "no-cache"),
    ("x-accel-buffering", "no"),
    ("content-type", "text/event-stream; charset=utf-8"),
]
HEARTBEAT = 'data: {"type": "session.heartbeat"}\n\n'
#: Ends a session stream cleanly: the server's relay stops without retrying (§D.1).
DONE = "data: [DONE]\n\n"


class _Typed(msgspec.Struct):
    type: str | None = None


_decode_typed = msgspec.json.Decoder(_Typed).decode


def stream_type(event: bytes) -> str | None:
    """The ``type`` of a session event's JSON, or None if it has no string ``type``."""
    try:
        return _decode_typed(event).type
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


#: ``json.dumps``'s own C encoder, with ``json.dumps``'s settings (ASCII-escaped, ``", "`` and
#: ``": "``, NaN allowed) but no check for cycles, which decoded JSON cannot have: called
#: without the Python layer around it, and fed by msgspec's decoder, a relayed delta costs
#: ~1 µs to re-serialise instead of ~5 (None on an interpreter without the C encoder).
_C_ENCODER = getattr(json.encoder, "c_make_encoder", None)
_spaced = (
    None
    if _C_ENCODER is None
    else _C_ENCODER(
        None,
        json.JSONEncoder().default,
        json.encoder.encode_basestring_ascii,
        None,
        ": ",
        ", ",
        False,
        False,
        True,
    )
)


def spaced_json(event: bytes) -> str:
    """``json.dumps(json.loads(event))``, the same text, faster; ValueError if ``event`` is
    not JSON."""
    if _spaced is not None:
        try:
            return "".join(_spaced(msgspec.json.decode(event), 0))
        except msgspec.DecodeError:
            pass  # what only the stdlib reads (NaN, a lone surrogate), or not JSON at all
    return json.dumps(json.loads(event))


def sse_data(event: bytes, seq: int | None = None) -> str:
    """One SSE frame, ``[id: <seq>\\n]data: <json>\\n\\n``, with ``json.dumps``'s separators
    (§ii.6). The ``id`` is the event's ``seq``, for a server that resumes its stream by it."""
    try:
        text = spaced_json(event)
    except ValueError:
        text = event.decode(errors="replace")
    if seq is None:
        return f"data: {text}\n\n"
    return f"id: {seq}\ndata: {text}\n\n"
