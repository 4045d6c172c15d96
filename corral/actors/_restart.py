"""Restart accounting and backoff, as pure functions on monotonic time (OTP's ``add_restart``)."""

from __future__ import annotations

from ..config import RestartType as RestartType


def add_restart(restarts: list[float], now: float, period: float) -> list[float]:
    """Record a restart at ``now``, forgetting those older than ``period`` seconds."""
    return [now, *forget_old(restarts, now, period)]


def forget_old(restarts: list[float], now: float, period: float) -> list[float]:
    """The restarts that still fall within ``period`` seconds of ``now``."""
    threshold = now - period
    return [r for r in restarts if r >= threshold]


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


def restart_delay(restarts: int, *, first_s: float, max_s: float) -> float:
    """How long to wait before the ``restarts``-th restart within the period.

    The first is at once (as OTP restarts); from the second on the wait starts at
    ``first_s`` and doubles, up to ``max_s``: a child that crashes once is back at once, one
    that crash-loops is slowed down until intensity gives up on it. ``first_s = 0`` never waits.
    """
    if restarts <= 1 or first_s <= 0:
        return 0.0
    return min(first_s * 2.0 ** (restarts - 2), max_s)
