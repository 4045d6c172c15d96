"""The durable run journal: one append-only file of JSON records per (session, run).

:class:`RunJournal` is the library (append, replay, summaries, snapshots, retention) and
works without a running host. :class:`JournalWriter` adds trio group commit on top of it for
many concurrent runs. The on-disk format and durability policies are in docs/journal.md.
"""

from ._errors import ActiveRunError as ActiveRunError
from ._errors import InvalidCursorError as InvalidCursorError
from ._errors import InvalidEventError as InvalidEventError
from ._errors import InvalidIdError as InvalidIdError
from ._errors import JournalError as JournalError
from ._errors import JournalIOError as JournalIOError
from ._errors import PayloadError as PayloadError
from ._errors import WriterAttachedError as WriterAttachedError
from ._files import FsyncPolicy as FsyncPolicy
from ._records import COMPACTED_EVENT as COMPACTED_EVENT
from ._records import FORMAT_VERSION as FORMAT_VERSION
from ._records import ID_PATTERN as ID_PATTERN
from ._records import is_stream_event as is_stream_event
from ._records import terminal_state_for as terminal_state_for
from ._retention import RetentionReport as RetentionReport
from ._shapes import Listing as Listing
from ._shapes import Malformed as Malformed
from ._shapes import Replay as Replay
from ._shapes import RunRow as RunRow
from ._shapes import SessionPayload as SessionPayload
from ._shapes import SessionRow as SessionRow
from ._shapes import Snapshot as Snapshot
from ._shapes import StoredRecord as StoredRecord
from ._shapes import Summary as Summary
from ._store import JournalStatistics as JournalStatistics
from ._store import RunJournal as RunJournal
from ._writer import JournalWriter as JournalWriter
from ._writer import PendingAppend as PendingAppend
from ._writer import WriterStatistics as WriterStatistics
