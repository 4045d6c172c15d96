"""``corral bench relay --against CMD``: corral and another runner side by side, on one server.

Both runners serve the same real omnigent 0.19.1 server (``omnigent server`` from the omnigent
venv, see :mod:`._omnigent`), whose one agent, ``bench-relay``, runs on the ``openai-agents``
harness with a fake model provider in this process (:class:`~._fake_provider.FakeProvider`)
that answers every call at once with one message of N text deltas. The other runner needs the
server's whole REST API (it fetches the agent, posts items, asks policies), so nothing lighter
than the real server is a fair ground for both; the deltas cross the same server and reach the
same client either way.

Each round starts each runner afresh, with a new token (so a new runner id): corral as a
``corral up`` host with one ``[[runners]]`` table, the other as ``CMD`` (split like a shell
line) in its own process group, its cwd an empty workspace, given exactly the environment
omnigent's ``omnigent run --server`` gives its runner — ``RUNNER_SERVER_URL``,
``OMNIGENT_RUNNER_ID``, ``OMNIGENT_RUNNER_TUNNEL_BINDING_TOKEN``, ``OMNIGENT_RUNNER_WORKSPACE`` —
plus ``HOME``, ``OMNIGENT_CONFIG_HOME`` (a fresh directory), ``OMNIGENT_ANALYTICS=0`` and
``DISABLE_TELEMETRY=true``, and without any other ``OMNIGENT_*`` or ``CORRAL_*`` variable.
Rounds alternate which runner goes first. In a round, through the server's client API as a
user drives it (``POST /v1/sessions``, ``PATCH`` its runner, ``GET …/stream``, ``POST …/events``):

* **cold first delta**: a new session's first message posted → its first delta on the client
  stream (the runner's session start included); ``cold_sessions`` sessions one after another.
* **memory**: right after the first session's turn, once the runner's process tree is quiet,
  PSS and RSS summed over that tree from ``/proc/PID/smaps_rollup`` (corral: the host, its
  actors, the session's worker).
* **deltas/s**: ``warm_turns`` more turns of the first session; per turn, its deltas after the
  first over the time from the first one's arrival on the client stream to the last one's.

Every turn's deltas are checked: all N of them arrived before the turn's end. Each figure is the
median over the rounds of each round's median.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import trio

from ._common import Document, figure, host_pid, quiet, running_host
from ._fake_provider import FakeProvider, sse
from ._omnigent import (
    VERSION,
    OmnigentServer,
    runner_command,
    runner_env,
    runner_id_for,
    runner_online,
    stop_group,
    venv_path,
)
from ._progress import step
from ._tunnel_peer import PeerError
from .memory import memory_mb, process_tree

AGENT = "bench-relay"
#: ``--against`` with this name (or with no command) is omnigent's own runner.
OMNIGENT = "omnigent"
DELTA = b'"response.output_text.delta"'


@dataclass(frozen=True)
class AgainstSizes:
    """The workloads of one run."""

    deltas: int
    rounds: int
    cold_sessions: int
    warm_turns: int

    @classmethod
    def full(cls) -> AgainstSizes:
        return cls(deltas=5_000, rounds=3, cold_sessions=3, warm_turns=3)

    @classmethod
    def quick(cls) -> AgainstSizes:
        return cls(deltas=300, rounds=1, cold_sessions=2, warm_turns=1)


def responses_stream(pieces: int) -> list[bytes]:
    """A Responses API stream of one assistant message in ``pieces`` text deltas, with the
    fields the Agents SDK reads (``created_at``, ``output``, usage details)."""
    item_id = "msg_bench"
    base = {"id": "resp_bench", "object": "response", "model": AGENT, "created_at": 0}
    item: dict[str, Any] = {"type": "message", "id": item_id, "role": "assistant"}
    text = {"type": "output_text", "text": "x " * pieces, "annotations": []}
    done = {**item, "status": "completed", "content": [text]}
    usage = {
        "input_tokens": 10,
        "output_tokens": pieces,
        "total_tokens": 10 + pieces,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    }
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": {**base, "status": "in_progress", "output": []}},
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {**item, "status": "in_progress", "content": []},
        },
    ]
    delta = {"item_id": item_id, "output_index": 0, "content_index": 0, "delta": "x "}
    events += [{"type": "response.output_text.delta", **delta}] * pieces
    events += [
        {"type": "response.output_item.done", "output_index": 0, "item": done},
        {
            "type": "response.completed",
            "response": {**base, "status": "completed", "output": [done], "usage": usage},
        },
    ]
    return [sse(e) for e in events]


def agent_yaml(llm_url: str) -> str:
    """The benchmark's agent, as a user writes it for either runner."""
    return (
        f"name: {AGENT}\n"
        "description: corral bench relay --against\n"
        "executor:\n"
        "  harness: openai-agents\n"
        f"  model: {AGENT}\n"
        "  auth:\n"
        "    type: api_key\n"
        "    api_key: sk-bench-fake\n"
        f"    base_url: {llm_url}/v1\n"
        "prompt: You are a benchmark agent.\n"
    )


