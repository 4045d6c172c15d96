"""Restart accounting, as pure functions on monotonic time (OTP's ``add_restart``)."""

from __future__ import annotations

from typing import Literal

RestartType = Literal["permanent", "transient", "temporary"]


def add_restart(restarts: list[float], now: float, period: float) -> list[float]:
    """Record a restart at ``now``, forgetting those older than ``period`` seconds."""
    threshold = now - period
    return [now, *(r for r in restarts if r >= threshold)]


def intensity_exceeded(restarts: list[float], intensity: int) -> bool:
    """True when more than ``intensity`` restarts fall within the period."""
    return len(restarts) > intensity


def should_restart(restart: RestartType, *, exit_code: int, stopping: bool) -> bool:
    """Whether a child that exited with ``exit_code`` is restarted.

    ``permanent`` always is; ``transient`` only after an abnormal exit (non-zero or a
    signal); ``temporary`` never. Nothing is restarted while the tree is stopping.
    """
    if stopping or restart == "temporary":
        return False
    if restart == "transient":
        return exit_code != 0
    return True
