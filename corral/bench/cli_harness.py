"""``corral bench harness --kind claude-sdk|codex|pi``: a coding-agent CLI kind through
corral against the same CLI run by hand (the floor), in one run, on the same fake provider.

The floor: the CLI started by hand, exactly as the kind starts it (its command line and
environment), told one message, timed from its start to its first text delta on stdout; then
its memory (PSS, ``/proc/PID/smaps_rollup``, the CLI and its children) while it waits for the
next message. Through corral: a real host (``corral up`` in a temporary state dir), this
process standing in for dispatch (it starts turns at the harness actor and allows each policy
evaluation), timed from a new session's ``TurnStart`` to its first ``response.output_text.delta``
(a worker spawned, the CLI started in it, the turn relayed), then a second turn of the same
session (the CLI kept); then each session's PSS, worker plus CLI.

Each kind has a row in :data:`KINDS`: how its fake provider answers, the agent spec that
points the kind at it, and how the CLI is run by hand.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import msgspec
import trio

from .. import clis
from .._jsonlines import JsonObject
from ..actors._control import request
from ..bus import open_peer
from ..config import LivenessSettings
from ..harnesses._cli_process import open_cli
from ..harnesses.claude._settings import argv as claude_argv
from ..harnesses.claude._settings import cli_env as claude_env
from ..harnesses.claude._settings import resolve as claude_settings
from ..harnesses.codex._harness import APPROVAL_POLICY, SANDBOX
from ..harnesses.codex._harness import INITIALIZE as CODEX_INIT
from ..harnesses.codex._home import Launch as CodexLaunch
from ..harnesses.codex._home import cli_env as codex_env
from ..harnesses.codex._home import prepare as codex_prepare
from ..harnesses.codex._rpc import ThreadStartParams, TurnStartParams
from ..harnesses.pi._home import Launch as PiLaunch
from ..harnesses.pi._home import argv as pi_argv
from ..harnesses.pi._home import cli_env as pi_env
from ..harnesses.pi._home import prepare as pi_prepare
from ..harnesses.protocol import (
    AnyOutput,
)
from ..instance import Instance
from ._common import Document, NotRunnable, figure, percentile, running_host
from ._fake_provider import FakeProvider, anthropic_text, chat_text, responses_text
from .harness import first_delta

LIVENESS = LivenessSettings(interval_s=0.5, liveness=4)
KEY = "bench-key"
MODEL = "bench-model"
#: How long one turn may take before the run is given up.
TURN_LIMIT_S = 60.0

#: Starts a CLI by hand: ``(cli, provider url, home, cwd)`` → its argv, env and the JSON
#: lines that tell it one message.
ByHand = Callable[[str, str, Path, Path], tuple[list[str], dict[str, str], list[JsonObject]]]


@dataclass(frozen=True, slots=True)
class CliBench:
    """How the benchmark runs one kind."""

    command: str
    #: The fake provider's answer to every request.
    frames: Callable[[], list[bytes]]
    #: The agent spec pointing the kind at the provider's URL.
    spec: Callable[[str], JsonObject]
    by_hand: ByHand
    #: Whether a line the CLI writes by hand is its first text delta; and its turn's end.
    is_delta: Callable[[JsonObject], bool]
    is_end: Callable[[JsonObject], bool]
    #: The lines to send in answer to one the CLI wrote by hand (a JSON-RPC CLI's next
    #: request needs an id its last answer gave); none by default.
    reply: Callable[[JsonObject], list[JsonObject]] = lambda line: []


def _spec(harness: str, url: str) -> JsonObject:
    """The benchmark's agent on ``harness``, its provider at ``url``."""
    auth = {"type": "api_key", "api_key": KEY, "base_url": url}
    return {"name": "bench", "executor": {"harness": harness, "model": MODEL, "auth": auth}}


def _claude_by_hand(
    cli: str, url: str, home: Path, cwd: Path
) -> tuple[list[str], dict[str, str], list[JsonObject]]:
    spec = _spec("claude-sdk", url)
    settings = claude_settings(spec, {}, {}, {}, harness="claude-sdk", model_override=None)
    lines: list[JsonObject] = [
        {"type": "control_request", "request_id": "init", "request": {"subtype": "initialize"}},
        {
            "type": "user",
            "message": {"role": "user", "content": "hi"},
            "parent_tool_use_id": None,
            "session_id": "",
        },
    ]
    return (
        claude_argv(cli, settings, resume=None),
        claude_env(cli, settings, home, os.environ),
        lines,
    )


def _claude_delta(line: JsonObject) -> bool:
    event = line.get("event") or {}
    return line.get("type") == "stream_event" and (event.get("delta") or {}).get("type") == (
        "text_delta"
    )


