"""The corral exception tree.

Every error corral raises on purpose derives from :class:`CorralError`, branched by fault::

    * CorralError
      + ConfigError            a corral.toml value is invalid (names the key)
      + BusError               anything that went wrong moving a message
      | + ProtocolError        bytes that are not a valid message (malformed, unknown tag)
      | | + UnexpectedReply    a reply of another type than its request declares
      | + MessageTooLarge      a message over the configured size limit
      | + Unreachable          the recipient is unknown, dead or overloaded
      | + CallTimeout          no reply before the deadline
      | + RemoteError          the peer answered a request with a typed error
      | + BusClosed            the local bus endpoint is closed
      + SupervisionError       the supervision tree gave up
      | + RestartIntensityExceeded
      + SupervisionSpecError   a SupFlags or ChildSpec value is invalid; names the field
      + HostNotRunning         no host answers on the state dir's control socket
      + HostAlreadyRunning     another host owns the state dir
      + SpecError              an agent spec or bundle is invalid; names the field (a ValueError)
      + BadInput               a request breaks a rule where it enters; its 4xx (a ValueError)
      + ServerError            a runner → server HTTP call failed
        + ServerUnavailable    no usable answer: connection failed, or 502/503/504
        | + ServerTimeout      the server did not answer before the deadline
        + ServerRejected       the server answered with an error status (status, body)
        + ServerProtocolError  the server answered 2xx, but not with the shape it should have
"""

from __future__ import annotations

from typing import Any


class CorralError(Exception):
    """Root of every error corral raises on purpose."""


class ConfigError(CorralError):
    """A configuration value is invalid; the message names the key."""

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class BusError(CorralError):
    """A message could not be moved, decoded or answered."""

    #: A short machine-readable code carried in error replies.
    code: str = "bus_error"


class ProtocolError(BusError):
    """Bytes that do not decode to a valid message: malformed, or an unknown tag."""

    code = "protocol_error"


class UnexpectedReply(ProtocolError):
    """A reply decodes, but not to the type its request declares (``Request[R]``)."""


class MessageTooLarge(BusError):
    """A message is larger than the configured limit."""

    code = "too_large"


class Unreachable(BusError):
    """The recipient is unknown, not running, or refusing more messages."""

    code = "unreachable"


class CallTimeout(BusError):
    """No reply arrived before the request's deadline."""

    code = "timeout"


class RemoteError(BusError):
    """The peer answered a request with a typed error."""

    def __init__(self, message: str, *, code: str, sender: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.sender = sender


class BusClosed(BusError):
    """The local bus endpoint was closed by this process."""

    code = "closed"


class SupervisionError(CorralError):
    """The supervision tree could not keep its children alive."""


class RestartIntensityExceeded(SupervisionError):
    """A child restarted more than R times in T seconds; the tree gives up."""

    def __init__(
        self, message: str, *, child: str, last_exit: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.child = child
        self.last_exit = last_exit


class SupervisionSpecError(CorralError, ValueError):
    """A supervisor's flags or a child's spec is invalid; ``field`` names the bad one."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


class HostNotRunning(CorralError):
    """No corral host answers on the state dir's control socket."""


class HostAlreadyRunning(CorralError):
    """Another live corral host already owns the state dir."""


class SpecError(CorralError, ValueError):
    """An agent spec, its YAML or its bundle is invalid.

    The message names what is wrong (``invalid agent spec: Expected str, got int - at
    $.executor.model``); ``path`` is the ``$.``-path of the offending field when there is one.
    """

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class BadInput(CorralError, ValueError):
    """A request's body or id breaks a rule where it enters (:mod:`corral._input`).

    ``status`` and ``code`` are what it is answered with (400 ``invalid_json``, 400
    ``invalid_session_id``, ...); the message names the rule. A ``ValueError``, so a caller that
    already refuses a body it cannot parse refuses this one too.
    """

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class ServerError(CorralError):
    """A call from the runner to the server's HTTP API failed.

    ``method`` and ``path`` name the call (never a credential); ``status`` is the HTTP status
    when the server answered at all.
    """

    def __init__(
        self,
        message: str,
        *,
        method: str | None = None,
        path: str | None = None,
        status: int | None = None,
        body: bytes = b"",
    ) -> None:
        super().__init__(message)
        self.method = method
        self.path = path
        self.status = status
        self.body = body


class ServerUnavailable(ServerError):
    """No usable answer: the connection failed, or the server answered 502, 503 or 504.

    Worth retrying later; idempotent calls were already retried a bounded number of times.
    """


class ServerTimeout(ServerUnavailable):
    """The server did not answer (connect or read) before the configured timeout."""


class ServerRejected(ServerError):
    """The server answered with an error status other than 502/503/504 (e.g. 401, 404, 500).

    ``status`` and ``body`` are the server's; ``code`` is the ``error.code`` of an omnigent
    error body (``{"error": {"code", "message"}}``) when it has one. Retrying does not help.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int,
        body: bytes = b"",
        method: str | None = None,
        path: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message, method=method, path=path, status=status, body=body)
        self.code = code


class ServerProtocolError(ServerError):
    """The server answered 2xx but the body is not what the protocol says (bad JSON, shape)."""