# --- the runners -------------------------------------------------------------------------------

#: A runner's start: (server URL, token, a fresh directory) → its tree's root pid while it runs.
Start = Callable[[str, str, Path], contextlib.AbstractContextManager[int]]


@dataclass(frozen=True)
class Contender:
    name: str
    start: Start


def wait_online(server_url: str, token: str, exited: Callable[[], str | None]) -> None:
    """Until the server says the runner of ``token`` is online; PeerError if ``exited()``
    tells why it never will (the runner ended), or after 90 s."""
    runner_id, deadline = runner_id_for(token), time.monotonic() + 90
    while not runner_online(server_url, runner_id):
        if (why := exited()) is not None:
            raise PeerError(why)
        if time.monotonic() > deadline:
            raise PeerError(f"runner {runner_id} not online on {server_url} within 90s")
        time.sleep(0.1)  # polling the server: nothing to wait on


@contextlib.contextmanager
def corral_runner(server_url: str, token: str, root: Path) -> Iterator[int]:
    """A ``corral up`` host whose one runner serves ``server_url``."""
    (root / "workspace").mkdir()
    config = (
        f"workspace = {json.dumps(str(root / 'workspace'))}\n"
        "[server]\nenabled = false\n\n"
        f"[[runners]]\nserver = {json.dumps(server_url)}\ntoken = {json.dumps(token)}\n"
    )
    with running_host(config) as inst:
        wait_online(server_url, token, lambda: None)
        yield host_pid(inst)


def command_runner(argv: list[str]) -> Start:
    """``argv`` run as omnigent runs its runner (its environment: :func:`runner_env`)."""

    @contextlib.contextmanager
    def start(server_url: str, token: str, root: Path) -> Iterator[int]:
        workspace, home = root / "workspace", root / "home"
        workspace.mkdir()
        home.mkdir()
        with open(root / "runner.out", "ab") as out:
            proc = subprocess.Popen(
                argv,
                cwd=workspace,
                env=runner_env(server_url, token, workspace, home),
                stdout=out,
                stderr=out,
                start_new_session=True,
            )

        def exited() -> str | None:
            if proc.poll() is None:
                return None
            output = (root / "runner.out").read_text(errors="replace")[-2000:]
            return f"{shlex.join(argv)} exited {proc.returncode}:\n{output}"

        try:
            wait_online(server_url, token, exited)
            yield proc.pid
            # A runner that ended on its own during the round failed it.
            if (why := exited()) is not None:
                raise PeerError(why)
        finally:
            stop_group(proc)

    return start


