"""A supervised child's state and its transitions, as pure functions.

A child is ``starting`` from its spawn until it is ready (an actor's or worker's hello, the
control plane's ``server.json``), then ``running``. When its process exits the supervisor
decides, from the restart type and the restart intensity (:mod:`._restart`), one of three
outcomes: ``restarting`` (it will be spawned again, at once, after its backoff, or — for a
child restarted on demand — when its owner next needs it), ``stopped`` (not restarted: a
normal exit of a ``transient`` child, any exit of a ``temporary`` one, or the tree is
stopping) or ``failed`` (intensity exceeded: the supervisor gave up on it). A ``stopped``
or ``failed`` child may be started again as a new child; a ``restarting`` one is spawned
again, or stopped if the tree stops meanwhile::

    (new) ─spawn─▶ starting ─ready─▶ running
                      │                 │
                      ├──── restart ────┤──▶ restarting ─spawn─▶ starting
                      ├──── stop ───────┤──▶ stopped ─spawn─▶ starting
                      └──── give_up ────┘──▶ failed  ─spawn─▶ starting
                                             restarting ─stop─▶ stopped

The supervisor changes a child's state only through :func:`step`, so a transition missing
from the table is a bug that raises, never a silent odd state. Liveness (:func:`silent_for`)
is decided here too: whether a child's last sign of life is too old for its state.
"""

from __future__ import annotations

import enum
from typing import Literal


class ChildState(enum.Enum):
    """Where a child is in its life; the value is what ``corral status`` shows."""

    STARTING = "starting"
    RUNNING = "running"
    RESTARTING = "restarting"
    STOPPED = "stopped"
    FAILED = "failed"

    @property
    def up(self) -> bool:
        """Spawned and not yet exited (``starting`` or ``running``): liveness applies."""
        return self in (ChildState.STARTING, ChildState.RUNNING)

    @property
    def over(self) -> bool:
        """Exited for good (``stopped`` or ``failed``): nothing will spawn it on its own."""
        return self in (ChildState.STOPPED, ChildState.FAILED)


#: What happens to a child: it is spawned, says it is ready, or exits with one of the
#: supervisor's three decisions (``stop`` also ends a pending restart).
Step = Literal["spawn", "ready", "restart", "stop", "give_up"]

_S = ChildState
TRANSITIONS: dict[tuple[ChildState | None, Step], ChildState] = {
    (None, "spawn"): _S.STARTING,
    (_S.RESTARTING, "spawn"): _S.STARTING,
    (_S.STOPPED, "spawn"): _S.STARTING,
    (_S.FAILED, "spawn"): _S.STARTING,
    (_S.STARTING, "ready"): _S.RUNNING,
    (_S.STARTING, "restart"): _S.RESTARTING,
    (_S.RUNNING, "restart"): _S.RESTARTING,
    (_S.STARTING, "stop"): _S.STOPPED,
    (_S.RUNNING, "stop"): _S.STOPPED,
    (_S.RESTARTING, "stop"): _S.STOPPED,
    (_S.STARTING, "give_up"): _S.FAILED,
    (_S.RUNNING, "give_up"): _S.FAILED,
}


class IllegalTransition(ValueError):
    """A step that the state machine does not allow from the child's state (a bug)."""


def step(state: ChildState | None, what: Step) -> ChildState:
    """The state after ``what`` happens to a child in ``state`` (None: not yet spawned).

    Raises:
        IllegalTransition: ``what`` cannot happen in ``state`` (``ready`` while
            ``restarting``, ``spawn`` while ``running``).
    """
    try:
        return TRANSITIONS[state, what]
    except KeyError:
        name = state.value if state is not None else "new"
        raise IllegalTransition(f"a {name} child cannot {what}") from None


def decide_exit(*, restart: bool, gave_up: bool) -> Step:
    """The supervisor's decision on an exit: restart it, give up on it, or let it stop."""
    if not restart:
        return "stop"
    return "give_up" if gave_up else "restart"


def silent_for(
    state: ChildState,
    *,
    last_seen: float,
    now: float,
    window_s: float,
    start_grace_s: float | None,
) -> float | None:
    """How long a child has been silent, if that is too long for its state; else None.

    A ``running`` child may be silent ``window_s``; a ``starting`` one ``start_grace_s``
    (None: its owner bounds its start, liveness waits for it to be ready); a child in any
    other state has no process to check.
    """
    if state is ChildState.RUNNING:
        limit = window_s
    elif state is ChildState.STARTING and start_grace_s is not None:
        limit = start_grace_s
    else:
        return None
    silence = now - last_seen
    return silence if silence > limit else None
