"""corral: a crash-proof host for AI-agent runner sessions.

The public surface is re-exported here; everything else is private to its package.
"""

import sys

__version__ = "0.1.0"

from ._exceptions import BusClosed as BusClosed
from ._exceptions import BusError as BusError
from ._exceptions import CallTimeout as CallTimeout
from ._exceptions import ConfigError as ConfigError
from ._exceptions import CorralError as CorralError
from ._exceptions import HostAlreadyRunning as HostAlreadyRunning
from ._exceptions import HostNotRunning as HostNotRunning
from ._exceptions import MessageTooLarge as MessageTooLarge
from ._exceptions import ProtocolError as ProtocolError
from ._exceptions import RemoteError as RemoteError
from ._exceptions import RestartIntensityExceeded as RestartIntensityExceeded
from ._exceptions import SupervisionError as SupervisionError
from ._exceptions import UnexpectedReply as UnexpectedReply
from ._exceptions import Unreachable as Unreachable

# httpx imports its own command-line tool (click, rich, pygments) whenever click is installed,
# which it is for corral's CLI: ~70 ms of CPU in every process that speaks HTTP (the host,
# dispatch, the gateway, policy, the control plane, OpenAI workers). No corral process runs
# httpx's CLI; a None entry makes that import fail, and httpx falls back to a stub ``main``.
sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]  # None blocks an import