def contenders(against: str, venv: Path) -> list[Contender]:
    """corral, and the runner ``against`` names (omnigent's own for ``omnigent`` or "")."""
    if against in ("", OMNIGENT):
        other = Contender(f"omnigent {VERSION} runner", command_runner(runner_command(venv)))
    else:
        argv = shlex.split(against)
        if not argv:
            raise PeerError("--against: an empty command")
        other = Contender(against, command_runner(argv))
    return [Contender("corral", corral_runner), other]


# --- the client --------------------------------------------------------------------------------


@dataclass
class ClientStream:
    """``GET /v1/sessions/{id}/stream`` as a client reads it: each delta's arrival
    (``time.perf_counter()`` of the chunk it came in), and the turns' ending statuses."""

    session_id: str
    deltas: list[float] = field(default_factory=list)
    ends: list[tuple[str, Any]] = field(default_factory=list)
    opened: trio.Event = field(default_factory=trio.Event)
    closed: str | None = None
    changed: trio.Event = field(default_factory=trio.Event)

    async def run(self, http: httpx.AsyncClient) -> None:
        path = f"/v1/sessions/{self.session_id}/stream"
        try:
            async with http.stream("GET", path, timeout=httpx.Timeout(None)) as response:
                if response.status_code != 200:
                    self.closed = f"{path} answered {response.status_code}"
                    return
                tail = b""
                async for chunk in response.aiter_raw():
                    arrival = time.perf_counter()
                    lines = (tail + chunk).split(b"\n")
                    tail = lines.pop()
                    for line in lines:
                        self._line(line, arrival)
                    self.opened.set()
                    self.changed.set()
            self.closed = f"{path} ended"
        except httpx.HTTPError as exc:
            self.closed = f"{path} failed: {exc!r}"
        finally:
            self.opened.set()
            self.changed.set()

    def _line(self, line: bytes, arrival: float) -> None:
        if not line.startswith(b"data:"):
            return
        if DELTA in line:  # the hot path: no parsing
            self.deltas.append(arrival)
        elif b'"session.status"' in line:
            event = json.loads(line[5:])
            if event.get("status") in ("idle", "failed"):
                self.ends.append((event["status"], event.get("error")))

    async def wait_ends(self, count: int, timeout: float) -> None:
        with trio.move_on_after(timeout):
            while len(self.ends) < count and self.closed is None:
                self.changed = trio.Event()
                await self.changed.wait()
        if len(self.ends) < count:
            raise PeerError(
                f"session {self.session_id}: {len(self.ends)} of {count} turns ended within "
                f"{timeout:g}s ({len(self.deltas)} deltas so far; {self.closed or 'open'})"
            )
        failed = [error for status, error in self.ends if status == "failed"]
        if failed:
            raise PeerError(f"session {self.session_id}: a turn failed: {failed[0]}")


class Client:
    """The server's client API, for sessions on one runner."""

    def __init__(self, http: httpx.AsyncClient, nursery: trio.Nursery, agent_id: str) -> None:
        self.http = http
        self.nursery = nursery
        self.agent_id = agent_id

    async def session(self, runner_id: str) -> ClientStream:
        """A new session bound to ``runner_id``, its client stream open."""
        r = await self.http.post("/v1/sessions", json={"agent_id": self.agent_id})
        if r.status_code != 201:
            raise PeerError(f"POST /v1/sessions: {r.status_code} {r.text[:300]}")
        sid = r.json()["id"]
        r = await self.http.patch(f"/v1/sessions/{sid}", json={"runner_id": runner_id}, timeout=120)
        if r.status_code != 200:
            raise PeerError(f"binding {sid} to {runner_id}: {r.status_code} {r.text[:300]}")
        stream = ClientStream(sid)
        self.nursery.start_soon(stream.run, self.http)
        # The stream is a live tail: the server relays once this viewer got its first frame.
        with trio.fail_after(60):
            await stream.opened.wait()
        if stream.closed:
            raise PeerError(stream.closed)
        return stream

    async def turn(self, stream: ClientStream, expected: int, timeout: float) -> list[float]:
        """Post a message; once the turn ended, the post's time and then every delta's
        arrival (``expected`` of them, else PeerError)."""
        first, ends = len(stream.deltas), len(stream.ends)
        message = {"role": "user", "content": [{"type": "input_text", "text": "go"}]}
        posted = time.perf_counter()
        r = await self.http.post(
            f"/v1/sessions/{stream.session_id}/events",
            json={"type": "message", "data": message},
            timeout=60,
        )
        if r.status_code != 202:
            raise PeerError(f"POST .../events: {r.status_code} {r.text[:300]}")
        await stream.wait_ends(ends + 1, timeout)
        deltas = stream.deltas[first:]
        if len(deltas) != expected:
            raise PeerError(
                f"session {stream.session_id}: {len(deltas)} of {expected} deltas arrived"
            )
        return [posted, *deltas]


