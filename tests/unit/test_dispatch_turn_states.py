"""The turn state machine of dispatch (pure functions, no processes): every transition, the
illegal ones refused, how a turn ends and what follows it (D-29..D-31, §E.3, §E.4)."""

from __future__ import annotations

import time

import pytest

from corral.actors.dispatch._session import Session, SessionRecord
from corral.actors.dispatch._turn import (
    TRANSITIONS,
    IllegalTransition,
    Next,
    Phase,
    Terminal,
    Trigger,
    Turn,
    TurnEnd,
    after_end,
    on_message,
    on_terminal,
    transition,
)
from corral.actors.dispatch._watchdog import overdue, watchdog_error

LEGAL = [
    (Phase.IDLE, Trigger.MESSAGE, Phase.RUNNING),
    (Phase.IDLE, Trigger.INTERRUPT, Phase.IDLE),
    (Phase.IDLE, Trigger.DELETE, Phase.IDLE),
    (Phase.RUNNING, Trigger.MESSAGE, Phase.RUNNING),
    (Phase.RUNNING, Trigger.INTERRUPT, Phase.INTERRUPTED),
    (Phase.RUNNING, Trigger.TERMINAL, Phase.IDLE),
    (Phase.RUNNING, Trigger.SETUP_FAILED, Phase.IDLE),
    (Phase.RUNNING, Trigger.DELETE, Phase.IDLE),
    (Phase.INTERRUPTED, Trigger.MESSAGE, Phase.INTERRUPTED),
    (Phase.INTERRUPTED, Trigger.INTERRUPT, Phase.INTERRUPTED),
    (Phase.INTERRUPTED, Trigger.TERMINAL, Phase.IDLE),
    (Phase.INTERRUPTED, Trigger.SETUP_FAILED, Phase.IDLE),
    (Phase.INTERRUPTED, Trigger.DELETE, Phase.IDLE),
]
ILLEGAL = [(Phase.IDLE, Trigger.TERMINAL), (Phase.IDLE, Trigger.SETUP_FAILED)]


@pytest.mark.parametrize(("phase", "trigger", "after"), LEGAL)
def test_every_legal_transition(phase: Phase, trigger: Trigger, after: Phase) -> None:
    assert transition(phase, trigger) is after


@pytest.mark.parametrize(("phase", "trigger"), ILLEGAL)
def test_illegal_transitions_are_refused(phase: Phase, trigger: Trigger) -> None:
    with pytest.raises(IllegalTransition, match=rf"^{trigger.value} is not a transition of a"):
        transition(phase, trigger)


def test_the_table_is_exactly_the_legal_and_illegal_pairs() -> None:
    pairs = {(p, t) for p in Phase for t in Trigger}
    assert set(TRANSITIONS) == {(p, t) for p, t, _ in LEGAL}
    assert pairs - set(TRANSITIONS) == set(ILLEGAL)


def test_d29_a_message_starts_a_turn_only_in_an_idle_session() -> None:
    assert on_message(Phase.IDLE) == "start"
    assert on_message(Phase.RUNNING) == "buffer", "§E.3: its own turn, after this one"
    assert on_message(Phase.INTERRUPTED) == "buffer"


def test_a_terminal_of_no_active_turn_is_refused() -> None:
    with pytest.raises(IllegalTransition):
        on_terminal(Phase.IDLE, "completed")


@pytest.mark.parametrize(
    ("phase", "terminal", "end"),
    [
        (Phase.RUNNING, "completed", TurnEnd("idle", upstream=True, keep_answer=True, note=False)),
        (Phase.RUNNING, "failed", TurnEnd("failed", upstream=True, keep_answer=False, note=False)),
        (
            Phase.RUNNING,
            "cancelled",
            TurnEnd("idle", upstream=True, keep_answer=False, note=False),
        ),
        # §E.4: an interrupted turn's cancelled stays off the server-facing stream (the relay
        # would save its partial text as the answer) and leaves the note instead.
        (
            Phase.INTERRUPTED,
            "cancelled",
            TurnEnd("idle", upstream=False, keep_answer=False, note=True),
        ),
        # A turn that completed before the interrupt reached its worker ends as completed.
        (
            Phase.INTERRUPTED,
            "completed",
            TurnEnd("idle", upstream=True, keep_answer=True, note=False),
        ),
        (
            Phase.INTERRUPTED,
            "failed",
            TurnEnd("failed", upstream=True, keep_answer=False, note=False),
        ),
    ],
)
def test_e4_how_a_turn_ends(phase: Phase, terminal: Terminal, end: TurnEnd) -> None:
    assert on_terminal(phase, terminal) == end


def test_d31_what_follows_the_end_of_a_turn() -> None:
    assert after_end("idle", buffered=False) is Next.EDGE
    assert after_end("failed", buffered=False) is Next.EDGE
    assert after_end("idle", buffered=True) is Next.CONTINUATION, "running again, no idle"
    assert after_end("failed", buffered=True) is Next.EDGE_THEN_TURN


def test_a_session_phase_follows_its_turn() -> None:
    session = Session(SessionRecord(id="s"))
    assert session.phase is Phase.IDLE
    session.turn = Turn("t1")
    assert session.phase is Phase.RUNNING
    session.turn.interrupted = True
    assert session.phase is Phase.INTERRUPTED


def test_a_turn_waits_on_elicitations_and_counts_from_what_it_heard() -> None:
    turn = Turn("t1", last_event=0.0)
    turn.wait_on_elicitation("e1")
    assert turn.waiting == {"elicitation:e1"}
    turn.elicitation_closed("e1")
    turn.elicitation_closed("e1")
    assert turn.waiting == set()
    turn.heard()
    assert time.monotonic() - turn.last_event < 5


def test_the_watchdog_ends_a_turn_too_long_or_silent_unless_it_waits() -> None:
    limits = {"turn_timeout_s": 100.0, "idle_timeout_s": 10.0}
    turn = Turn("t1", started=0.0, last_event=0.0)
    assert overdue(turn, 5.0, **limits) is None
    assert overdue(turn, 11.0, **limits) == "went silent"
    turn.waiting.add("call_1")
    assert overdue(turn, 11.0, **limits) is None, "a turn waiting on a tool or a human"
    assert overdue(turn, 101.0, **limits) == "took too long", "waiting or not"
    assert watchdog_error("went silent") == {
        "code": "turn_watchdog",
        "message": "the turn went silent and was ended by the runner",
    }
