"""The journal's errors.

Every one of them is a :class:`JournalError`, which is both a :class:`~corral.CorralError`
(so the CLI maps it to exit code 1 in one place) and a :class:`ValueError` (so callers that
only know "bad argument" still catch the argument faults)::

    * JournalError
      + InvalidIdError        a session or run id that must not become a path
      + InvalidEventError     an event name that is empty or not a string
      + PayloadError          a payload that cannot be encoded as JSON
      + InvalidCursorError    a read cursor that is neither a seq nor "<run_id>:<seq>"
      + ActiveRunError        a delete that would touch a run a writer still holds
      + WriterAttachedError   a synchronous append while a JournalWriter owns appends
      + JournalIOError        the disk refused a write or fsync; the record is not durable
"""

from __future__ import annotations

from corral._exceptions import CorralError


class JournalError(CorralError, ValueError):
    """Root of every error the journal raises on purpose."""


class InvalidIdError(JournalError):
    """A session or run id is not a safe file name; nothing was read or written."""

    def __init__(self, message: str, *, field: str, value: object) -> None:
        super().__init__(message)
        self.field = field
        self.value = value


class InvalidEventError(JournalError):
    """An event name is empty or not a string; nothing was written."""


class PayloadError(JournalError):
    """A payload cannot be encoded as JSON; nothing was written and no seq was used."""


class InvalidCursorError(JournalError):
    """A read cursor is neither a non-negative seq nor an event id ``"<run_id>:<seq>"``."""


class ActiveRunError(JournalError):
    """The operation would touch a run that an open writer still holds."""

    def __init__(self, message: str, *, session_id: str, run_id: str | None = None) -> None:
        super().__init__(message)
        self.session_id = session_id
        self.run_id = run_id


class WriterAttachedError(JournalError):
    """A synchronous append was attempted while a :class:`JournalWriter` owns appends.

    Two appenders with separate seq cursors would hand out the same seq twice, so while a
    writer is open every append must go through it.
    """


class JournalIOError(JournalError):
    """The disk refused a write or an fsync; the record must be treated as not durable."""
