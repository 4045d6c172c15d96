"""The host's Prometheus endpoint: ``GET /metrics`` on ``[metrics] listen``.

Everything it shows is read, at each scrape, from what the host already keeps or asks for
``corral status``: the children's rows (state, restarts, last exit), the broker's mailboxes,
dead letters and parked entries, and the inspection snapshots of the running actors (the
gateway's tunnels and relay tally, dispatch's turn tally, the harness actor's workers). No
actor keeps a second set of books for it. The actors' tallies are added up across their
restarts (:mod:`._tally`), and so are the host's own restart counts: a counter goes down only
when the host itself restarts, which Prometheus's ``rate()`` takes as a reset. The host also
asks every :data:`REFRESH_S` seconds, so a ``kill -9`` loses at most that much of an actor's
counting.

The text is made by ``prometheus-client`` from one collector (:class:`HostCollector`) whose
families are built from a snapshot gathered before the registry is read; it is served by a
small HTTP/1.1 server on trio and ``h11`` (no thread: ``prometheus_client``'s own server
runs one). :data:`METRICS` names every family; ``deploy/grafana-dashboard.json`` queries
exactly these (``tests/unit/test_deploy.py``).
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import h11
import trio

from ._tally import Histogram, Incarnations, Tally, add, parse

log = logging.getLogger("corral.host")

#: Every family the endpoint exposes: name (as scraped) → (type, help).
METRICS: dict[str, tuple[str, str]] = {
    "corral_host_state": (
        "gauge",
        "1 for the host's state (starting, running, draining, stopping)",
    ),
    "corral_actor_up": ("gauge", "1 while the actor (or the control plane, 'server') runs"),
    "corral_actor_restarts_total": ("counter", "Restarts of a child, by the cause of its exit"),
    "corral_mailbox_depth": ("gauge", "Durable messages in the actor's mailbox, not yet acked"),
    "corral_mailbox_oldest_age_seconds": ("gauge", "Age of the oldest message in the mailbox"),
    "corral_mailbox_stuck": ("gauge", "Messages delivered and unacked past bus.stuck_after_s"),
    "corral_dead_letters": ("gauge", "Dead letters kept, by the actor they were addressed to"),
    "corral_parked_elicitations": ("gauge", "Elicitations (approvals) parked, waiting on a person"),
    "corral_tunnel_state": ("gauge", "1 for the state of each runner's tunnel to its server"),
    "corral_harness_workers": ("gauge", "Harness worker processes (one per session in use)"),
    "corral_turns_total": ("counter", "Turns ended, by outcome (and error code when failed)"),
    "corral_turn_first_delta_seconds": ("histogram", "From a turn's start to its first text"),
    "corral_deltas_relayed_total": ("counter", "Text deltas taken for relay to the server"),
}

HOST_STATES = ("starting", "running", "draining", "stopping")
TUNNEL_STATES = ("connecting", "connected", "reconnecting", "fatal")
#: How often the host reads the actors' tallies between scrapes.
REFRESH_S = 15.0
#: A scrape that has not sent its request in this long is dropped.
REQUEST_TIMEOUT_S = 10.0

#: An actor's tally name → the family it feeds (without ``_total``, as the client adds it)
#: and its labels: every sample carries all of them (``""`` where a series has none).
_TALLIED: dict[str, tuple[str, list[str]]] = {
    "turns": ("corral_turns", ["outcome", "error"]),
    "turn_first_delta_seconds": ("corral_turn_first_delta_seconds", []),
    "deltas_relayed": ("corral_deltas_relayed", ["runner_id"]),
}


def exit_cause(last_exit: dict[str, Any] | None) -> str:
    """A bounded label for why a child exited: ``no_heartbeat``, a signal's name
    (``SIGKILL``), ``exit_<code>`` or ``unknown`` (an adopted process's status)."""
    if not last_exit:
        return "unknown"
    reason = str(last_exit.get("reason") or "")
    code = last_exit.get("code")
    if reason.startswith("no heartbeat"):
        return "no_heartbeat"
    if isinstance(code, int) and code < 0:
        named = re.search(r"\((SIG[A-Z0-9]+)\)", reason)
        return named.group(1) if named else f"signal_{-code}"
    return f"exit_{code}" if isinstance(code, int) else "unknown"


@dataclass(frozen=True, slots=True)
class ChildRow:
    """What the endpoint needs of one of the host's children."""

    name: str
    #: It joins the bus (an actor); the control plane does not and has no snapshot.
    bus_peer: bool
    running: bool
    pid: int | None
    restarts: int
    last_exit: dict[str, Any] | None


@dataclass(slots=True)
class Sources:
    """Where the host's own numbers come from (the host passes its views)."""

    state: Callable[[], str]
    children: Callable[[], list[ChildRow]]
    mailboxes: Callable[[], list[dict[str, Any]]]
    dead_letters: Callable[[], list[dict[str, Any]]]
    elicitations: Callable[[], list[dict[str, Any]]]
    #: A running actor's inspection snapshot, or None if it does not answer soon.
    inspect: Callable[[str], Awaitable[dict[str, Any] | None]]


@dataclass(slots=True, eq=False)  # eq=False: hashable, as a registry's collector must be
class HostMetrics:
    """The host's metrics: the restart counts and actor tallies it keeps across restarts,
    and the families of the last snapshot."""

    sources: Sources
    restarts: Tally = field(default_factory=Tally)
    tallies: dict[str, Incarnations] = field(default_factory=dict)
    _restarts_seen: dict[str, int] = field(default_factory=dict)
    _families: list[Any] = field(default_factory=list)

    def child_spawning(self, row: ChildRow) -> None:
        """A child is being spawned: if it is a restart, count it by its last exit."""
        seen = self._restarts_seen.get(row.name, 0)
        if row.restarts < seen:  # a new child of the name (a rebind): counted from zero
            seen = 0
        if row.restarts > seen:
            cause = exit_cause(row.last_exit)
            self.restarts.count("restarts", row.restarts - seen, actor=row.name, cause=cause)
        self._restarts_seen[row.name] = row.restarts

    async def refresh(self) -> dict[str, dict[str, Any]]:
        """Ask every running actor for its snapshot; keep their tallies; the snapshots."""
        snapshots: dict[str, dict[str, Any]] = {}

        async def ask(row: ChildRow) -> None:
            snapshot = await self.sources.inspect(row.name)
            if snapshot is None or row.pid is None:
                return
            snapshots[row.name] = snapshot
            if "tally" in snapshot:
                incarnations = self.tallies.setdefault(row.name, Incarnations())
                incarnations.report(row.pid, parse(snapshot["tally"]))

        async with trio.open_nursery() as nursery:
            for row in self.sources.children():
                if row.running and row.bus_peer:
                    nursery.start_soon(ask, row)
        return snapshots

    async def families(self) -> list[Any]:
        """Every family, from a fresh snapshot."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        snapshots = await self.refresh()
        src = self.sources
        out: list[Any] = []

        def gauge(name: str, labels: list[str]) -> GaugeMetricFamily:
            fam = GaugeMetricFamily(name, METRICS[name][1], labels=labels)
            out.append(fam)
            return fam

        host = gauge("corral_host_state", ["state"])
        for state in HOST_STATES:
            host.add_metric([state], 1.0 if src.state() == state else 0.0)
        up = gauge("corral_actor_up", ["actor"])
        for row in src.children():
            up.add_metric([row.name], 1.0 if row.running else 0.0)
        restarts = CounterMetricFamily(
            "corral_actor_restarts",
            METRICS["corral_actor_restarts_total"][1],
            labels=["actor", "cause"],
        )
        for key, value in self.restarts.counters.get("restarts", {}).items():
            labels = dict(key)
            restarts.add_metric([labels["actor"], labels["cause"]], value)
        out.append(restarts)
        depth = gauge("corral_mailbox_depth", ["actor"])
        oldest = gauge("corral_mailbox_oldest_age_seconds", ["actor"])
        stuck = gauge("corral_mailbox_stuck", ["actor"])
        for actor, (n, age, stuck_n) in _per_actor(src.mailboxes()).items():
            depth.add_metric([actor], n)
            oldest.add_metric([actor], age)
            stuck.add_metric([actor], stuck_n)
        dead = gauge("corral_dead_letters", ["actor"])
        counts: dict[str, int] = {}
        for letter in src.dead_letters():
            counts[str(letter["actor"])] = counts.get(str(letter["actor"]), 0) + 1
        for actor, n in sorted(counts.items()):
            dead.add_metric([actor], n)
        parked = gauge("corral_parked_elicitations", [])
        waiting = [e for e in src.elicitations() if e.get("state", "parked") == "parked"]
        parked.add_metric([], len(waiting))
        # The lists ``corral status`` shows too (``ActorRole.status_lists``): the gateway's
        # tunnels, the harness actor's workers.
        tunnels = gauge("corral_tunnel_state", ["runner_id", "state"])
        for tunnel in _listed(snapshots, "tunnels"):
            states = dict.fromkeys(TUNNEL_STATES, 0.0) | {str(tunnel["state"]): 1.0}
            for state, value in states.items():
                tunnels.add_metric([str(tunnel["runner_id"]), state], value)
        workers = gauge("corral_harness_workers", [])
        if any("workers" in snapshot for snapshot in snapshots.values()):
            workers.add_metric([], len(_listed(snapshots, "workers")))
        out.extend(self._tallied())
        return out

    def _tallied(self) -> Iterator[Any]:
        """The actors' tallies, added up over their incarnations, as families."""
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        merged = Tally()
        for incarnations in self.tallies.values():
            merged = add(merged, incarnations.total())
        for name, (family, labels) in _TALLIED.items():
            scraped = f"{family}_total" if f"{family}_total" in METRICS else family
            kind, help_text = METRICS[scraped]
            if kind == "histogram":
                hist = HistogramMetricFamily(family, help_text, labels=labels)
                for key, h in sorted(merged.histograms.get(name, {}).items()):
                    row = dict(key)
                    hist.add_metric([row.get(label, "") for label in labels], _cumulative(h), h.sum)
                yield hist
            else:
                counter = CounterMetricFamily(family, help_text, labels=labels)
                for key, value in sorted(merged.counters.get(name, {}).items()):
                    row = dict(key)
                    counter.add_metric([row.get(label, "") for label in labels], value)
                yield counter

    async def render(self, accept: str) -> tuple[bytes, str]:
        """The exposition text for a scrape (OpenMetrics if ``accept`` asks), its type."""
        from prometheus_client import CollectorRegistry
        from prometheus_client.exposition import choose_encoder

        self._families = await self.families()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)  # type: ignore[arg-type]  # a collector is what collects
        encoder, content_type = choose_encoder(accept)
        return encoder(registry), content_type

    def collect(self) -> Iterator[Any]:
        """What the registry reads: the families :meth:`render` just built."""
        yield from self._families

    async def keep_fresh(self) -> None:
        """Read the actors' tallies every :data:`REFRESH_S` seconds between scrapes."""
        while True:
            await trio.sleep(REFRESH_S)
            try:
                await self.refresh()
            except Exception:
                log.exception("metrics: refreshing the actors' tallies failed")


