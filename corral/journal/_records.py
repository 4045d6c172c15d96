"""The journal record: its on-disk form, id rules and terminal-state classification.

A record is one JSON object on one line, keys in this order::

    {"version":1,"event_id":"run-a:3","seq":3,"run_id":"run-a","session_id":"session-a",
     "event":"token","created_at":1795965552.1,"terminal":false,"terminal_state":null,
     "payload":{"text":"answer"}}

followed by ``"key"`` only when the appender gave one: an idempotency key that lets an
appender find out, after a crash, whether a record it submitted was stored (the journal
actor keys the records of a durable bus message ``"<message id>/<index>"``), and by
``"session_seq"`` only when the appender gave one: the event's ``seq`` in its session's
stream, by which the journal actor drops an event sent again after a restart.

Ids become file names, so they are checked here, once, before any path is built: anything
that is not ``^[A-Za-z0-9_.-]+$`` (or is ``.``/``..``, or longer than 200 characters) raises
:class:`InvalidIdError` instead of being joined to a path.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from .._jsonlines import JsonObject
from ._errors import InvalidCursorError, InvalidEventError, InvalidIdError, PayloadError

#: The ``version`` written into every record; readers accept any record with a usable seq.
FORMAT_VERSION = 1

#: Ids may only use these characters (and are never ``.`` or ``..``).
ID_PATTERN = re.compile(r"^[A-Za-z0-9_.-]+$")

# A run file is "<run_id>.jsonl"; 200 keeps that under every common 255-byte name limit.
MAX_ID_LENGTH = 200

#: The event written in place of a span of stream events that retention compacted away.
COMPACTED_EVENT = "journal.compacted"

# event name -> terminal_state, for the events that end a run whatever their payload says.
# ``done``/``stream_end``/``apperror``/``error`` are refined from the payload below.
_TERMINAL_EVENTS = {
    "done": "completed",
    "stream_end": "completed",
    "cancel": "interrupted-by-user",
    "apperror": "errored",
    "error": "errored",
    "response.completed": "completed",
    "response.failed": "errored",
    "response.incomplete": "incomplete",
    "response.cancelled": "interrupted-by-user",
}

# error payload ``type`` -> terminal_state, for ``apperror``/``error`` events.
_ERROR_TYPES = {
    "tool_limit_reached": "tool_limit_reached",
    "cancelled": "interrupted-by-user",
    "canceled": "interrupted-by-user",
    "interrupted": "interrupted-by-crash",
}

# Events that only carry streamed output or liveness: retention may fold them away.
_STREAM_EVENTS = frozenset({"token", "reasoning", "response.heartbeat", "session.heartbeat"})


class Record(msgspec.Struct, omit_defaults=True):
    """One journal line as it is written. ``payload`` is already-encoded JSON.

    ``key`` and ``session_seq`` are written only when set, so records without them keep the
    version-1 form.
    """

    version: int
    event_id: str
    seq: int
    run_id: str
    session_id: str
    event: str
    created_at: float
    terminal: bool
    terminal_state: str | None
    payload: msgspec.Raw
    key: str | None = None
    session_seq: int | None = None


class _SeqProbe(msgspec.Struct):
    # Decodes only ``seq`` (msgspec skips the rest without building objects): a cheap way to
    # find a line's place when its body is not needed.
    seq: int


class _KeyProbe(msgspec.Struct):
    # Decodes only ``seq``, ``key`` and ``session_seq``: finding what a run holds never
    # builds payload objects.
    seq: int
    key: str | None = None
    session_seq: int | None = None


# A key becomes part of a line; keep it short and printable enough to be useful.
MAX_KEY_LENGTH = 512


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()
_probe_decoder = msgspec.json.Decoder(_SeqProbe)
_key_decoder = msgspec.json.Decoder(_KeyProbe)
_EMPTY_PAYLOAD = msgspec.Raw(b"{}")


def validate_id(value: object, field: str) -> str:
    """Return ``value`` if it is a safe session or run id, else raise :class:`InvalidIdError`.

    The id is used as a file or directory name, so it is checked exactly, never cleaned up:
    ``" a"`` is rejected rather than silently becoming ``"a"``.
    """
    if not isinstance(value, str) or not value:
        raise InvalidIdError(f"{field} must be a non-empty string", field=field, value=value)
    if value in (".", "..") or not ID_PATTERN.fullmatch(value):
        raise InvalidIdError(
            f"{field} {value!r} must match {ID_PATTERN.pattern} and not be '.' or '..'",
            field=field,
            value=value,
        )
    if len(value) > MAX_ID_LENGTH:
        raise InvalidIdError(
            f"{field} is longer than {MAX_ID_LENGTH} characters", field=field, value=value
        )
    return value


def validate_event(event: object) -> str:
    """Return ``event`` if it is a usable event name, else raise :class:`InvalidEventError`."""
    if not isinstance(event, str) or not event.strip():
        raise InvalidEventError(f"event must be a non-empty string, got {event!r}")
    return event


def validate_key(key: object) -> str | None:
    """Return ``key`` if it is ``None`` or a usable idempotency key, else raise ``ValueError``."""
    if key is None:
        return None
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH:
        raise ValueError(
            f"key must be None or a non-empty string of at most {MAX_KEY_LENGTH} characters"
        )
    return key


def validate_session_seq(session_seq: object) -> int | None:
    """Return ``session_seq`` if it is ``None`` or an int >= 1, else raise ``ValueError``."""
    if session_seq is None:
        return None
    if type(session_seq) is not int or session_seq < 1:
        raise ValueError(f"session_seq must be None or an int >= 1, got {session_seq!r}")
    return session_seq


def encode_payload(payload: Any) -> msgspec.Raw:
    """Encode a payload once, up front, so a bad one fails before a seq is handed out.

    ``None`` becomes ``{}`` (J-03). Anything msgspec cannot encode raises
    :class:`PayloadError`; the journal is untouched.
    """
    if payload is None:
        return _EMPTY_PAYLOAD
    if isinstance(payload, msgspec.Raw):  # encoded (and checked) by its sender already
        return payload
    try:
        return msgspec.Raw(_encoder.encode(payload))
    except (TypeError, ValueError, OverflowError, RecursionError, msgspec.EncodeError) as exc:
        raise PayloadError(f"payload is not JSON-serialisable: {exc}") from exc


def terminal_state_for(event: str, payload: Any) -> str | None:
    """Classify an event: the run's terminal state if the event ends the run, else ``None``.

    ``done``/``stream_end`` may say ``{"terminal_state": "tool_limit_reached"}``; an
    ``error``/``apperror`` payload's ``type`` distinguishes a tool limit, a user cancel and an
    interrupted (crashed) run from an ordinary error.
    """
    state = _TERMINAL_EVENTS.get(event)
    if state is not None and isinstance(payload, msgspec.Raw):
        payload = msgspec.json.decode(payload)
    if state is None or not isinstance(payload, dict):
        return state
    if event in ("done", "stream_end"):
        explicit = str(payload.get("terminal_state") or "").strip().lower()
        return "tool_limit_reached" if explicit == "tool_limit_reached" else state
    if event in ("error", "apperror"):
        kind = str(payload.get("type") or "").strip().lower()
        return _ERROR_TYPES.get(kind, state)
    return state


def is_stream_event(event: str) -> bool:
    """True for events that only stream output or liveness (tokens, ``*.delta``, heartbeats).

    These are what retention folds into one ``journal.compacted`` record; every other event
    is a *state* event and is kept verbatim.
    """
    return event in _STREAM_EVENTS or event.endswith(".delta")


def encode_record(
    *,
    session_id: str,
    run_id: str,
    seq: int,
    event: str,
    payload: msgspec.Raw,
    terminal_state: str | None,
    created_at: float,
    key: str | None = None,
    session_seq: int | None = None,
) -> bytes:
    """Encode one record as its line, newline included."""
    record = Record(
        version=FORMAT_VERSION,
        event_id=f"{run_id}:{seq}",
        seq=seq,
        run_id=run_id,
        session_id=session_id,
        event=event,
        created_at=created_at,
        terminal=terminal_state is not None,
        terminal_state=terminal_state,
        payload=payload,
        key=key,
        session_seq=session_seq,
    )
    return _encoder.encode(record) + b"\n"


def decode_line(line: bytes) -> JsonObject | str:
    """Decode one line into a record dict, or return why it is not one.

    The reason is ``invalid_json``, ``not_an_object`` or ``missing_seq``; a record needs an
    integer ``seq`` >= 1 to have a place in the run. A ``null`` payload is left as it is
    (J-04): readers treat it as a non-object payload rather than failing.
    """
    try:
        value = _decoder.decode(line)
    except msgspec.DecodeError:
        return "invalid_json"
    if not isinstance(value, dict):
        return "not_an_object"
    seq = value.get("seq")
    if type(seq) is not int or seq < 1:
        return "missing_seq"
    return value


def probe_seq(line: bytes) -> int | None:
    """The line's ``seq`` if it has a usable one, decoding nothing else; else ``None``."""
    try:
        seq = _probe_decoder.decode(line).seq
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return seq if seq >= 1 else None


def probe_ids(line: bytes) -> tuple[int, str | None, int | None] | None:
    """The line's ``(seq, key, session_seq)`` if it has a usable seq, decoding nothing else;
    else ``None``."""
    try:
        probe = _key_decoder.decode(line)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if probe.seq < 1:
        return None
    return probe.seq, probe.key, probe.session_seq


def decode_json(data: bytes) -> Any:
    """Decode a JSON document written by :func:`encode_record` (a returned record's form)."""
    return _decoder.decode(data)


def parse_event_id(cursor: str) -> tuple[str, int]:
    """Split an event id ``"<run_id>:<seq>"``, or raise :class:`InvalidCursorError`."""
    run_id, sep, tail = cursor.rpartition(":")
    if not sep or not run_id or not (tail.isascii() and tail.isdigit()):
        raise InvalidCursorError(f"cursor {cursor!r} is not an event id '<run_id>:<seq>'")
    return run_id, int(tail)
