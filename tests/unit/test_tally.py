"""What actors count for ``/metrics`` and how the host adds their incarnations up
(``corral/actors/_tally.py``), the labels the endpoint derives (``_metrics.py``), without
processes."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from corral.actors._metrics import (
    METRICS,
    ChildRow,
    HostMetrics,
    Sources,
    _cumulative,
    _per_actor,
    exit_cause,
)
from corral.actors._tally import (
    FIRST_DELTA_BUCKETS,
    Histogram,
    Incarnations,
    Tally,
    add,
    parse,
)


def _counter(tally: Tally, name: str, **labels: str) -> float:
    return tally.counters[name][tuple(sorted(labels.items()))]


def test_a_tally_counts_by_labels_and_reads_back_from_its_snapshot() -> None:
    tally = Tally()
    tally.count("turns", outcome="completed")
    tally.count("turns", outcome="completed")
    tally.count("turns", outcome="failed", error="x")
    tally.observe("first", 0.3, FIRST_DELTA_BUCKETS)
    tally.observe("first", 100.0, FIRST_DELTA_BUCKETS)
    again = parse(tally.snapshot())
    assert _counter(again, "turns", outcome="completed") == 2
    assert _counter(again, "turns", error="x", outcome="failed") == 1
    (hist,) = again.histograms["first"].values()
    assert hist.count == 2 and hist.sum == 100.3
    assert hist.buckets[FIRST_DELTA_BUCKETS.index(0.5)] == 1
    assert hist.buckets[-1] == 1, "past the last bound: +Inf"


def test_a_snapshot_of_another_shape_is_left_out_not_an_error() -> None:
    assert parse(None) == Tally()
    assert parse({"counters": {"a": "no"}, "histograms": {"h": [{"bounds": [1]}]}}) == Tally()
    bad_rows: dict[str, Any] = {
        "counters": {"a": [{"labels": {}, "value": "x"}, {"labels": {}, "value": 2}]},
        "histograms": {
            "h": [{"labels": {}, "bounds": [1.0], "buckets": [1], "sum": 1, "count": 1}]
        },
    }
    tally = parse(bad_rows)
    assert _counter(tally, "a") == 2
    assert "h" not in tally.histograms, "buckets must be one more than the bounds"


def test_incarnations_fold_a_restarted_actors_counts_into_the_base() -> None:
    seen = Incarnations()
    first = Tally()
    first.count("turns", outcome="completed")
    seen.report(100, first)
    first.count("turns", outcome="completed")
    seen.report(100, first)  # the same incarnation, counted further: not added twice
    assert _counter(seen.total(), "turns", outcome="completed") == 2
    second = Tally()
    second.count("turns", outcome="completed")
    seen.report(200, second)  # restarted: counts from zero again
    assert _counter(seen.total(), "turns", outcome="completed") == 3
    seen.report(200, Tally())
    assert _counter(seen.total(), "turns", outcome="completed") == 2, "the base stays"


def test_add_sums_histograms_of_the_same_bounds_and_replaces_others() -> None:
    a, b = Tally(), Tally()
    a.observe("h", 0.1, (1.0,))
    b.observe("h", 5.0, (1.0,))
    summed = add(a, b).histograms["h"][()]
    assert (summed.buckets, summed.count, summed.sum) == ([1, 1], 2, 5.1)
    c = Tally()
    c.observe("h", 0.1, (2.0, 3.0))
    assert add(a, c).histograms["h"][()].bounds == (2.0, 3.0)
    assert a.histograms["h"][()].count == 1, "add leaves its arguments alone"


def test_exit_causes_are_a_bounded_label() -> None:
    assert exit_cause({"code": -9, "reason": "killed by signal 9 (SIGKILL)"}) == "SIGKILL"
    heartbeat = "no heartbeat for 3.1s (killed by signal 9 (SIGKILL))"
    assert exit_cause({"code": -9, "reason": heartbeat}) == "no_heartbeat"
    assert exit_cause({"code": 1, "reason": "exited with code 1"}) == "exit_1"
    assert exit_cause({"code": -64, "reason": "killed by signal 64 (signal 64)"}) == "signal_64"
    assert exit_cause({"code": None, "reason": "exited (status unknown)"}) == "unknown"
    assert exit_cause(None) == "unknown"


def test_worker_mailboxes_are_one_series_and_buckets_are_cumulative() -> None:
    def box(actor: str, queued: int, age: float | None) -> dict[str, Any]:
        return {
            "actor": actor,
            "queued": queued,
            "in_flight": 1,
            "parked": 0,
            "oldest_age_s": age,
            "stuck": 0,
        }

    rows = [box("dispatch", 2, 1.5), box("harness/s1", 0, None), box("harness/s2", 3, 4.0)]
    assert _per_actor(rows) == {"dispatch": (3, 1.5, 0), "harness/*": (5, 4.0, 0)}
    hist = Histogram((1.0, 2.0), [1, 0, 2], sum=9.0, count=3)
    assert _cumulative(hist) == [("1.0", 1.0), ("2.0", 1.0), ("+Inf", 3.0)]


async def test_the_endpoint_text_has_every_family_and_counts_restarts_by_cause() -> None:
    rows = [ChildRow("dispatch", True, True, 10, 0, None)]
    tally = Tally()
    tally.count("turns", outcome="completed")

    async def inspect(actor: str) -> dict[str, Any] | None:
        return {"tally": tally.snapshot(), "tunnels": [], "workers": [{}]}

    metrics = HostMetrics(
        Sources(
            state=lambda: "draining",
            children=lambda: rows,
            mailboxes=lambda: [],
            dead_letters=lambda: [{"actor": "policy"}, {"actor": "policy"}],
            elicitations=lambda: [{"state": "parked"}, {"state": "resolved"}],
            inspect=inspect,
        )
    )
    killed = {"code": -9, "reason": "killed by signal 9 (SIGKILL)"}
    metrics.child_spawning(ChildRow("dispatch", True, False, 11, 1, killed))
    metrics.child_spawning(ChildRow("dispatch", True, False, 11, 1, killed))  # seen: once
    metrics.child_spawning(ChildRow("gateway", True, False, 12, 2, killed))
    metrics.child_spawning(ChildRow("gateway", True, False, 13, 0, None))  # a rebind: new child
    metrics.child_spawning(ChildRow("gateway", True, False, 14, 1, killed))
    body, content_type = await metrics.render("")
    assert content_type.startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    # The parser names counters without ``_total``; every family is there, even empty.
    assert {n.removesuffix("_total") for n in METRICS} == set(families)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in families.values()
        for s in f.samples
    }
    restarts = "corral_actor_restarts_total"
    assert samples[(restarts, (("actor", "dispatch"), ("cause", "SIGKILL")))] == 1
    assert samples[(restarts, (("actor", "gateway"), ("cause", "SIGKILL")))] == 3
    assert samples[("corral_host_state", (("state", "draining"),))] == 1
    assert samples[("corral_dead_letters", (("actor", "policy"),))] == 2
    assert samples[("corral_parked_elicitations", ())] == 1
    assert samples[("corral_turns_total", (("error", ""), ("outcome", "completed")))] == 1
    assert samples[("corral_harness_workers", ())] == 1
