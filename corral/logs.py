"""Structured logs: one record per line, in logfmt or JSON lines, to stderr and a file.

Every process of a host (the host, the embedded control plane, each actor, each harness
worker) calls :func:`setup` with its own name, so a combined log says who said what::

    ts=2026-12-03T07:49:51.536Z level=info proc=host pid=8213 logger=corral.host msg="host up"
    {"ts": "2026-12-03T07:49:51.536Z", "level": "info", "proc": "host", "pid": 8213, ...}

A record's fields, in this order: ``ts`` (UTC, milliseconds), ``level``, ``proc`` (``host``,
``server``, the actor's name, ``worker``), ``pid``, ``session`` (a worker's session, or a
record's ``extra={"session": ...}``), ``logger``, ``msg``, any other ``extra`` field, and
``exc``: a traceback is a field of its one record, never lines of its own.

**logfmt** quoting: a value with a space, ``=``, ``"``, a backslash or a control character,
or an empty one, is written as a JSON string (``msg="a \\"b\\"\\nc"``), which every logfmt
reader unquotes; :func:`parse_line` reads both formats back.

**Settings.** The host resolves them once (``[logging]`` in corral.toml, ``CORRAL_LOG_LEVEL``,
``corral up --log-format``), validated like every other setting, and hands them to each
process it starts in :data:`SETTINGS_ENV` (no secret in it). A process started without them
(``python -m corral.server`` alone) reads ``CORRAL_LOG_LEVEL`` and uses the defaults.

**Third-party libraries** (httpx, hypercorn, ...) log only WARNING and above: their INFO
lines (one per HTTP request) would drown corral's own.

The file is written by every process at once and rotated by whichever of them finds it full
(:mod:`corral._logfile`).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

import msgspec

from ._exceptions import ConfigError
from ._logfile import SharedFileHandler
from .config import LOG_LEVELS, LoggingSettings

#: Where the host hands its resolved :class:`~corral.config.LoggingSettings` (JSON) to the
#: processes it starts.
SETTINGS_ENV = "CORRAL_LOG"
#: Overrides ``[logging] level``.
LEVEL_ENV = "CORRAL_LOG_LEVEL"
#: Loggers of libraries whose INFO lines are noise here: they log WARNING and above.
QUIET_LOGGERS = (
    "httpx",
    "httpcore",
    "hypercorn",
    "h11",
    "h2",
    "hpack",
    "trio_websocket",
    "wsproto",
    "websockets",
    "urllib3",
    "asyncio",
    "multipart",
    "python_multipart",
)

#: The fields every record has, in their order.
BASE_FIELDS = ("ts", "level", "proc", "pid", "session", "logger", "msg")
#: What a :class:`logging.LogRecord` holds besides ``extra`` fields.
_RECORD_ATTRS = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys()
    | {"message", "asctime", "taskName"}
)


def record_fields(
    record: logging.LogRecord, proc: str, session: str | None, exc: str | None
) -> dict[str, Any]:
    """A record as its fields, in :data:`BASE_FIELDS` order, then extras, then ``exc``."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    fields: dict[str, Any] = {
        "ts": f"{stamp}.{int(record.msecs):03d}Z",
        "level": record.levelname.lower(),
        "proc": proc,
        "pid": record.process,
    }
    extras = {k: v for k, v in record.__dict__.items() if k not in _RECORD_ATTRS}
    session = extras.pop("session", None) or session
    if session is not None:
        fields["session"] = str(session)
    fields["logger"] = record.name
    fields["msg"] = record.getMessage()
    fields.update(extras)
    if exc:
        fields["exc"] = exc
    if record.stack_info:
        fields["stack"] = record.stack_info
    return fields


def logfmt_value(value: Any) -> str:
    """One value as logfmt writes it: bare when it can be, else a JSON string."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return repr(value)
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if text and not any(c in ' ="\\' or c < " " or c == "\x7f" for c in text):
        return text
    return json.dumps(text, ensure_ascii=False)


def to_logfmt(fields: Mapping[str, Any]) -> str:
    """``key=value ...``; keys are made safe (no space, ``=`` or quote) if they are not."""
    return " ".join(f"{_key(k)}={logfmt_value(v)}" for k, v in fields.items())


def _key(key: str) -> str:
    safe = "".join(c if c > " " and c not in '="\x7f' else "_" for c in str(key))
    return safe or "_"


def parse_logfmt(line: str) -> dict[str, Any]:
    """The fields of a logfmt line (values as strings; a bare key is ``True``).

    Raises:
        ValueError: an unterminated quoted value.
    """
    fields: dict[str, Any] = {}
    i, n = 0, len(line)
    while i < n:
        while i < n and line[i] == " ":
            i += 1
        start = i
        while i < n and line[i] not in " =":
            i += 1
        key = line[start:i]
        if i >= n or line[i] == " ":
            if key:
                fields[key] = True
            continue
        i += 1  # the "="
        if i < n and line[i] == '"':
            end = i + 1
            while end < n and line[end] != '"':
                end += 2 if line[end] == "\\" else 1
            if end >= n:
                raise ValueError(f"unterminated quoted value of {key!r}")
            fields[key] = json.loads(line[i : end + 1])
            i = end + 1
        else:
            start = i
            while i < n and line[i] != " ":
                i += 1
            fields[key] = line[start:i]
    return fields


def parse_line(line: str) -> dict[str, Any] | None:
    """A log line's fields, whichever format it is in; None for a line that is neither (a
    library's print, a torn last line)."""
    line = line.rstrip("\n")
    if line.startswith("{"):
        try:
            fields = json.loads(line)
        except ValueError:
            return None
        return fields if isinstance(fields, dict) else None
    try:
        fields = parse_logfmt(line)
    except ValueError:
        return None
    return fields if "ts" in fields and "level" in fields else None


