"""The corral exception tree.

Every error corral raises on purpose derives from :class:`CorralError`, branched by fault::

    * CorralError
      + ConfigError            a corral.toml value is invalid (names the key)
      + BusError               anything that went wrong moving a message
      | + ProtocolError        bytes that are not a valid message (malformed, unknown tag)
      | + MessageTooLarge      a message over the configured size limit
      | + Unreachable          the recipient is unknown, dead or overloaded
      | + CallTimeout          no reply before the deadline
      | + RemoteError          the peer answered a request with a typed error
      | + BusClosed            the local bus endpoint is closed
      + SupervisionError       the supervision tree gave up
      | + RestartIntensityExceeded
      + HostNotRunning         no host answers on the state dir's control socket
      + HostAlreadyRunning     another host owns the state dir
"""

from __future__ import annotations


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

    def __init__(self, message: str, *, child: str, last_exit: dict | None = None) -> None:
        super().__init__(message)
        self.child = child
        self.last_exit = last_exit


class HostNotRunning(CorralError):
    """No corral host answers on the state dir's control socket."""


class HostAlreadyRunning(CorralError):
    """Another live corral host already owns the state dir."""
