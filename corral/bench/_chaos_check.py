"""The chaos run's checks: what each session's stream says about each of its turns.

A session's turns run one after another (the driver posts message *k* once turn *k - 1* has
ended), so its stream cuts into **segments**: a segment opens at a ``session.status running``
that follows an end (or the stream's start) and closes at the next ``idle``/``failed``. The
*i*-th segment is the run of the *i*-th message. From the segments:

* **terminal once** — a message's segment closes with exactly one terminal edge and no stray
  one follows it before the next segment opens (a stray one is a duplicated edge);
* **lost / duplicated / misordered** — a completed (``idle``) segment carries exactly the
  tokens of its turn, each once, in order; a token is unique in its session, so one seen
  twice anywhere (a re-sent delta, a turn run again, a replay) is duplicated;
* **events lost** — a completed segment has the events every completed turn has: an
  assistant message item per text part, the shell call's output item, ``response.completed``;
* **run twice** — more segments than messages (a message started again), or a turn's shell
  call in ``ran.txt`` more than once;
* **history lost** — a segment whose tokens are another turn's: the harness was given a
  history without some of the session's earlier messages.

A completed turn whose approval was cancelled by a crash (the script's decline branch, ``no|``)
is counted apart, its tokens checked against that branch.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ._chaos_client import TERMINAL, Event, SessionLog
from ._chaos_host import TOKEN, expected_tokens

DELTA = "response.output_text.delta"
DECLINED = "no|"


@dataclass
class Segment:
    """One turn as the stream showed it."""

    start: Event
    events: list[Event] = field(default_factory=list)
    ends: list[Event] = field(default_factory=list)

    @property
    def status(self) -> str | None:
        return str(self.ends[0].data.get("status")) if self.ends else None

    def tokens(self) -> list[str]:
        return [str(e.data.get("delta") or "") for e in self.events if e.type == DELTA]

    def missing_events(self, texts: list[str]) -> list[str]:
        """What a completed turn's stream lacks of the events every such turn has: an
        assistant message item per text part, the shell call's output item, and the
        ``response.completed`` (deltas are counted apart)."""
        found = []
        for e in self.events:
            item = e.data.get("item") if e.type == "response.output_item.done" else None
            if isinstance(item, dict) and item.get("type") == "message":
                content = item.get("content") or [{}]
                found.append(f"message {content[0].get('text')!r}")
            elif isinstance(item, dict) and item.get("type") == "function_call_output":
                found.append("function_call_output")
            elif e.type == "response.completed":
                found.append("response.completed")
        wanted = [f"message {text!r}" for text in texts]
        wanted += ["function_call_output", "response.completed"]
        return [w for w in wanted if w not in found]

    def error_code(self) -> str:
        for e in reversed(self.ends + self.events):
            error = e.data.get("error") or (e.data.get("response") or {}).get("error")
            if isinstance(error, dict) and error.get("code"):
                return str(error["code"])
        return "unknown"


def segments(log: SessionLog) -> tuple[list[Segment], int]:
    """The session's segments, and the stray terminal edges outside any."""
    out: list[Segment] = []
    stray = 0
    current: Segment | None = None
    for event in log.events:
        is_status = event.type == "session.status"
        status = event.data.get("status") if is_status else None
        if current is None:
            if status == "running":
                current = Segment(event)
                out.append(current)
            elif status in TERMINAL:
                if out:
                    out[-1].ends.append(event)  # a second edge for the turn before
                else:
                    stray += 1
            continue
        if status in TERMINAL:
            current.ends.append(event)
            current = None
        else:
            current.events.append(event)
    return out, stray


@dataclass
class Tally:
    """The checks' counts over every session (the figures' raw material)."""

    messages: int = 0
    refused: int = 0
    segments: int = 0
    terminal_once: int = 0
    no_terminal: int = 0
    duplicate_terminals: int = 0
    completed: int = 0
    failed: int = 0
    approvals_cancelled: int = 0
    lost: int = 0
    events_lost: int = 0
    duplicated: int = 0
    misordered: int = 0
    run_twice: int = 0
    tool_runs_twice: int = 0
    history_lost: int = 0
    repeated_stream_ids: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)

    def problem(self, text: str) -> None:
        if len(self.problems) < 50:
            self.problems.append(text)