class Formatter(logging.Formatter):
    """A record as one line of logfmt or JSON."""

    def __init__(self, proc: str, fmt: str = "logfmt", session: str | None = None) -> None:
        super().__init__()
        self.proc = proc
        self.session = session
        self.json = fmt == "json"

    def format(self, record: logging.LogRecord) -> str:
        exc = self.formatException(record.exc_info) if record.exc_info else None
        fields = record_fields(record, self.proc, self.session, exc)
        if self.json:
            return json.dumps(fields, ensure_ascii=False, default=str)
        return to_logfmt(fields)


def resolve(settings: LoggingSettings, environ: Mapping[str, str] = os.environ) -> LoggingSettings:
    """``settings`` with ``CORRAL_LOG_LEVEL`` applied (any case), validated.

    Raises:
        ConfigError: the variable names no level (key ``CORRAL_LOG_LEVEL``).
    """
    raw = environ.get(LEVEL_ENV)
    if not raw:
        return settings
    level = raw.strip().lower()
    if level not in LOG_LEVELS:
        raise ConfigError(
            f"invalid {LEVEL_ENV} {raw!r}: expected one of {', '.join(LOG_LEVELS)}",
            key=LEVEL_ENV,
        )
    return msgspec.structs.replace(settings, level=level)  # type: ignore[arg-type]


def handed_over(environ: Mapping[str, str] = os.environ) -> LoggingSettings:
    """The settings the host handed this process, else the defaults with ``CORRAL_LOG_LEVEL``
    (a bad one ignored: a child has nowhere to report it but its log)."""
    raw = environ.get(SETTINGS_ENV)
    if raw:
        try:
            return msgspec.json.decode(raw, type=LoggingSettings)
        except msgspec.DecodeError:  # ValidationError is one
            pass
    try:
        return resolve(LoggingSettings(), environ)
    except ConfigError:
        return LoggingSettings()


def child_env(settings: LoggingSettings | None = None) -> dict[str, str]:
    """What a process this one starts needs in its environment to log as it does."""
    if settings is None:
        raw = os.environ.get(SETTINGS_ENV)
        return {SETTINGS_ENV: raw} if raw else {}
    return {SETTINGS_ENV: msgspec.json.encode(settings).decode()}


def setup(
    proc: str,
    settings: LoggingSettings | None = None,
    *,
    session: str | None = None,
    strict: bool = False,
) -> None:
    """Send this process's logs to stderr (and the file, if one is set) in corral's format.

    ``settings`` default to :func:`handed_over`'s. A file that cannot be opened leaves the
    process logging to stderr only, with a warning there, unless ``strict``.

    Raises:
        ConfigError: ``strict``, and the file cannot be opened (key ``logging.file``).
    """
    if settings is None:
        settings = handed_over()
    formatter = Formatter(proc, settings.format, session)
    stream = logging.StreamHandler(sys.stderr)
    stream.setFormatter(formatter)
    handlers: list[logging.Handler] = [stream]
    problem = None
    if settings.file:
        try:
            handlers.append(open_file(settings, formatter))
        except ConfigError as exc:
            if strict:
                raise
            problem = str(exc)
    root = logging.getLogger()
    for old in root.handlers:
        old.close()
    root.handlers[:] = handlers
    root.setLevel(settings.level.upper())
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
    if problem:
        logging.getLogger("corral.logs").warning("%s; logging to stderr only", problem)


def open_file(settings: LoggingSettings, formatter: logging.Formatter) -> SharedFileHandler:
    """The handler of ``settings.file`` (its directory created).

    Raises:
        ConfigError: the file cannot be opened for appending (key ``logging.file``).
    """
    assert settings.file
    try:
        handler = SharedFileHandler(settings.file, settings.max_bytes, settings.backups)
    except OSError as exc:
        raise ConfigError(
            f"invalid config: logging.file: {settings.file} cannot be opened: {exc.strerror}",
            key="logging.file",
        ) from None
    handler.setFormatter(formatter)
    return handler
