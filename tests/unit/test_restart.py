"""Restart accounting (pure functions) and restart types."""

from __future__ import annotations

from corral.actors._restart import add_restart, intensity_exceeded, should_restart


def test_add_restart_forgets_old_restarts() -> None:
    r: list[float] = []
    for t in (0.0, 1.0, 2.0):
        r = add_restart(r, t, period=5.0)
    assert r == [2.0, 1.0, 0.0]
    r = add_restart(r, 6.5, period=5.0)
    assert r == [6.5, 2.0]


def test_intensity_is_exceeded_past_r_restarts() -> None:
    assert not intensity_exceeded([1.0, 2.0], 2)
    assert intensity_exceeded([1.0, 2.0, 3.0], 2)
    assert intensity_exceeded([1.0], 0)


def test_restart_types() -> None:
    assert should_restart("permanent", exit_code=0, stopping=False)
    assert should_restart("permanent", exit_code=-9, stopping=False)
    assert not should_restart("transient", exit_code=0, stopping=False)
    assert should_restart("transient", exit_code=1, stopping=False)
    assert should_restart("transient", exit_code=-9, stopping=False)
    assert not should_restart("temporary", exit_code=-9, stopping=False)
    assert not should_restart("permanent", exit_code=-9, stopping=True)