@contextlib.asynccontextmanager
async def open_client(server_url: str) -> AsyncIterator[Client]:
    async with (
        httpx.AsyncClient(base_url=server_url, timeout=30) as http,
        trio.open_nursery() as nursery,
    ):
        r = await http.get("/v1/agents", params={"limit": 100})
        r.raise_for_status()
        ids = [a["id"] for a in r.json()["data"] if a["name"] == AGENT]
        if len(ids) != 1:
            raise PeerError(f"the server has {len(ids)} agents named {AGENT}")
        try:
            yield Client(http, nursery, ids[0])
        finally:
            nursery.cancel_scope.cancel()


# --- a round -----------------------------------------------------------------------------------


@dataclass
class Round:
    """What one runner measured in one round."""

    cold: list[float]
    rates: list[float]
    pss_mb: float
    rss_mb: float


async def measure_round(
    contender: Contender, server_url: str, sizes: AgainstSizes, workdir: Path
) -> Round:
    """One runner, started afresh: its cold sessions, its memory, its warm turns."""
    token = f"bench-{uuid.uuid4().hex}"
    runner_id = runner_id_for(token)
    timeout = 60 + sizes.deltas / 200
    start = contender.start(server_url, token, workdir)
    root = await trio.to_thread.run_sync(start.__enter__)
    try:
        async with open_client(server_url) as client:
            cold: list[float] = []
            streams = []
            for i in range(sizes.cold_sessions):
                stream = await client.session(runner_id)
                posted, first, *_ = await client.turn(stream, sizes.deltas, timeout)
                cold.append(first - posted)
                streams.append(stream)
                if i == 0:
                    await quiet(root)
                    pss, rss = memory_mb(process_tree(root))
            rates = []
            for _ in range(sizes.warm_turns):
                _, *deltas = await client.turn(streams[0], sizes.deltas, timeout)
                rates.append((len(deltas) - 1) / max(deltas[-1] - deltas[0], 1e-9))
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(start.__exit__, None, None, None)
    return Round(cold=cold, rates=rates, pss_mb=pss, rss_mb=rss)


# --- the run -----------------------------------------------------------------------------------


def _median_of_medians(rounds: list[Round], values: Callable[[Round], list[float]]) -> float:
    return statistics.median(statistics.median(values(r)) for r in rounds)


