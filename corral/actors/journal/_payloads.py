"""What the journal actor stores of an event's payload, and why it may refuse one."""

from __future__ import annotations

from typing import Any

import msgspec

from .messages import JournalEvent

# JSON payloads nest at most this deep (msgpack would carry deeper ones; JSON encoders balk).
_MAX_DEPTH = 100

_check_json = msgspec.json.Decoder(msgspec.Raw).decode


def payload_of(item: JournalEvent) -> Any:
    """What to store of ``item``: its encoded payload as it is, unless it spans lines (a
    record is one line: it is decoded, and encoded again compact), else its payload."""
    data = item.payload_json
    if data is None:
        return item.payload
    if b"\n" in data or b"\r" in data:
        return msgspec.json.decode(data)
    return msgspec.Raw(data)


def encoded_json_problem(data: bytes) -> str | None:
    """Why ``data`` is not one JSON value nesting at most :data:`_MAX_DEPTH` levels, or
    ``None`` if it is. Only a payload with that many brackets is decoded to tell how deep it
    nests: a delta is checked, not decoded."""
    try:
        _check_json(data)
    except msgspec.DecodeError as exc:
        return f"is not JSON ({exc})"
    if data.count(b"[") + data.count(b"{") < _MAX_DEPTH:
        return None
    try:
        return json_problem(msgspec.json.decode(data), 0)
    except RecursionError:
        return f"nests deeper than {_MAX_DEPTH} levels"


def json_problem(value: Any, depth: int) -> str | None:
    """Why ``value`` is not a plain JSON value, or ``None`` if it is.

    msgpack carries more than JSON can (bytes, timestamps, extension types, non-string
    keys); stored as JSON they would silently change meaning, so they are refused.
    """
    kind = type(value)
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return None
    if depth >= _MAX_DEPTH:
        return f"nests deeper than {_MAX_DEPTH} levels"
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str:
                return f"has a non-string key {key!r}"
            problem = json_problem(item, depth + 1)
            if problem is not None:
                return problem
        return None
    if kind is list:
        for item in value:
            problem = json_problem(item, depth + 1)
            if problem is not None:
                return problem
        return None
    return f"contains a {kind.__name__}"
