"""The harness actor: one supervised worker process per session, and the turns they run.

The actor and what it handles are described in :mod:`corral.actors.harness._actor`.
"""

from ._actor import HarnessActor as HarnessActor
from ._base import worker_preload as worker_preload
from ._options import HarnessOptions as HarnessOptions
from ._records import OwnedTurn as OwnedTurn
from ._records import ParkedElicitation as ParkedElicitation
from ._records import WorkerState as WorkerState
from ._workers import EXIT_CANNOT_LOAD as EXIT_CANNOT_LOAD
