"""The public surface of corral.journal: exactly these names, each documented."""

from __future__ import annotations

import corral.journal

PUBLIC = {
    "ActiveRunError",
    "COMPACTED_EVENT",
    "FORMAT_VERSION",
    "FsyncPolicy",
    "ID_PATTERN",
    "InvalidCursorError",
    "InvalidEventError",
    "InvalidIdError",
    "JournalError",
    "JournalIOError",
    "JournalStatistics",
    "JournalWriter",
    "Listing",
    "Malformed",
    "PayloadError",
    "PendingAppend",
    "Replay",
    "RetentionReport",
    "RunJournal",
    "RunRow",
    "SessionPayload",
    "SessionRow",
    "Snapshot",
    "StoredRecord",
    "Summary",
    "WriterAttachedError",
    "WriterStatistics",
    "is_stream_event",
    "terminal_state_for",
}


def test_exports_are_exactly_the_public_api() -> None:
    exported = {name for name in dir(corral.journal) if not name.startswith("_")}
    assert exported == PUBLIC


def test_every_exported_class_and_function_is_documented() -> None:
    for name in PUBLIC:
        value = getattr(corral.journal, name)
        if callable(value):
            assert value.__doc__, name
            assert value.__module__.startswith("corral.journal."), name


def test_journal_errors_are_value_errors_under_the_corral_root() -> None:
    from corral._exceptions import CorralError

    for name in PUBLIC:
        value = getattr(corral.journal, name)
        if isinstance(value, type) and issubclass(value, Exception):
            assert issubclass(value, corral.journal.JournalError), name
            assert issubclass(value, ValueError), name
            assert issubclass(value, CorralError), name
