"""``corral bench relay --against CMD``: corral and another runner side by side, on one server.

Both runners serve the same real omnigent 0.19.1 server (``omnigent server`` from the omnigent
venv, see :mod:`._omnigent`), whose one agent, ``bench-relay``, runs on the ``openai-agents``
harness with a fake model provider in this process (:class:`~._fake_provider.FakeProvider`)
that answers every call at once with one message of N text deltas. The other runner needs the
server's whole REST API (it fetches the agent, posts items, asks policies), so nothing lighter
than the real server is a fair ground for both. Each runner is given as its server a proxy in
this process, :class:`~._omnigent_tap.TunnelTap`, which passes everything on to the server and
stamps each delta as it reaches the server's door (why there, and not on the server's client
stream: see that module).

Each round starts each runner afresh, with a new token (so a new runner id): corral as a
``corral up`` host with one ``[[runners]]`` table, the other as ``CMD`` (split like a shell
line) in its own process group, its cwd an empty workspace, given exactly the environment
omnigent's ``omnigent run --server`` gives its runner — ``RUNNER_SERVER_URL`` (the proxy),
``OMNIGENT_RUNNER_ID``, ``OMNIGENT_RUNNER_TUNNEL_BINDING_TOKEN``, ``OMNIGENT_RUNNER_WORKSPACE`` —
plus ``HOME``, ``OMNIGENT_CONFIG_HOME`` (a fresh directory), ``OMNIGENT_ANALYTICS=0`` and
``DISABLE_TELEMETRY=true``, and without any other ``OMNIGENT_*`` or ``CORRAL_*`` variable.
Rounds alternate which runner goes first. In a round, through the server's client API as a
user drives it (``POST /v1/sessions``, ``PATCH`` its runner, ``POST …/events``, then
``GET /v1/sessions/{id}`` and ``…/items`` until the turn is over):

* **cold first delta**: a new session's first message posted → its first delta at the server;
  ``cold_sessions`` sessions one after another (the runner's session start included).
* **memory**: right after the first session's turn, once the runner's process tree is quiet,
  PSS and RSS summed over that tree from ``/proc/PID/smaps_rollup`` (corral: the host, its
  actors, the session's worker); and once the last cold session's turn is over, what the
  tree's PSS grew by per session after the first (corral: a worker each; omnigent's runner
  keeps a process per session too).
* **deltas/s**: ``warm_turns`` more turns of the first session; per turn, its deltas after the
  first over the time from the first one's arrival to the last one's.
* **CPU per delta**: over those warm turns, the CPU time the runner's tree and the server spent,
  per delta: on two shared cores, a figure that depends less on what else runs than a rate.
* **CPU per delta at a model's pace**: ``paced_sessions`` new sessions of a second agent,
  ``bench-relay-paced``, whose provider streams one event every ``paced_ms`` (a model writing
  ten tokens a second), all turning at once; their second turns (the first starts each
  session's harness) measured as above. A flood batches every stage; this is what a host
  serving many people pays per delta.

Every turn's deltas are checked: all N of them, and no more, arrived before the turn was over.
Each figure is the median over the rounds of each round's median.
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
from dataclasses import dataclass
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
from ._omnigent_tap import TunnelTap
from ._progress import step
from ._tunnel_peer import PeerError, lone_errors
from .memory import cpu_s, cpu_s_by_role, memory_mb, process_tree, pss_by_title

AGENT = "bench-relay"
#: The agent whose provider streams at a model's pace.
PACED_AGENT = "bench-relay-paced"
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
    #: Sessions turning at once at a model's pace, the deltas of each turn, and the pace.
    paced_sessions: int
    paced_deltas: int
    paced_ms: int = 100

    def __post_init__(self) -> None:
        if self.cold_sessions < 2:
            raise ValueError("the PSS per added session needs two cold sessions at least")

    @classmethod
    def full(cls) -> AgainstSizes:
        return cls(
            deltas=5_000,
            rounds=3,
            cold_sessions=3,
            warm_turns=3,
            paced_sessions=20,
            paced_deltas=50,
        )

    @classmethod
    def quick(cls) -> AgainstSizes:
        return cls(
            deltas=300, rounds=1, cold_sessions=2, warm_turns=1, paced_sessions=3, paced_deltas=10
        )


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


def agent_yaml(llm_url: str, name: str = AGENT) -> str:
    """The benchmark's agent, as a user writes it for either runner."""
    return (
        f"name: {name}\n"
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

#: A runner's start: (the server's URL, the URL the runner is given as its server's, token, a
#: fresh directory) → its tree's root pid, once the server has it online, while it runs.
Start = Callable[[str, str, str, Path], contextlib.AbstractContextManager[int]]


@dataclass(frozen=True)
class Contender:
    """A runner measured: its name in the figures, and how it starts."""

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
def corral_runner(server_url: str, runner_url: str, token: str, root: Path) -> Iterator[int]:
    """A ``corral up`` host with one runner, for the server at ``runner_url``."""
    (root / "workspace").mkdir()
    config = (
        f"workspace = {json.dumps(str(root / 'workspace'))}\n"
        "[server]\nenabled = false\n\n"
        f"[[runners]]\nserver = {json.dumps(runner_url)}\ntoken = {json.dumps(token)}\n"
    )
    with running_host(config) as inst:
        wait_online(server_url, token, lambda: None)
        yield host_pid(inst)


def command_runner(argv: list[str]) -> Start:
    """``argv`` run as omnigent runs its runner (its environment: :func:`runner_env`)."""

    @contextlib.contextmanager
    def start(server_url: str, runner_url: str, token: str, root: Path) -> Iterator[int]:
        workspace, home = root / "workspace", root / "home"
        workspace.mkdir()
        home.mkdir()
        with open(root / "runner.out", "ab") as out:
            proc = subprocess.Popen(
                argv,
                cwd=workspace,
                env=runner_env(runner_url, token, workspace, home),
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


class Client:
    """The server's client API (REST), for sessions on one runner; their deltas are timed
    where they reach the server, by ``tap``."""

    def __init__(self, http: httpx.AsyncClient, tap: TunnelTap, agent_ids: dict[str, str]) -> None:
        self.http = http
        self.tap = tap
        self.agent_ids = agent_ids

    async def session(self, runner_id: str, agent: str = AGENT) -> str:
        """A new session of ``agent`` bound to ``runner_id`` (the runner has started it)."""
        r = await self.http.post("/v1/sessions", json={"agent_id": self.agent_ids[agent]})
        if r.status_code != 201:
            raise PeerError(f"POST /v1/sessions: {r.status_code} {r.text[:300]}")
        sid = str(r.json()["id"])
        r = await self.http.patch(f"/v1/sessions/{sid}", json={"runner_id": runner_id}, timeout=120)
        if r.status_code != 200:
            raise PeerError(f"binding {sid} to {runner_id}: {r.status_code} {r.text[:300]}")
        return sid

    async def turn(self, sid: str, turn: int, expected: int, timeout: float) -> list[float]:
        """Post the session's ``turn``-th message (from 1); once the turn is over, the post's
        time and then each of its deltas' arrival at the server (``expected`` of them, else
        PeerError)."""
        posted = time.perf_counter()
        return [posted, *await self.turns([sid], turn, expected, timeout)]

    async def turns(self, sids: list[str], turn: int, expected: int, timeout: float) -> list[float]:
        """The ``turn``-th message of every session of ``sids`` posted at once; once every
        turn is over with ``expected`` deltas each (else PeerError), their arrival times."""
        first = len(self.tap.deltas)
        async with trio.open_nursery() as nursery:
            for sid in sids:
                nursery.start_soon(self._post, sid)
        total = expected * len(sids)
        who = f"session {sids[0]}" if len(sids) == 1 else f"{len(sids)} sessions"
        if not await self.tap.wait_deltas(first + total, timeout):
            got = len(self.tap.deltas) - first
            raise PeerError(f"{who}: {got} of {total} deltas within {timeout:g}s")
        for sid in sids:
            await self._over(sid, 2 * turn, timeout)
        deltas = self.tap.deltas[first:]
        if len(deltas) != total:
            raise PeerError(f"{who}: {len(deltas)} deltas, {total} expected")
        return deltas

    async def _post(self, sid: str) -> None:
        message = {"role": "user", "content": [{"type": "input_text", "text": "go"}]}
        r = await self.http.post(
            f"/v1/sessions/{sid}/events", json={"type": "message", "data": message}, timeout=60
        )
        if r.status_code != 202:
            raise PeerError(f"POST .../events: {r.status_code} {r.text[:300]}")

    async def _over(self, sid: str, items: int, timeout: float) -> None:
        """Until the session is idle with ``items`` items saved (a user message and an
        assistant one per turn): the next message starts a turn of its own."""
        with trio.move_on_after(timeout):
            while True:
                session = (await self.http.get(f"/v1/sessions/{sid}")).json()
                if session.get("status") == "failed":
                    raise PeerError(f"session {sid}: the turn failed: {session}")
                if session.get("status") == "idle":
                    r = await self.http.get(f"/v1/sessions/{sid}/items", params={"limit": 100})
                    if len(r.json()["data"]) >= items:
                        return
                await trio.sleep(0.05)  # polling the server: nothing to wait on
        raise PeerError(f"session {sid}: not idle with {items} items within {timeout:g}s")


@contextlib.asynccontextmanager
async def open_client(server_url: str, tap: TunnelTap) -> AsyncIterator[Client]:
    async with httpx.AsyncClient(base_url=server_url, timeout=30) as http:
        r = await http.get("/v1/agents", params={"limit": 100})
        r.raise_for_status()
        ids: dict[str, str] = {}
        for name in (AGENT, PACED_AGENT):
            named = [a["id"] for a in r.json()["data"] if a["name"] == name]
            if len(named) != 1:
                raise PeerError(f"the server has {len(named)} agents named {name}")
            ids[name] = named[0]
        yield Client(http, tap, ids)


# --- a round -----------------------------------------------------------------------------------


@dataclass
class Round:
    """What one runner measured in one round."""

    cold: list[float]
    rates: list[float]
    pss_mb: float
    #: The same by process title: where the tree's memory is.
    pss_by_process: dict[str, float]
    #: What the tree's PSS grew by for each cold session after the first, MB.
    pss_added_mb: float
    rss_mb: float
    #: CPU of the runner's tree and of the server per delta of the warm turns, µs.
    cpu_us: float
    server_cpu_us: float
    #: The same over the paced turns.
    paced_cpu_us: float
    paced_server_cpu_us: float
    #: The tree's by role (:func:`~.memory.role_of`): where a paced delta's CPU goes.
    paced_cpu_us_by_role: dict[str, float]


#: A reading: CPU seconds the runner's tree has spent so far by role, and the server's.
_Spent = tuple[dict[str, float], float]


def _spent(root: int, server: int) -> _Spent:
    """CPU seconds the runner's tree (by :func:`~.memory.role_of`) and the server's tree have
    spent so far."""
    return cpu_s_by_role(process_tree(root)), cpu_s(process_tree(server))


def _per_delta(before: _Spent, after: _Spent, deltas: int) -> tuple[float, float, dict[str, float]]:
    """µs of CPU per delta of the runner's tree and of the server between two readings, and
    the tree's by role (its sum: one reading of each process serves both)."""
    (roles_before, server_before), (roles, server) = before, after
    by_role = {
        role: round((spent - roles_before.get(role, 0.0)) * 1e6 / deltas, 1)
        for role, spent in sorted(roles.items())
    }
    tree_us = (sum(roles.values()) - sum(roles_before.values())) * 1e6 / deltas
    return tree_us, (server - server_before) * 1e6 / deltas, by_role


async def measure_round(
    contender: Contender, server: OmnigentServer, tap: TunnelTap, sizes: AgainstSizes, workdir: Path
) -> Round:
    """One runner, started afresh: its cold sessions, its memory, its warm turns."""
    token = f"bench-{uuid.uuid4().hex}"
    runner_id = runner_id_for(token)
    timeout = 60 + sizes.deltas / 200
    server_url = server.url
    assert server.proc is not None  # started
    start = contender.start(server_url, tap.url, token, workdir)
    root = await trio.to_thread.run_sync(start.__enter__)
    try:
        async with open_client(server_url, tap) as client:
            cold: list[float] = []
            sessions = []
            for i in range(sizes.cold_sessions):
                sid = await client.session(runner_id)
                posted, first, *_ = await client.turn(sid, 1, sizes.deltas, timeout)
                cold.append(first - posted)
                sessions.append(sid)
                if i == 0:
                    await quiet(root)
                    tree = process_tree(root)
                    pss, rss = memory_mb(tree)
                    by_process = pss_by_title(tree)
            # What each further session holds once its first turn is over: a worker process
            # of corral's, whatever the other runner keeps per session.
            await quiet(root)
            pss_added = (memory_mb(process_tree(root))[0] - pss) / (len(sessions) - 1)
            rates = []
            # Both share two cores, so the CPU each spends per delta is told too: it
            # depends far less on what else runs than the rates do.
            before = _spent(root, server.proc.pid)
            for turn in range(2, 2 + sizes.warm_turns):
                _, *deltas = await client.turn(sessions[0], turn, sizes.deltas, timeout)
                rates.append((len(deltas) - 1) / max(deltas[-1] - deltas[0], 1e-9))
            after = _spent(root, server.proc.pid)
            cpu_us, server_cpu_us, _ = _per_delta(before, after, sizes.deltas * sizes.warm_turns)
            paced_cpu_us, paced_server_cpu_us, paced_by_role = await _paced(
                client, runner_id, sizes, root, server.proc.pid
            )
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(start.__exit__, None, None, None)
    return Round(
        cold=cold,
        rates=rates,
        pss_mb=pss,
        pss_by_process=by_process,
        pss_added_mb=pss_added,
        rss_mb=rss,
        cpu_us=cpu_us,
        server_cpu_us=server_cpu_us,
        paced_cpu_us=paced_cpu_us,
        paced_server_cpu_us=paced_server_cpu_us,
        paced_cpu_us_by_role=paced_by_role,
    )


async def _paced(
    client: Client, runner_id: str, sizes: AgainstSizes, root: int, server: int
) -> tuple[float, float, dict[str, float]]:
    """CPU per delta of the runner's tree and of the server over the paced sessions' second
    turns, all at once (the first turns start their harnesses); the tree's by role."""
    sids: list[str] = []

    async def new_session() -> None:
        sids.append(await client.session(runner_id, PACED_AGENT))

    async with trio.open_nursery() as nursery:
        for _ in range(sizes.paced_sessions):
            nursery.start_soon(new_session)
    # The provider's frames besides the deltas are paced too.
    timeout = 60 + (sizes.paced_deltas + 4) * sizes.paced_ms / 1000
    await client.turns(sids, 1, sizes.paced_deltas, timeout)
    before = _spent(root, server)
    await client.turns(sids, 2, sizes.paced_deltas, timeout)
    return _per_delta(before, _spent(root, server), sizes.paced_deltas * sizes.paced_sessions)


# --- the run -----------------------------------------------------------------------------------


def _median_of_medians(rounds: list[Round], values: Callable[[Round], list[float]]) -> float:
    return statistics.median(statistics.median(values(r)) for r in rounds)


async def measure(against: str, sizes: AgainstSizes, venv: Path) -> Document:
    """Every figure of ``--against``, as the result document of docs/contract.md."""
    runners = contenders(against, venv)
    rounds: dict[str, list[Round]] = {c.name: [] for c in runners}
    provider = FakeProvider(responses_stream(sizes.deltas))
    paced = FakeProvider(responses_stream(sizes.paced_deltas), pace_s=sizes.paced_ms / 1000)
    with tempfile.TemporaryDirectory(prefix="corral-bench-against-") as tmp:
        root = Path(tmp)
        async with trio.open_nursery() as nursery:
            await provider.start(nursery)
            await paced.start(nursery)
            agents = [root / "agent.yaml", root / "paced.yaml"]
            agents[0].write_text(agent_yaml(provider.url))
            agents[1].write_text(agent_yaml(paced.url, PACED_AGENT))
            (root / "server").mkdir()
            server = OmnigentServer(venv, root / "server", agents)
            with step("starting the omnigent server"):
                # Generous: migrations run first, and the machine may be busy.
                await trio.to_thread.run_sync(server.start, 180)
            tap = TunnelTap(server.port)
            await tap.start(nursery)
            try:
                with step("rounds, the runners alternating", total=sizes.rounds) as progress:
                    for n in range(sizes.rounds):
                        # Alternate who goes first: neither always meets a warmer machine. The
                        # other runner first, so that a command that cannot run fails early.
                        for contender in runners[::-1] if n % 2 == 0 else runners:
                            workdir = root / f"round{n}-{runners.index(contender)}"
                            workdir.mkdir()
                            result = await measure_round(contender, server, tap, sizes, workdir)
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
    pss_added = both(lambda r: [r.pss_added_mb])
    rss = both(lambda r: [r.rss_mb])
    cpu = both(lambda r: [r.cpu_us])
    server_cpu = both(lambda r: [r.server_cpu_us])
    paced_cpu = both(lambda r: [r.paced_cpu_us])
    paced_server_cpu = both(lambda r: [r.paced_server_cpu_us])
    paced = f"{sizes.paced_sessions} sessions at {1000 // sizes.paced_ms} deltas/s"
    ms = 1000
    results = [
        figure("relay deltas/s, corral", rate[0], "msgs/s", rate[1]),
        figure(f"relay deltas/s, {other}", rate[1], "msgs/s", rate[1]),
        figure("cold session: message to first delta, corral", cold[0] * ms, "ms", cold[1] * ms),
        figure(f"cold session: message to first delta, {other}", cold[1] * ms, "ms", cold[1] * ms),
        figure("tree PSS with one session, corral", pss[0], "MB", pss[1]),
        figure(f"tree PSS with one session, {other}", pss[1], "MB", pss[1]),
        figure("tree PSS per added session, corral", pss_added[0], "MB", pss_added[1]),
        figure(f"tree PSS per added session, {other}", pss_added[1], "MB", pss_added[1]),
        figure("tree RSS with one session, corral", rss[0], "MB", rss[1]),
        figure(f"tree RSS with one session, {other}", rss[1], "MB", rss[1]),
        figure("runner tree CPU per delta, corral", cpu[0], "us", cpu[1]),
        figure(f"runner tree CPU per delta, {other}", cpu[1], "us", cpu[1]),
        figure("server CPU per delta, corral's", server_cpu[0], "us", server_cpu[1]),
        figure(f"server CPU per delta, {other}'s", server_cpu[1], "us", server_cpu[1]),
        figure(f"runner tree CPU per delta, {paced}, corral", paced_cpu[0], "us", paced_cpu[1]),
        figure(f"runner tree CPU per delta, {paced}, {other}", paced_cpu[1], "us", paced_cpu[1]),
        figure(
            f"server CPU per delta, {paced}, corral's",
            paced_server_cpu[0],
            "us",
            paced_server_cpu[1],
        ),
        figure(
            f"server CPU per delta, {paced}, {other}'s",
            paced_server_cpu[1],
            "us",
            paced_server_cpu[1],
        ),
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
                "session_pss": round(pss_added[0] / pss_added[1], 3),
            },
            "targets": {
                "deltas_per_s": ">= 10",
                "cold_first_delta_speedup": ">= 6",
                "tree_pss": "<= 0.6",
                "session_pss": "<= 0.333",
            },
            # Not a target of the issue: what a delta costs a runner at a model's pace, the
            # other's over corral's ("corral is this many times lighter").
            "paced_cpu_per_delta_lighter": round(paced_cpu[1] / paced_cpu[0], 3),
            "rounds": {
                name: [
                    {
                        "cold_ms": [round(c * ms, 1) for c in r.cold],
                        "deltas_per_s": [round(x, 1) for x in r.rates],
                        "pss_mb": round(r.pss_mb, 1),
                        "pss_mb_by_process": r.pss_by_process,
                        "pss_added_mb": round(r.pss_added_mb, 1),
                        "rss_mb": round(r.rss_mb, 1),
                        "cpu_us_per_delta": round(r.cpu_us, 1),
                        "server_cpu_us_per_delta": round(r.server_cpu_us, 1),
                        "paced_cpu_us_per_delta": round(r.paced_cpu_us, 1),
                        "paced_server_cpu_us_per_delta": round(r.paced_server_cpu_us, 1),
                        "paced_cpu_us_per_delta_by_process": r.paced_cpu_us_by_role,
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
            "paced_sessions": sizes.paced_sessions,
            "paced_deltas_per_turn": sizes.paced_deltas,
            "paced_ms": sizes.paced_ms,
            "python": sys.version.split()[0],
        },
    }


def run(against: str, *, quick: bool) -> Document:
    """Run ``--against`` (NotRunnable without the omnigent venv)."""
    venv = venv_path()
    sizes = AgainstSizes.quick() if quick else AgainstSizes.full()
    with lone_errors():
        return trio.run(measure, against, sizes, venv)
