"""The policy actor: the gate every tool call of a turn passes.

The actor is described in :mod:`corral.actors.policy._actor`, its messages and what it
answers in :mod:`corral.actors.policy.messages`.

The actor loads on first use of one of its names, not with the package: dispatch's protocol
names the policy's :class:`~corral.actors.policy.messages.ToolOutcome`, and the policy actor
imports dispatch's protocol, so importing this package must not import the actor (that
would be an import cycle).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._actor import ParkedCall as ParkedCall
    from ._actor import PolicyActor as PolicyActor
    from ._actor import PolicyError as PolicyError
    from ._actor import PolicyOptions as PolicyOptions
    from ._actor import evaluate_elicitation_id as evaluate_elicitation_id
    from ._actor import parse_verdict as parse_verdict

_ACTOR_NAMES = frozenset(
    {
        "ParkedCall",
        "PolicyActor",
        "PolicyError",
        "PolicyOptions",
        "evaluate_elicitation_id",
        "parse_verdict",
    }
)


def __getattr__(name: str) -> Any:
    if name in _ACTOR_NAMES:
        from . import _actor

        return getattr(_actor, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
