"""Restart accounting, backoff, the child state machine and spec validation: pure, no
processes (the supervisor's own tests run real ones: tests/integration/test_host.py)."""

from __future__ import annotations

import pytest

from corral._exceptions import SupervisionSpecError
from corral.actors._child_state import (
    TRANSITIONS,
    ChildState,
    IllegalTransition,
    decide_exit,
    silent_for,
    step,
)
from corral.actors._restart import (
    add_restart,
    forget_old,
    intensity_exceeded,
    restart_delay,
    should_restart,
)
from corral.actors._specs import Backoff, ChildSpec, Liveness, SupFlags


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


# --- backoff, the child state machine and spec validation (no processes) -------------------

S = ChildState


def test_backoff_first_restart_at_once_then_doubling_to_the_cap() -> None:
    delays = [restart_delay(n, first_s=0.5, max_s=10.0) for n in range(1, 9)]
    assert delays == [0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert restart_delay(7, first_s=0.0, max_s=10.0) == 0.0, "no backoff: OTP restarts at once"


def test_forget_old_keeps_the_restarts_within_the_period() -> None:
    assert forget_old([9.0, 5.0, 1.0], now=10.0, period=5.0) == [9.0, 5.0]


def test_a_child_lives_through_its_states() -> None:
    state = step(None, "spawn")
    assert state is S.STARTING and state.up and not state.over
    state = step(state, "ready")
    assert state is S.RUNNING and state.up
    state = step(state, decide_exit(restart=True, gave_up=False))
    assert state is S.RESTARTING and not state.up and not state.over
    assert step(state, "spawn") is S.STARTING
    assert step(state, "stop") is S.STOPPED, "a pending restart ends when the tree stops"
    assert step(S.RUNNING, decide_exit(restart=True, gave_up=True)) is S.FAILED
    assert step(S.STARTING, decide_exit(restart=False, gave_up=True)) is S.STOPPED
    for over in (S.STOPPED, S.FAILED):
        assert over.over and step(over, "spawn") is S.STARTING, "started again as a new child"


@pytest.mark.parametrize(
    ("state", "what"),
    [
        (S.RUNNING, "spawn"),
        (S.STARTING, "spawn"),
        (S.RESTARTING, "ready"),
        (S.RUNNING, "ready"),
        (S.STOPPED, "stop"),
        (S.FAILED, "give_up"),
        (None, "ready"),
    ],
)
def test_transitions_not_in_the_table_raise(state: ChildState | None, what: str) -> None:
    assert (state, what) not in TRANSITIONS
    with pytest.raises(IllegalTransition, match=f" cannot {what}$"):
        step(state, what)  # type: ignore[arg-type]


def test_every_state_is_reachable_and_the_values_are_what_status_shows() -> None:
    assert set(TRANSITIONS.values()) == set(S)
    assert [s.value for s in S] == ["starting", "running", "restarting", "stopped", "failed"]


def test_liveness_gives_a_starting_child_its_grace_and_a_running_one_its_window() -> None:
    def silent(state: ChildState, seen: float, grace: float | None = 10.0) -> float | None:
        return silent_for(state, last_seen=seen, now=100.0, window_s=3.0, start_grace_s=grace)

    assert silent(S.RUNNING, 98.0) is None
    assert silent(S.RUNNING, 96.5) == 3.5
    assert silent(S.STARTING, 95.0) is None, "within its start grace"
    assert silent(S.STARTING, 89.0) == 11.0
    assert silent(S.STARTING, 0.0, grace=None) is None, "its owner bounds the start"
    for gone in (S.RESTARTING, S.STOPPED, S.FAILED):
        assert silent(gone, 0.0) is None, "no process to check"


def _spec(**fields: object) -> ChildSpec:
    return ChildSpec(name="a", argv=["x"], env={}, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: SupFlags(intensity=-1), "intensity"),
        (lambda: SupFlags(intensity=10**0.5), "intensity"),  # type: ignore[arg-type]
        (lambda: SupFlags(period_s=0), "period_s"),
        (lambda: SupFlags(period_s=float("inf")), "period_s"),
        (lambda: SupFlags(strategy="one_for_all"), "strategy"),  # type: ignore[arg-type]
        (lambda: SupFlags(intensity_per="session"), "intensity_per"),  # type: ignore[arg-type]
        (lambda: Backoff(first_s=-0.5), "first_s"),
        (lambda: Backoff(first_s=2.0, max_s=1.0), "max_s"),
        (lambda: Liveness(window_s=0, check_s=1), "window_s"),
        (lambda: Liveness(window_s=1, check_s=1, start_grace_s=-1), "start_grace_s"),
        (lambda: _spec(restart="sometimes"), "restart"),
        (lambda: _spec(restart_on="later"), "restart_on"),
        (lambda: _spec(shutdown_timeout_s=0), "shutdown_timeout_s"),
        (lambda: ChildSpec(name="", argv=["x"], env={}), "name"),
        (lambda: ChildSpec(name="a", argv=[], env={}), "argv"),
    ],
)
def test_a_bad_spec_raises_naming_its_field(build: object, field: str) -> None:
    with pytest.raises(SupervisionSpecError, match=rf": {field} ") as caught:
        build()  # type: ignore[operator]
    assert caught.value.field == field
    assert isinstance(caught.value, ValueError)


def test_specs_default_to_otp_one_for_one() -> None:
    flags = SupFlags()
    assert (flags.strategy, flags.intensity, flags.period_s) == ("one_for_one", 5, 10.0)
    assert flags.backoff == Backoff(first_s=0.0, max_s=10.0)
    spec = _spec()
    assert (spec.restart, spec.restart_on, spec.bus_peer) == ("permanent", "exit", True)
    assert spec.called == "child 'a'"
