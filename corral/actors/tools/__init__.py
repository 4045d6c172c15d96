"""The tools actor: runs runner-local tools and serves the environment routes.

The actor and what it handles are described in :mod:`corral.actors.tools._actor`.
"""

from ._actor import ProcessGroups as ProcessGroups
from ._actor import ToolsActor as ToolsActor
from ._actor import ToolsOptions as ToolsOptions
