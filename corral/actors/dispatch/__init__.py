"""The dispatch actor and its parts: sessions and turns, end to end.

The actor and what it handles are described in :mod:`corral.actors.dispatch._actor`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..._lazy import lazy_exports

# Imported on first use (corral/_lazy.py): importing this package's ``messages``, as other
# actors do, must not load the whole actor.
if TYPE_CHECKING:
    from ._actor import DispatchActor as DispatchActor
    from ._calls import SPEC_FAILED_IN_STREAM as SPEC_FAILED_IN_STREAM
    from ._events import ApprovalEvent as ApprovalEvent
    from ._events import BadEvent as BadEvent
    from ._events import BtwDismissEvent as BtwDismissEvent
    from ._events import ClearEvent as ClearEvent
    from ._events import CodexApprovalModeChangeEvent as CodexApprovalModeChangeEvent
    from ._events import CompactEvent as CompactEvent
    from ._events import CostApprovalPopupEvent as CostApprovalPopupEvent
    from ._events import EffortChangeEvent as EffortChangeEvent
    from ._events import ExternalSessionStatusEvent as ExternalSessionStatusEvent
    from ._events import InterruptEvent as InterruptEvent
    from ._events import MessageEvent as MessageEvent
    from ._events import ModelChangeEvent as ModelChangeEvent
    from ._events import PermissionModeChangeEvent as PermissionModeChangeEvent
    from ._events import PlanModeChangeEvent as PlanModeChangeEvent
    from ._events import PolicyBlockedNoticeEvent as PolicyBlockedNoticeEvent
    from ._events import SessionEventBody as SessionEventBody
    from ._events import StopSessionEvent as StopSessionEvent
    from ._events import flatten_approval as flatten_approval
    from ._events import parse_event as parse_event
    from ._options import DispatchOptions as DispatchOptions
    from ._routes import GENERIC_DETAIL as GENERIC_DETAIL
    from ._routes import NO_HARNESS_DETAIL as NO_HARNESS_DETAIL
    from ._session import Session as Session
    from ._session import SessionRecord as SessionRecord
    from ._start import runner_tools as runner_tools
    from ._turn import Turn as Turn

__getattr__, __dir__ = lazy_exports(__name__, __file__)
