"""The control plane's durable state: one SQLite database in WAL mode (``control.db``).

Tables: ``sessions``, ``items`` (the conversation store of PROTOCOL_FACTS §iii.6), ``events``
(every session event with a per-session sequence number, the ids of the client stream),
``elicitations`` (pending and resolved approvals) and ``outbox`` (messages and verdicts for the
runner that must survive a restart until the runner has answered them).

Everything that must agree is written in one transaction: a user message and its outbox entry;
a verdict, its outbox entry and its ``response.elicitation_resolved`` event; a batch of runner
events together with the items they produce and the assistant-text draft. So a crash at any
point leaves either all of it or none, and a restarted server continues exactly where the
database says.

The conversation store (items built from the runner's events) is ``_conversation.py``.

Durability: a commit that a client is told about (a message, a verdict, a new session) is on
disk when it returns (``synchronous=FULL``); the runner's event stream is committed without an
fsync of its own (``NORMAL``: it survives a crash of this process, and the next durable commit
syncs it), because an fsync per relayed frame would cap the server at the disk's fsync rate.

SQLite calls block, so every call runs in a worker thread. One connection writes and one reads,
each behind a ``CapacityLimiter(1)`` (a connection is used by one thread at a time); WAL lets
the reader see every committed write without waiting for the writer. Worker threads are not
abandoned on cancellation, so a transaction that started always finishes.

Modules: ``_schema`` (the tables, connections, one transaction), ``_rows`` (the records and
refusals), ``_database`` (:class:`Store`, the async face), and the SQL by table:
``_sessions`` (sessions, items, events), ``_elicitations``, ``_outbox``.
"""

from .._conversation import UnknownSession as UnknownSession
from ._database import Store as Store
from ._rows import ElicitationRow as ElicitationRow
from ._rows import NotPending as NotPending
from ._rows import OutboxEntry as OutboxEntry
from ._rows import PendingElicitation as PendingElicitation
from ._rows import SessionRow as SessionRow
from ._rows import UnknownCursor as UnknownCursor

__all__ = [
    "ElicitationRow",
    "NotPending",
    "OutboxEntry",
    "PendingElicitation",
    "SessionRow",
    "Store",
    "UnknownCursor",
    "UnknownSession",
]