async def measure(against: str, sizes: AgainstSizes, venv: Path) -> Document:
    """Every figure of ``--against``, as the result document of docs/contract.md."""
    runners = contenders(against, venv)
    rounds: dict[str, list[Round]] = {c.name: [] for c in runners}
    provider = FakeProvider(responses_stream(sizes.deltas))
    with tempfile.TemporaryDirectory(prefix="corral-bench-against-") as tmp:
        root = Path(tmp)
        async with trio.open_nursery() as nursery:
            await provider.start(nursery)
            agent = root / "agent.yaml"
            agent.write_text(agent_yaml(provider.url))
            (root / "server").mkdir()
            server = OmnigentServer(venv, root / "server", [agent])
            with step("starting the omnigent server"):
                await trio.to_thread.run_sync(server.start)
            try:
                with step("rounds, the runners alternating", total=sizes.rounds) as progress:
                    for n in range(sizes.rounds):
                        # Alternate who goes first: neither always meets a warmer machine.
                        for contender in runners if n % 2 == 0 else runners[::-1]:
                            workdir = root / f"round{n}-{runners.index(contender)}"
                            workdir.mkdir()
                            result = await measure_round(contender, server.url, sizes, workdir)
                            rounds[contender.name].append(result)
                        progress.advance()
            finally:
                await trio.to_thread.run_sync(server.stop)
            nursery.cancel_scope.cancel()
    return document(runners[1].name, rounds, sizes, against or OMNIGENT)


def document(
    other: str, rounds: dict[str, list[Round]], sizes: AgainstSizes, against: str
) -> Document:
    """The result document: corral's figures with their ratio to the other runner's."""
    mine, theirs = rounds["corral"], rounds[other]

    def both(value: Callable[[Round], list[float]]) -> tuple[float, float]:
        return _median_of_medians(mine, value), _median_of_medians(theirs, value)

    rate = both(lambda r: r.rates)
    cold = both(lambda r: r.cold)
    pss = both(lambda r: [r.pss_mb])
    rss = both(lambda r: [r.rss_mb])
    ms = 1000
    results = [
        figure("relay deltas/s, corral", rate[0], "msgs/s", rate[1]),
        figure(f"relay deltas/s, {other}", rate[1], "msgs/s", rate[1]),
        figure("cold session: message to first delta, corral", cold[0] * ms, "ms", cold[1] * ms),
        figure(f"cold session: message to first delta, {other}", cold[1] * ms, "ms", cold[1] * ms),
        figure("tree PSS with one session, corral", pss[0], "MB", pss[1]),
        figure(f"tree PSS with one session, {other}", pss[1], "MB", pss[1]),
        figure("tree RSS with one session, corral", rss[0], "MB", rss[1]),
        figure(f"tree RSS with one session, {other}", rss[1], "MB", rss[1]),
    ]
    return {
        "benchmark": "relay",
        "baseline": {
            "name": f"relay deltas/s, {other}",
            "value": round(rate[1], 1),
            "unit": "msgs/s",
        },
        "results": results,
        "figures": {
            "against": other,
            # The targets (#20), each as "corral is this many times better".
            "ratios": {
                "deltas_per_s": round(rate[0] / rate[1], 3),
                "cold_first_delta_speedup": round(cold[1] / cold[0], 3),
                "tree_pss": round(pss[0] / pss[1], 3),
            },
            "targets": {
                "deltas_per_s": ">= 10",
                "cold_first_delta_speedup": ">= 6",
                "tree_pss": "<= 0.6",
            },
            "rounds": {
                name: [
                    {
                        "cold_ms": [round(c * ms, 1) for c in r.cold],
                        "deltas_per_s": [round(x, 1) for x in r.rates],
                        "pss_mb": round(r.pss_mb, 1),
                        "rss_mb": round(r.rss_mb, 1),
                    }
                    for r in runs
                ]
                for name, runs in rounds.items()
            },
        },
        "params": {
            "against": against,
            "server": f"omnigent {VERSION}",
            "deltas_per_turn": sizes.deltas,
            "rounds": sizes.rounds,
            "cold_sessions": sizes.cold_sessions,
            "warm_turns": sizes.warm_turns,
            "python": sys.version.split()[0],
        },
    }


def run(against: str, quick: bool) -> Document:
    """Run ``--against`` (NotRunnable without the omnigent venv)."""
    venv = venv_path()
    sizes = AgainstSizes.quick() if quick else AgainstSizes.full()
    return trio.run(measure, against, sizes, venv)
