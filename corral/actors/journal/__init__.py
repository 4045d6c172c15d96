"""The journal actor: the only writer of every run journal.

The actor, its messages and what it handles are described in :mod:`corral.actors.journal._actor`.
"""

from ._actor import JournalActor as JournalActor
from ._actor import JournalAppend as JournalAppend
from ._actor import JournalAppended as JournalAppended
from ._actor import JournalEvent as JournalEvent
from ._actor import JournalList as JournalList
from ._actor import JournalListReply as JournalListReply
from ._actor import JournalOptions as JournalOptions
from ._actor import JournalRead as JournalRead
from ._actor import JournalReadReply as JournalReadReply
from ._actor import JournalSnapshot as JournalSnapshot
from ._actor import JournalSnapshotReply as JournalSnapshotReply
from ._actor import JournalSummary as JournalSummary
from ._actor import JournalSummaryReply as JournalSummaryReply