def check_session(
    tally: Tally, log: SessionLog, posted: int, refused: int, deltas: int, ran: Path | None
) -> None:
    """Add one session's turns to ``tally`` (``posted`` messages, ``refused`` of them with
    ``session.delivery_failed``; ``ran`` its ``ran.txt`` if the session got that far)."""
    sid = log.session_id
    tally.messages += posted
    tally.refused += refused
    tally.repeated_stream_ids += len(log.repeated_ids)
    if log.repeated_ids:
        tally.problem(f"{sid}: stream ids {log.repeated_ids[:5]} came again or out of order")
    segs, stray = segments(log)
    tally.segments += len(segs)
    tally.duplicate_terminals += stray
    expected_runs = posted - refused
    if len(segs) > expected_runs:
        tally.run_twice += len(segs) - expected_runs
        tally.problem(f"{sid}: {len(segs)} turns ran for {expected_runs} messages")
    elif len(segs) < expected_runs:
        missing = expected_runs - len(segs)
        tally.no_terminal += missing
        tally.problem(f"{sid}: {missing} of {expected_runs} messages never started a turn")
    seen_keys: Counter[tuple[str, int]] = Counter()
    ran_turns: set[int] = set()
    #: Tokens are unique in a session (turn, index): one seen twice anywhere is a duplicate,
    #: in its own turn (a re-sent delta) or in another (a turn run again, a replay).
    everywhere: Counter[str] = Counter()
    for i, seg in enumerate(segs):
        _check_edges(tally, sid, i, seg)
        for e in seg.events:
            if e.type == DELTA:
                key = (str(e.data.get("turn_id")), int(e.data.get("sequence_number") or 0))
                seen_keys[key] += 1
        tokens = seg.tokens()
        counts = Counter(tokens)
        everywhere.update(tokens)
        dup = sum(n - 1 for n in counts.values() if n > 1)
        if dup:
            tally.problem(f"{sid}: turn {i}: {dup} deltas twice ({_first_dups(counts)})")
        turns_seen = {int(t[:3]) for t in counts if len(t) == TOKEN and t[:3].isdigit()}
        rerun = i >= expected_runs or bool(turns_seen & ran_turns and len(segs) > expected_runs)
        ran_turns |= turns_seen
        if rerun:
            continue  # a message run again: counted as run twice, its content is no turn's
        if turns_seen and turns_seen != {i % 1000}:
            tally.history_lost += 1
            tally.problem(f"{sid}: turn {i} ran the script of turn(s) {sorted(turns_seen)}")
        if seg.status == "failed":
            tally.failed += 1
            tally.failures[seg.error_code()] += 1
            continue
        if seg.status != "idle":
            continue
        _check_completed(tally, sid, i, seg, tokens, deltas)
    tally.duplicated += sum(n - 1 for t, n in everywhere.items() if n > 1 and t != DECLINED)
    key_dups = sum(n - 1 for n in seen_keys.values() if n > 1)
    if key_dups:
        tally.problem(f"{sid}: {key_dups} (turn id, sequence number) pairs came twice")
    if ran is not None and ran.exists():
        runs = Counter(line.strip() for line in ran.read_text().splitlines() if line.strip())
        twice = sum(n - 1 for n in runs.values() if n > 1)
        if twice:
            tally.tool_runs_twice += twice
            tally.problem(f"{sid}: shell calls run twice: {dict(runs)}")


def _check_edges(tally: Tally, sid: str, i: int, seg: Segment) -> None:
    """Turn ``i`` has exactly one terminal edge."""
    if len(seg.ends) == 1:
        tally.terminal_once += 1
    elif not seg.ends:
        tally.no_terminal += 1
        tally.problem(f"{sid}: turn {i} (from event {seg.start.id}) has no terminal edge")
    else:
        tally.duplicate_terminals += len(seg.ends) - 1
        ids = [e.id for e in seg.ends]
        tally.problem(f"{sid}: turn {i} has {len(seg.ends)} terminal edges (events {ids})")


def _check_completed(
    tally: Tally, sid: str, i: int, seg: Segment, tokens: list[str], deltas: int
) -> None:
    """Completed turn ``i`` (its ``tokens`` as streamed) has every delta and item of its
    script, each once and in order."""
    tally.completed += 1
    counts = Counter(tokens)
    expected = expected_tokens(i, deltas)
    if DECLINED in counts:
        tally.approvals_cancelled += 1
        tally.problem(f"{sid}: turn {i} completed on its decline branch (approval cancelled)")
        expected = [*expected[:deltas], DECLINED]
    texts = ["".join(expected[:deltas]), "".join(expected[deltas:])]
    absent = seg.missing_events(texts)
    if absent:
        tally.events_lost += len(absent)
        tally.problem(f"{sid}: turn {i} completed without {', '.join(absent)}")
    missing = sum(1 for t in expected if t not in counts)
    if missing:
        tally.lost += missing
        tally.problem(f"{sid}: turn {i} completed, {missing} of {len(expected)} deltas lost")
    order = list(dict.fromkeys(tokens))
    if [t for t in order if t in expected] != [t for t in expected if t in counts]:
        tally.misordered += 1
        tally.problem(f"{sid}: turn {i}: deltas out of order")


def _first_dups(counts: Counter[str]) -> str:
    return ", ".join(f"{t!r}x{n}" for t, n in counts.items() if n > 1)[:120]
