"""corral: a crash-proof host for AI-agent runner sessions.

The public surface is re-exported here; everything else is private to its package.
"""

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