def _codex_by_hand(
    cli: str, url: str, home: Path, cwd: Path
) -> tuple[list[str], dict[str, str], list[JsonObject]]:
    """The app-server as the kind starts it (its config written the same way), told to open
    a thread; :func:`_codex_reply` starts the turn in it."""
    launch = CodexLaunch(cli_path=cli, home=home, workdir=cwd, base_url=f"{url}/v1", api_key=KEY)
    codex_prepare(launch)
    thread = ThreadStartParams(
        model=MODEL, cwd=str(cwd), approval_policy=APPROVAL_POLICY, sandbox=SANDBOX
    )
    lines: list[JsonObject] = [
        {"id": 1, "method": "initialize", "params": msgspec.to_builtins(CODEX_INIT)},
        {"method": "initialized"},
        {"id": 2, "method": "thread/start", "params": msgspec.to_builtins(thread)},
    ]
    return [cli, "app-server"], codex_env(launch, os.environ), lines


def _codex_reply(line: JsonObject) -> list[JsonObject]:
    """``turn/start`` once ``thread/start`` answered with the thread's id."""
    if line.get("id") != 2 or not isinstance(line.get("result"), dict):
        return []
    turn = TurnStartParams(
        thread_id=line["result"]["thread"]["id"],
        input=[{"type": "text", "text": "hi"}],
        model=MODEL,
    )
    return [{"id": 3, "method": "turn/start", "params": msgspec.to_builtins(turn)}]


def _pi_by_hand(
    cli: str, url: str, home: Path, cwd: Path
) -> tuple[list[str], dict[str, str], list[JsonObject]]:
    """pi's RPC mode as the kind starts it (its ``models.json`` and gate written the same
    way), told one prompt."""
    launch = PiLaunch(
        cli_path=cli,
        home=home,
        workdir=cwd,
        base_url=f"{url}/v1",
        api="openai-completions",
        model=MODEL,
        instructions=None,
        api_key=KEY,
    )
    pi_prepare(launch)
    lines: list[JsonObject] = [{"id": "1", "type": "prompt", "message": "hi"}]
    return pi_argv(launch), pi_env(launch, os.environ), lines


def _pi_delta(line: JsonObject) -> bool:
    event = line.get("assistantMessageEvent") or {}
    return line.get("type") == "message_update" and event.get("type") == "text_delta"


KINDS: dict[str, CliBench] = {
    "claude-sdk": CliBench(
        command="claude",
        frames=lambda: anthropic_text(MODEL, ["Hel", "lo"]),
        spec=partial(_spec, "claude-sdk"),
        by_hand=_claude_by_hand,
        is_delta=_claude_delta,
        is_end=lambda line: line.get("type") == "result",
    ),
    "codex": CliBench(
        command="codex",
        frames=lambda: responses_text(MODEL, ["Hel", "lo"]),
        spec=lambda url: _spec("codex", f"{url}/v1"),
        by_hand=_codex_by_hand,
        is_delta=lambda line: line.get("method") == "item/agentMessage/delta",
        is_end=lambda line: line.get("method") == "turn/completed",
        reply=_codex_reply,
    ),
    "pi": CliBench(
        command="pi",
        frames=lambda: chat_text(MODEL, ["Hel", "lo"]),
        spec=lambda url: _spec("pi", f"{url}/v1"),
        by_hand=_pi_by_hand,
        is_delta=_pi_delta,
        is_end=lambda line: line.get("type") == "agent_settled",
    ),
}


# --- memory ------------------------------------------------------------------------------


