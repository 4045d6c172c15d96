"""What an actor counts for the host's ``/metrics``, and how the host adds up incarnations.

An actor keeps a :class:`Tally` (counters and histograms by name and labels, in memory) and
reports it in its inspection snapshot under ``tally``: the host already asks actors for their
snapshots (``corral status``), so the metrics endpoint reads the same answer rather than a
second path. A restarted actor starts from zero; the host keeps what the earlier
incarnations reported (:class:`Incarnations`), so a counter never goes down while the host
runs. What a ``kill -9`` took with it since the host last asked (at the last scrape) is
lost: the counters are for rates and dashboards, the journal is the record.

Pure: no I/O, no clock, tested without processes (``tests/unit/test_tally.py``).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

#: Seconds from a turn's start to its first text delta (``corral_turn_first_delta_seconds``).
FIRST_DELTA_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

Labels = tuple[tuple[str, str], ...]


def _key(labels: dict[str, str]) -> Labels:
    return tuple(sorted((k, str(v)) for k, v in labels.items()))


@dataclass(slots=True)
class Histogram:
    """Cumulative-free bucket counts (one per bound, plus +Inf last), sum and count."""

    bounds: tuple[float, ...]
    buckets: list[int]
    sum: float = 0.0
    count: int = 0

    def observe(self, value: float) -> None:
        self.buckets[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1


@dataclass(slots=True)
class Tally:
    """An actor's counters and histograms."""

    counters: dict[str, dict[Labels, float]] = field(default_factory=dict)
    histograms: dict[str, dict[Labels, Histogram]] = field(default_factory=dict)

    def count(self, name: str, n: float = 1, **labels: str) -> None:
        series = self.counters.setdefault(name, {})
        key = _key(labels)
        series[key] = series.get(key, 0) + n

    def observe(self, name: str, value: float, bounds: tuple[float, ...], **labels: str) -> None:
        series = self.histograms.setdefault(name, {})
        key = _key(labels)
        hist = series.get(key)
        if hist is None:
            hist = series[key] = Histogram(bounds, [0] * (len(bounds) + 1))
        hist.observe(value)

    def snapshot(self) -> dict[str, Any]:
        """JSON-friendly, for the actor's inspection snapshot (decoded by :func:`parse`)."""
        return {
            "counters": {
                name: [{"labels": dict(k), "value": v} for k, v in series.items()]
                for name, series in self.counters.items()
            },
            "histograms": {
                name: [
                    {
                        "labels": dict(k),
                        "bounds": list(h.bounds),
                        "buckets": h.buckets,
                        "sum": h.sum,
                        "count": h.count,
                    }
                    for k, h in series.items()
                ]
                for name, series in self.histograms.items()
            },
        }


def parse(data: Any) -> Tally:
    """A :meth:`Tally.snapshot` read back; whatever does not have its shape is left out
    (an actor of another version must not break a scrape)."""
    tally = Tally()
    if not isinstance(data, dict):
        return tally
    for name, rows in (data.get("counters") or {}).items():
        for row in rows if isinstance(rows, list) else ():
            try:
                tally.count(str(name), float(row["value"]), **row["labels"])
            except (KeyError, TypeError, ValueError):
                continue
    for name, rows in (data.get("histograms") or {}).items():
        for row in rows if isinstance(rows, list) else ():
            try:
                bounds = tuple(float(b) for b in row["bounds"])
                buckets = [int(b) for b in row["buckets"]]
                if len(buckets) != len(bounds) + 1:
                    continue
                hist = Histogram(bounds, buckets, float(row["sum"]), int(row["count"]))
                tally.histograms.setdefault(str(name), {})[_key(row["labels"])] = hist
            except (KeyError, TypeError, ValueError):
                continue
    return tally


def add(total: Tally, more: Tally) -> Tally:
    """``total`` plus ``more``, series by series (histograms of other bounds: ``more``'s
    replace them, as a new version's buckets would)."""
    out = Tally(
        {name: dict(series) for name, series in total.counters.items()},
        {
            name: {k: Histogram(h.bounds, list(h.buckets), h.sum, h.count) for k, h in s.items()}
            for name, s in total.histograms.items()
        },
    )
    for name, series in more.counters.items():
        for key, value in series.items():
            mine = out.counters.setdefault(name, {})
            mine[key] = mine.get(key, 0) + value
    for name, hseries in more.histograms.items():
        for key, h in hseries.items():
            mine_h = out.histograms.setdefault(name, {})
            old = mine_h.get(key)
            if old is None or old.bounds != h.bounds:
                mine_h[key] = Histogram(h.bounds, list(h.buckets), h.sum, h.count)
            else:
                old.buckets = [a + b for a, b in zip(old.buckets, h.buckets, strict=True)]
                old.sum += h.sum
                old.count += h.count
    return out


@dataclass(slots=True)
class Incarnations:
    """One actor's tallies across its restarts, as the host sees them.

    :meth:`report` takes each answer with the pid of the process that gave it; an answer of
    a new pid folds the previous incarnation's last report into the base.
    """

    base: Tally = field(default_factory=Tally)
    pid: int | None = None
    last: Tally = field(default_factory=Tally)

    def report(self, pid: int, tally: Tally) -> None:
        if pid != self.pid:
            self.base = add(self.base, self.last)
            self.pid = pid
        self.last = tally

    def total(self) -> Tally:
        return add(self.base, self.last)
