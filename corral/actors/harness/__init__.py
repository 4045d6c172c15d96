"""The harness actor: one supervised worker process per session, and the turns they run.

The actor and what it handles are described in :mod:`corral.actors.harness._actor`.
"""

from ._actor import EXIT_CANNOT_LOAD as EXIT_CANNOT_LOAD
from ._actor import HarnessActor as HarnessActor
from ._actor import HarnessOptions as HarnessOptions
from ._actor import OwnedTurn as OwnedTurn
from ._actor import ParkedElicitation as ParkedElicitation
from ._actor import WorkerState as WorkerState