def _descendants(root: int) -> list[int]:
    """``root`` and every process below it."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry)] = int(fields[1])
    tree, frontier = [root], [root]
    while frontier:
        frontier = [pid for pid, parent in parents.items() if parent in frontier]
        tree += frontier
    return tree


def _pss_mb(pids: list[int]) -> float:
    """The summed PSS of ``pids`` (proportional: shared pages split among their users)."""
    total_kb = 0
    for pid in pids:
        try:
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        for line in rollup.splitlines():
            if line.startswith("Pss:"):
                total_kb += int(line.split()[1])
    return total_kb / 1024


# --- the floor: the CLI by hand ----------------------------------------------------------


async def _by_hand(bench: CliBench, cli: str, url: str, alive: AsyncExitStack) -> tuple[float, int]:
    """One CLI started by hand and left running in ``alive``: its start → first delta (s),
    and its pid."""
    tmp = Path(alive.enter_context(tempfile.TemporaryDirectory(prefix="corral-bench-cli-")))
    home, cwd = tmp / "home", tmp / "work"
    home.mkdir()
    cwd.mkdir()
    argv, env, lines = bench.by_hand(cli, url, home, cwd)
    first: float | None = None
    t0 = time.perf_counter()
    proc = await alive.enter_async_context(open_cli(argv, env=env, cwd=cwd))
    with trio.fail_after(TURN_LIMIT_S):
        for line in lines:
            await proc.send(line)
        while not bench.is_end(line := await proc.receive()):
            if first is None and bench.is_delta(line):
                first = time.perf_counter() - t0
            for answer in bench.reply(line):
                await proc.send(answer)
    if first is None:
        raise RuntimeError(f"{bench.command} by hand streamed no text")
    return first, proc.pid


# --- through corral ----------------------------------------------------------------------


def _worker_pids(inst: Instance) -> dict[str, int]:
    workers = request(inst.control_path, "inspect", actor="harness")["state"]["workers"]
    return {w["session_id"]: int(w["pid"]) for w in workers}


async def _measure(kind: str, inst: Instance, cli: str, n: int) -> Document:
    """``n`` rounds, each a CLI by hand then a new session through corral (so both see the
    same load), all left running; then everyone's memory, while all run."""
    bench = KINDS[kind]
    floor: list[float] = []
    cold: list[float] = []
    warm: list[float] = []
    async with trio.open_nursery() as nursery, AsyncExitStack() as alive:
        provider = FakeProvider(bench.frames())
        await provider.start(nursery)
        spec = bench.spec(provider.url)
        peer = await alive.enter_async_context(
            open_peer("bench-rx", inst.bus_endpoint, liveness=LIVENESS, accepts=AnyOutput)
        )
        by_hand = []
        for i in range(n):
            took, pid = await _by_hand(bench, cli, provider.url, alive)
            floor.append(took)
            by_hand.append(pid)
            cold.append(await first_delta(peer, f"cli-{i}", spec, limit_s=TURN_LIMIT_S))
            warm.append(await first_delta(peer, f"cli-{i}", spec, limit_s=TURN_LIMIT_S))
        workers = list((await trio.to_thread.run_sync(_worker_pids, inst)).values())
        cli_pss = [await trio.to_thread.run_sync(_pss_mb, _descendants(p)) for p in by_hand]
        sessions = [await trio.to_thread.run_sync(_pss_mb, _descendants(w)) for w in workers]
        alone = [await trio.to_thread.run_sync(_pss_mb, [w]) for w in workers]
        nursery.cancel_scope.cancel()
    for values in (floor, cold, warm, cli_pss, sessions, alone):
        values.sort()
    base = percentile(floor, 0.5) * 1000
    pss = percentile(cli_pss, 0.5)
    name = bench.command
    return {
        "benchmark": "harness",
        "baseline": {
            "name": f"{name} by hand on the same fake: start to first delta p50",
            "value": round(base, 1),
            "unit": "ms",
        },
        "results": [
            figure(
                f"{name} by hand: start to first delta p99",
                percentile(floor, 0.99) * 1e3,
                "ms",
                base,
            ),
            figure("new session to first delta p50", percentile(cold, 0.5) * 1e3, "ms", base),
            figure("new session to first delta p99", percentile(cold, 0.99) * 1e3, "ms", base),
            figure("next turn to first delta p50", percentile(warm, 0.5) * 1e3, "ms", base),
            figure(f"{name} by hand: PSS (median)", pss, "MB"),
            figure("session PSS, worker + CLI (median)", percentile(sessions, 0.5), "MB", pss),
            figure("worker PSS alone (median)", percentile(alone, 0.5), "MB", pss),
        ],
        "params": {
            "kind": kind,
            "cli": cli,
            "cli_version": await trio.to_thread.run_sync(clis.version, cli),
            "sessions": n,
            "python": sys.version.split()[0],
        },
    }


def run(kind: str, quick: bool) -> Document:
    """Run the benchmark of harness kind ``kind`` (a key of :data:`KINDS`).

    Raises:
        NotRunnable: the kind has no row yet, or its CLI is not installed here.
    """
    if kind not in KINDS:
        raise NotRunnable(f"no benchmark row for the {kind!r} kind yet (rows: {', '.join(KINDS)})")
    cli = clis.find(KINDS[kind].command)
    if cli is None:
        raise NotRunnable(f"{kind!r} cannot run here: {clis.missing(kind)}")
    with running_host("[liveness]\ninterval_s = 0.5\nliveness = 4\n") as inst:
        return trio.run(_measure, kind, inst, cli, 2 if quick else 10)


if __name__ == "__main__":
    import json

    print(json.dumps(run(sys.argv[1], "--quick" in sys.argv)))
