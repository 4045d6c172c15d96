"""The chaos checks find what they are meant to find (corral/bench/_chaos_check.py).

The oracle of the chaos suite is tested on streams made up here, one fault each: a chaos run
that passes must mean the invariants held, not that the checks were blind.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from corral.bench._chaos_check import Tally, check_session
from corral.bench._chaos_client import Event, SessionLog
from corral.bench._chaos_host import expected_tokens, processes_under

DELTAS = 2


class Stream:
    def __init__(self) -> None:
        self.log = SessionLog("s1")

    def add(self, type_: str, **data: Any) -> Stream:
        self.log.add(Event(float(len(self.log.events)), self.log.last_id + 1, type_, data))
        return self

    def status(self, status: str) -> Stream:
        return self.add("session.status", status=status)

    def deltas(self, tokens: list[str], turn_id: str = "t") -> Stream:
        for seq, token in enumerate(tokens, 1):
            self.add(
                "response.output_text.delta", delta=token, turn_id=turn_id, sequence_number=seq
            )
        return self

    def items(self, k: int, *, output: bool = True) -> Stream:
        """What a worker running turn ``k``'s script sends besides its deltas."""
        tokens = expected_tokens(k, DELTAS)
        for text in ("".join(tokens[:DELTAS]), "".join(tokens[DELTAS:])):
            message = {"type": "message", "content": [{"type": "output_text", "text": text}]}
            self.add("response.output_item.done", item=message)
        if output:
            self.add("response.output_item.done", item={"type": "function_call_output"})
        return self.add("response.completed")

    def turn(
        self, k: int, tokens: list[str] | None = None, end: str = "idle", script: int | None = None
    ) -> Stream:
        """Turn ``k``: its deltas (``tokens``, else all of its own), the items of ``script``'s
        turn (else its own), its end."""
        return (
            self.status("running")
            .deltas(expected_tokens(k, DELTAS) if tokens is None else tokens, f"turn{k}")
            .items(k if script is None else script)
            .status(end)
        )


def check(stream: Stream, posted: int, ran: Path | None = None) -> Tally:
    tally = Tally()
    check_session(tally, stream.log, posted, 0, DELTAS, ran)
    return tally


def faults(tally: Tally) -> dict[str, int]:
    names = [
        "no_terminal", "duplicate_terminals", "lost", "events_lost", "duplicated", "misordered",
        "run_twice", "tool_runs_twice", "history_lost", "repeated_stream_ids",
    ]  # fmt: skip
    return {name: getattr(tally, name) for name in names if getattr(tally, name)}


def test_clean_turns_have_no_faults() -> None:
    tally = check(Stream().turn(0).turn(1), posted=2)
    assert faults(tally) == {} and tally.terminal_once == 2 and tally.completed == 2


def test_a_lost_delta_of_a_completed_turn_is_counted() -> None:
    tally = check(Stream().turn(0, expected_tokens(0, DELTAS)[1:]), posted=1)
    assert faults(tally) == {"lost": 1}


def test_a_completed_turn_without_its_tool_output_has_lost_an_event() -> None:
    stream = Stream().status("running").deltas(expected_tokens(0, DELTAS))
    stream.items(0, output=False).status("idle")
    assert faults(check(stream, posted=1)) == {"events_lost": 1}


def test_a_delta_twice_is_duplicated_even_in_a_failed_turn() -> None:
    tokens = expected_tokens(0, DELTAS)
    tally = check(Stream().turn(0, [tokens[0], tokens[0]], end="failed"), posted=1)
    assert faults(tally) == {"duplicated": 1} and tally.failed == 1


def test_deltas_out_of_order_are_misordered() -> None:
    tally = check(Stream().turn(0, expected_tokens(0, DELTAS)[::-1]), posted=1)
    assert faults(tally) == {"misordered": 1}


def test_a_second_terminal_edge_is_a_duplicate_and_a_missing_one_is_counted() -> None:
    assert faults(check(Stream().turn(0).status("idle"), posted=1)) == {"duplicate_terminals": 1}
    stream = Stream().status("running").deltas(expected_tokens(0, DELTAS)).items(0)
    assert faults(check(stream, posted=1)) == {"no_terminal": 1}
    assert faults(check(Stream(), posted=1)) == {"no_terminal": 1}


