"""What the parts of :class:`ControlPlane` share, declared once for readers and the type checker.

:class:`ControlPlane` is one object built from parts in modules of their own
(:class:`RunnerBinding`, :class:`RunnerCalls`, :class:`OutboxDelivery`). Its ``__init__``
sets every attribute; :class:`PlaneParts` only declares them, with the methods one part
calls on another. Those methods are declared under ``TYPE_CHECKING`` alone, so at run time
each name has exactly one definition, in the part that owns it.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    from ...config import ServerSettings
    from .._mcp import ToolCalls
    from .._policy import AgentPolicy, Decision
    from .._store import SessionRow, Store
    from .._tunnel import RunnerLink
    from ._binding import _Binding
    from ._options import PlaneOptions
    from ._outbox import _Delivery


class PlaneParts:
    """The shared state of a :class:`ControlPlane` (set by its ``__init__``)."""

    settings: ServerSettings
    options: PlaneOptions
    store: Store
    runner_id: str
    #: The connected runner, at most one.
    link: RunnerLink | None
    #: Set by ``begin_shutdown``: client streams end, the tunnel closes.
    closing: trio.Event
    _link_nursery: trio.Nursery | None
    _bindings: dict[str, _Binding]
    _link_changed: trio.Event
    _outbox_wake: dict[str, trio.Event]
    _deliveries: collections.OrderedDict[int, _Delivery]
    _fenced: set[str]
    _tools: ToolCalls

    if TYPE_CHECKING:

        def notify(self, session_id: str) -> None: ...

        async def _agent_policies(self, session: SessionRow) -> list[AgentPolicy]: ...

        async def _deliver_loop(
            self, link: RunnerLink, session_id: str, binding: _Binding
        ) -> None: ...

        async def _await_delivery(self, session_id: str, entry_id: int) -> _Delivery | None: ...

        def _wake_outbox(self, session_id: str) -> None: ...

        def _bind(self, session_id: str) -> None: ...

        async def root_of(self, row: SessionRow) -> str: ...

        async def decide(
            self, row: SessionRow, phase: str, tool: str | None, arguments: Any
        ) -> Decision: ...