def _listed(snapshots: dict[str, dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """The rows of list ``key`` in every snapshot that has one."""
    return [row for snapshot in snapshots.values() for row in snapshot.get(key, [])]


def _per_actor(boxes: list[dict[str, Any]]) -> dict[str, tuple[int, float, int]]:
    """Mailbox rows as (depth, oldest age, stuck) per actor; the mailboxes of the harness
    workers (``harness/<session>``, one per session) as one, ``harness/*``, so that the
    number of series does not grow with the sessions."""
    out: dict[str, tuple[int, float, int]] = {}
    for box in boxes:
        name = str(box["actor"])
        actor = name.split("/", 1)[0] + "/*" if "/" in name else name
        n, age, stuck = out.get(actor, (0, 0.0, 0))
        out[actor] = (
            n + box["queued"] + box["in_flight"] + box["parked"],
            max(age, box["oldest_age_s"] or 0.0),
            stuck + box["stuck"],
        )
    return out


def _cumulative(h: Histogram) -> list[tuple[str, float]]:
    """A histogram's buckets as the exposition wants them: cumulative, ``+Inf`` last."""
    out, running = [], 0
    for bound, n in zip([*map(str, h.bounds), "+Inf"], h.buckets, strict=True):
        running += n
        out.append((bound, float(running)))
    return out


async def serve_metrics(
    metrics: HostMetrics,
    host: str,
    port: int,
    *,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``GET /metrics`` on ``host:port`` until cancelled; started with the address
    it listens on (port 0 picks one).

    Raises:
        OSError: the address cannot be bound (in use, not this machine's).
    """
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()
    log.info("metrics at http://%s:%d/metrics", host, bound[1])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(metrics.keep_fresh)
        task_status.started((host, int(bound[1])))
        await trio.serve_listeners(functools.partial(_connection, metrics), listeners)


async def _connection(metrics: HostMetrics, stream: trio.abc.Stream) -> None:
    """One client connection: requests answered in turn until it closes (keep-alive)."""
    conn = h11.Connection(h11.SERVER)
    try:
        while True:
            request = await _next_request(conn, stream)
            if request is None:
                return
            status, body, content_type = await _answer(metrics, request)
            headers = [
                ("content-type", content_type),
                ("content-length", str(len(body))),
            ]
            data = conn.send(h11.Response(status_code=status, headers=headers))
            data += conn.send(h11.Data(data=body)) if request.method != b"HEAD" else b""
            data += conn.send(h11.EndOfMessage())
            await stream.send_all(data or b"")
            if conn.our_state is h11.MUST_CLOSE:
                return
            conn.start_next_cycle()
    except (h11.ProtocolError, trio.BrokenResourceError, trio.ClosedResourceError):
        return
    finally:
        await stream.aclose()


async def _next_request(conn: h11.Connection, stream: trio.abc.Stream) -> h11.Request | None:
    """The next request's head (its body, if any, read and ignored), or None at the end."""
    request: h11.Request | None = None
    with trio.move_on_after(REQUEST_TIMEOUT_S):
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(bytes(await stream.receive_some(65536)))
            elif isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.EndOfMessage):
                return request
            elif isinstance(event, h11.ConnectionClosed):
                return None
    return None


async def _answer(metrics: HostMetrics, request: h11.Request) -> tuple[int, bytes, str]:
    plain = "text/plain; charset=utf-8"
    path = request.target.split(b"?", 1)[0]
    if path != b"/metrics":
        return 404, b"not found: corral serves /metrics\n", plain
    if request.method not in (b"GET", b"HEAD"):
        return 405, b"method not allowed: GET /metrics\n", plain
    accept = next((v.decode("latin-1") for k, v in request.headers if k == b"accept"), "")
    try:
        body, content_type = await metrics.render(accept)
    except Exception:
        log.exception("metrics: a scrape failed")
        return 500, b"the scrape failed; see the host's log\n", plain
    return 200, body, content_type