def test_a_message_run_again_is_run_twice() -> None:
    assert faults(check(Stream().turn(0).turn(0), posted=1)) == {
        "run_twice": 1,
        "duplicated": DELTAS * 2,  # its deltas, shown again
    }


def test_a_turn_given_a_forgotten_history_runs_another_turns_script() -> None:
    tally = check(Stream().turn(0).turn(1, expected_tokens(0, DELTAS), script=0), posted=2)
    # Its own deltas and messages never came; turn 0's came again.
    assert faults(tally) == {
        "history_lost": 1,
        "lost": DELTAS * 2,
        "events_lost": 2,
        "duplicated": DELTAS * 2,
    }


def test_a_shell_call_run_twice_shows_in_ran_txt(tmp_path: Path) -> None:
    ran = tmp_path / "ran.txt"
    ran.write_text("0\n1\n1\n")
    assert faults(check(Stream().turn(0).turn(1), posted=2, ran=ran)) == {"tool_runs_twice": 1}


def test_a_stream_id_sent_again_is_kept_once_and_counted() -> None:
    stream = Stream().turn(0)
    stream.log.add(Event(9.0, stream.log.last_id, "session.status", {"status": "idle"}))
    assert faults(check(stream, posted=1)) == {"repeated_stream_ids": 1}


def test_a_process_left_under_the_hosts_directory_is_found(tmp_path: Path) -> None:
    # An orphan is any live process whose command line or environment names the directory.
    proc = subprocess.Popen(["sleep", "30"], env={**os.environ, "SOME_DIR": str(tmp_path)})
    try:
        assert proc.pid in processes_under(tmp_path)
    finally:
        proc.kill()
        proc.wait()
    assert proc.pid not in processes_under(tmp_path)


def test_kill_latency_counts_turns_in_flight_per_kind_against_a_random_moment_baseline() -> None:
    """From a kill, the wait to the next event of each turn in flight then (a turn not in
    flight is not counted), per kind of process; the baseline draws moments over the kills'
    span, seeded, so two runs of one seed measure it alike."""
    from corral.bench.chaos import Kill, SessionRun, _any_moments, _by_kind, _next_event_latencies

    stream = Stream().status("running").add("response.output_text.delta").status("idle")
    # Events at t = 0, 1, 2; the turn runs from 0 to 2, another from 10 to 12 (no events).
    run = SessionRun(log=stream.log, turns=[(0.0, 2.0), (10.0, None)])
    kills = [Kill(0.25, "dispatch", 1), Kill(1.5, "gateway", 2), Kill(5.0, "dispatch", 3)]
    assert _next_event_latencies([run], [k.at for k in kills]) == [0.5, 0.75]
    by_kind = _by_kind([run], kills)
    assert by_kind == {
        "dispatch": {"n": 1, "p50_ms": 750.0, "p99_ms": 750.0},
        "gateway": {"n": 1, "p50_ms": 500.0, "p99_ms": 500.0},
    }
    span = (0.0, 12.0)
    moments = _any_moments(kills, 7, span)
    assert len(moments) == 12 and all(0.25 <= m <= 5.0 for m in moments)
    assert (
        moments == sorted(moments) == _any_moments(kills, 7, span) != _any_moments(kills, 8, span)
    )
    # A control run (--kind none) has no kills: its moments span the run.
    control = _any_moments([], 7, span)
    assert len(control) == 400 and min(control) < 1.0 and max(control) > 11.0


def test_the_longest_waits_of_turns_in_flight_name_their_events_and_the_kills_meanwhile() -> None:
    from corral.bench.chaos import Kill, SessionRun, _longest_waits

    stream = Stream().status("running").add("response.output_text.delta").status("idle")
    stream.log.events[2].at = 9.0  # waited 8 s after the delta
    stream.status("running")  # at 3.0: another turn, not in flight here
    run = SessionRun(log=stream.log, turns=[(0.0, 9.0)])
    kills = [Kill(2.0, "gateway", 1), Kill(4.0, "gateway", 2), Kill(5.0, "policy", 3)]
    (longest, second) = _longest_waits([run], kills, n=2)
    assert longest == {
        "seconds": 8.0,
        "session_id": "s1",
        "from": "response.output_text.delta",
        "to": "session.status idle",
        "kills": {"gateway": 2, "policy": 1},
    }
    assert (second["seconds"], second["from"], second["kills"]) == (
        1.0,
        "session.status running",
        {},
    )
