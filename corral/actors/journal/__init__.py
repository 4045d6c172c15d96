"""The journal actor: the only writer of every run journal.

The actor is described in :mod:`corral.actors.journal._actor`, its messages and what it
answers in :mod:`corral.actors.journal.messages`.
"""

from ._actor import JournalActor as JournalActor
from ._actor import JournalOptions as JournalOptions
from .messages import JournalAppend as JournalAppend
from .messages import JournalAppended as JournalAppended
from .messages import JournalAppends as JournalAppends
from .messages import JournalEvent as JournalEvent
from .messages import JournalList as JournalList
from .messages import JournalListReply as JournalListReply
from .messages import JournalRead as JournalRead
from .messages import JournalReadReply as JournalReadReply
from .messages import JournalSnapshot as JournalSnapshot
from .messages import JournalSnapshotReply as JournalSnapshotReply
from .messages import JournalSummary as JournalSummary
from .messages import JournalSummaryReply as JournalSummaryReply
