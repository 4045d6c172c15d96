"""Supervision as data: a supervisor's flags and each child's spec, checked when built.

As OTP's ``sup_flags()`` and ``child_spec()``: :class:`SupFlags` says how a supervisor
restarts its children (strategy, intensity, period, backoff, liveness), :class:`ChildSpec`
how to start one child and what to do when it exits (restart type, when a restart happens,
shutdown timeout). Both are frozen Structs validated in ``__post_init__``, so a bad value
raises :class:`~corral.SupervisionSpecError` naming the field where the spec is built —
never a supervisor that misbehaves later. The host builds them from ``corral.toml`` and
each actor's built-in defaults (:data:`corral.config.BUILTIN`); the harness actor builds
its workers' from its options. docs/supervision.md tabulates every built-in one.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import msgspec

from .._exceptions import SupervisionSpecError
from ._restart import RestartType

RESTART_TYPES: tuple[RestartType, ...] = ("permanent", "transient", "temporary")


def _check(ok: bool, what: str, field: str, message: str) -> None:
    if not ok:
        raise SupervisionSpecError(f"invalid {what}: {field} {message}", field=field)


def _finite(value: float) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


class Backoff(msgspec.Struct, frozen=True, kw_only=True):
    """The wait before a restart: none for the first in the period, then ``first_s``
    doubling per further restart up to ``max_s`` (``first_s = 0``: never wait, as OTP)."""

    first_s: float = 0.0
    max_s: float = 10.0

    def __post_init__(self) -> None:
        _check(_finite(self.first_s) and self.first_s >= 0, "backoff", "first_s", "must be >= 0")
        _check(
            _finite(self.max_s) and self.max_s >= self.first_s,
            "backoff",
            "max_s",
            "must be >= first_s",
        )


class Liveness(msgspec.Struct, frozen=True, kw_only=True):
    """How the supervisor tells a hung child: every ``check_s`` it SIGKILLs a ``running``
    child silent for more than ``window_s`` and a ``starting`` one silent for more than
    ``start_grace_s`` (None: its owner bounds the start). Only bus peers are checked."""

    window_s: float
    check_s: float
    start_grace_s: float | None = None

    def __post_init__(self) -> None:
        for field in ("window_s", "check_s"):
            value = getattr(self, field)
            _check(_finite(value) and value > 0, "liveness", field, "must be > 0")
        grace = self.start_grace_s
        _check(
            grace is None or (_finite(grace) and grace > 0),
            "liveness",
            "start_grace_s",
            "must be > 0",
        )


class SupFlags(msgspec.Struct, frozen=True, kw_only=True):
    """How one supervisor restarts its children.

    ``one_for_one`` is the only strategy corral uses: a child's exit restarts that child
    alone. More than ``intensity`` restarts within ``period_s`` and the supervisor gives up
    on the child that made one too many; ``intensity_per = "child"`` counts each child's
    restarts apart (a session's worker crash-looping leaves the other sessions' alone),
    ``"supervisor"`` counts them all together, as OTP does (the host: any actor's crash
    loop stops the host).
    """

    strategy: Literal["one_for_one"] = "one_for_one"
    intensity: int = 5
    period_s: float = 10.0
    intensity_per: Literal["supervisor", "child"] = "supervisor"
    backoff: Backoff = Backoff()
    liveness: Liveness | None = None

    def __post_init__(self) -> None:
        what = "supervisor flags"
        _check(self.strategy == "one_for_one", what, "strategy", "must be 'one_for_one'")
        _check(
            isinstance(self.intensity, int)
            and not isinstance(self.intensity, bool)
            and self.intensity >= 0,
            what,
            "intensity",
            "must be an integer >= 0",
        )
        _check(_finite(self.period_s) and self.period_s > 0, what, "period_s", "must be > 0")
        _check(
            self.intensity_per in ("supervisor", "child"),
            what,
            "intensity_per",
            "must be 'supervisor' or 'child'",
        )


class ChildSpec(msgspec.Struct, frozen=True, kw_only=True):
    """How to start one child and what to do when it exits.

    ``restart``: ``permanent`` children are always restarted, ``transient`` ones only after
    an abnormal exit, ``temporary`` ones never. ``restart_on``: ``exit`` spawns the child
    again as soon as its backoff allows; ``demand`` leaves it ``restarting`` until its owner
    next starts it (a session's worker is needed again only by the session's next turn) —
    counted against intensity and backed off all the same. ``bus_peer``: the child joins the
    bus, so it is ready when it says hello and live while it heartbeats; the control plane is
    not one (its owner probes it over HTTP).
    """

    name: str
    argv: list[str]
    env: dict[str, str]
    cwd: Path | None = None
    restart: RestartType = "permanent"
    restart_on: Literal["exit", "demand"] = "exit"
    shutdown_timeout_s: float = 5.0
    bus_peer: bool = True
    #: How messages name the child (``actor 'dispatch'``); default ``child '<name>'``.
    label: str = ""

    def __post_init__(self) -> None:
        what = f"child spec {self.name!r}"
        _check(isinstance(self.name, str) and bool(self.name), what, "name", "must not be empty")
        _check(bool(self.argv), what, "argv", "must not be empty")
        _check(self.restart in RESTART_TYPES, what, "restart", f"must be one of {RESTART_TYPES}")
        _check(
            self.restart_on in ("exit", "demand"), what, "restart_on", "must be 'exit' or 'demand'"
        )
        _check(
            _finite(self.shutdown_timeout_s) and self.shutdown_timeout_s > 0,
            what,
            "shutdown_timeout_s",
            "must be > 0",
        )

    @property
    def called(self) -> str:
        """The child as messages name it."""
        return self.label or f"child {self.name!r}"
