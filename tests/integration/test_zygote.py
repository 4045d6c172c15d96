"""The zygote (issue #20): workers and actors forked from a pre-imported template process,
real processes.

The first tests drive :class:`corral._zygote.Zygote` directly, with a child module of their
own (``_zygote_child``); the others a host's harness actor, whose workers it forks, and the
host, whose actors its own zygote forks.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from corral._child_env import HIDDEN_ENV, RESERVE_ENV, base_env, hide
from corral._zygote import FORKED_TITLE_PREFIX, HTTP_CLIENT_MODULES, Forked, Zygote
from corral._zygote._client import ANSWER_TIMEOUT_S, UNKNOWN_EXIT
from corral._zygote._messages import MAX_DATAGRAM, Born, Fork, decode_answer, encode
from corral._zygote._template import SETUP_ENV
from corral.actors._process import spawn
from corral.actors.harness._adopt import WORKER_MODULE, _unrecorded_workers
from corral.harnesses.protocol import Approval, InputAccepted, OutputTextDelta
from tests.conftest import FAST_LIVENESS, HostProcess, process_gone, wait_until
from tests.integration._dispatch import fake_dispatch, scripted

CHILD = "tests.integration._zygote_child"
HOST_ACTORS = frozenset({"harness"})
#: The default, said anyway: these tests are about it.
ZYGOTE_ON = "[actors.harness.options]\nzygote = true\n"


@pytest.fixture
def host(host_factory: Callable[..., HostProcess]) -> Iterator[HostProcess]:
    """A host whose harness actor forks its workers from a zygote."""
    h = host_factory(FAST_LIVENESS + ZYGOTE_ON).start()
    yield h
    if h.proc is not None and h.proc.poll() is None:
        h.stop()


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def _report(path: Path) -> dict[str, Any]:
    wait_until(path.exists, 15, f"the child's report {path.name}")
    return json.loads(path.read_text())


class Execs:
    """The exec spawn, counting what it was asked to start (and when)."""

    def __init__(self) -> None:
        self.argvs: list[list[str]] = []
        self.at: list[float] = []

    def __call__(self, argv: list[str], **kw: Any) -> subprocess.Popen[bytes]:
        self.argvs.append(argv)
        self.at.append(time.monotonic())
        return spawn(argv, **kw)


def _gone(pid: int, timeout: float) -> bool:
    """Whether process ``pid`` exits (or is gone) within ``timeout`` seconds."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([pidfd], [], [], timeout)[0])
    finally:
        os.close(pidfd)


def _child_env(out: Path, **more: str) -> dict[str, str]:
    return {**base_env(), "CHILD_OUT": str(out), **more}


async def test_a_forked_child_is_what_an_exec_makes_and_its_status_is_reported(
    tmp_path: Path,
) -> None:
    """Its own session, the requested directory and environment — in ``os.environ`` and in
    ``/proc/PID/environ`` alike, hidden variables in the first only — one thread, and its
    return code (an exit, a kill -9) told by the zygote, whose child it is."""
    execs = Execs()
    zygote = Zygote((CHILD,), {**base_env(), "ZYGOTE_ONLY": "of-the-zygote"}, fallback=execs)
    async with trio.open_nursery() as nursery:
        await nursery.start(zygote.run)
        assert await zygote.ready(30)
        assert zygote.pid is not None
        shown = _child_env(tmp_path / "exit.json", CHILD_EXIT="3")
        proc = zygote.spawn([sys.executable, "-m", CHILD], env=shown, cwd=tmp_path)
        assert isinstance(proc, Forked)
        assert await proc.wait() == 3 and proc.poll() == 3
        report = _report(tmp_path / "exit.json")
        assert report["ppid"] == zygote.pid, "forked by the zygote"
        assert report["sid"] == report["pgid"] == report["pid"], "its own session and group"
        assert report["cwd"] == str(tmp_path) and report["threads"] == 1
        assert report["environ"] == shown

        out = tmp_path / "held.json"
        env = hide(_child_env(out, CHILD_HOLD="1"), {"CHILD_API_KEY": "s3cret-key"})
        held = zygote.spawn([sys.executable, "-m", CHILD], env=env)
        assert isinstance(held, Forked)
        seen = _report(out)["environ"]
        assert seen["CHILD_API_KEY"] == "s3cret-key", "a hidden variable reaches os.environ"
        assert HIDDEN_ENV not in seen and "ZYGOTE_ONLY" not in seen
        block = _environ(held.pid)
        assert block == {k: v for k, v in env.items() if k not in ("CHILD_API_KEY", HIDDEN_ENV)}
        assert "s3cret-key" not in Path(f"/proc/{held.pid}/environ").read_text()
        zygote_block = _environ(zygote.pid)
        assert SETUP_ENV in zygote_block and RESERVE_ENV in zygote_block
        assert not any(k in block for k in (SETUP_ENV, RESERVE_ENV, "ZYGOTE_ONLY"))
        assert held.poll() is None
        os.kill(held.pid, signal.SIGKILL)
        assert await held.wait() == -signal.SIGKILL
        assert zygote.statistics()["forked"] == 2 and execs.argvs == []
        nursery.cancel_scope.cancel()
    assert zygote.proc is not None and zygote.proc.poll() is not None, "stopped with its owner"


async def test_forked_children_number_their_bus_messages_apart(tmp_path: Path) -> None:
    """Two children forked from one zygote, each as fresh as an exec'd one, give their
    first bus messages different ids (the broker keeps one message per id: two workers that
    numbered alike had one's parked elicitation taken for the other's, its turn hung)."""
    zygote = Zygote((CHILD,), base_env(), fallback=Execs())
    argv = [sys.executable, "-m", CHILD]
    async with trio.open_nursery() as nursery:
        await nursery.start(zygote.run)
        assert await zygote.ready(60)
        ids = []
        for name in ("one", "two"):
            child = zygote.spawn(argv, env=_child_env(tmp_path / f"{name}.json"))
            assert isinstance(child, Forked) and await child.wait() == 0
            ids.append(_report(tmp_path / f"{name}.json")["message_id"])
        nursery.cancel_scope.cancel()
    first, second = (i.rsplit("-", 1)[0] for i in ids)
    assert first != second, f"forked children share their ids' prefix: {ids}"


async def test_a_child_its_owner_did_not_take_runs_nothing(tmp_path: Path) -> None:
    """The owner gave up on the answer (or died) before it took the child: the child, forked
    all the same, exits at the end of its go pipe without running its entry — no second
    worker of a session beside the one exec'd instead. Until it is taken its title names
    what it will run (a dead harness actor's successor tells a worker by it)."""
    zygote = Zygote((CHILD,), base_env(), fallback=Execs())
    async with trio.open_nursery() as nursery:
        await nursery.start(zygote.run)
        assert await zygote.ready(60)
        requests = zygote._requests
        assert requests is not None
        go_read, go = os.pipe()
        request = Fork(entry=CHILD, shown=_child_env(tmp_path / "untaken.json"))
        socket.send_fds(requests, [encode(request)], [go_read])
        os.close(go_read)
        answer = decode_answer(requests.recv(MAX_DATAGRAM))
        assert isinstance(answer, Born)
        title = f"{FORKED_TITLE_PREFIX}{CHILD}".encode()
        await trio.to_thread.run_sync(
            lambda: wait_until(
                lambda: Path(f"/proc/{answer.pid}/cmdline").read_bytes().startswith(title),
                15,
                "the forked child's title",
            )
        )
        os.close(go)
        assert await trio.to_thread.run_sync(_gone, answer.pid, 15)
        assert not (tmp_path / "untaken.json").exists(), "a child nobody took ran its entry"
        taken = zygote.spawn([sys.executable, "-m", CHILD], env=_child_env(tmp_path / "t.json"))
        assert isinstance(taken, Forked) and await taken.wait() == 0
        assert _report(tmp_path / "t.json")["ppid"] == zygote.pid
        nursery.cancel_scope.cancel()


async def test_a_zygote_that_does_not_answer_holds_a_spawn_less_than_a_liveness_window(
    tmp_path: Path,
) -> None:
    """A stopped (wedged) zygote: the spawn waits ANSWER_TIMEOUT_S, well inside the 3 s in
    which the host counts its silent owner dead (the spawn blocks the owner's trio thread),
    then execs the child and kills the zygote; the next one takes over."""
    execs = Execs()
    zygote = Zygote((CHILD,), base_env(), fallback=execs)
    argv = [sys.executable, "-m", CHILD]
    async with trio.open_nursery() as nursery:
        await nursery.start(zygote.run)
        assert await zygote.ready(60)
        first = zygote.pid
        assert first is not None
        os.kill(first, signal.SIGSTOP)
        asked = time.monotonic()
        proc = zygote.spawn(argv, env=_child_env(tmp_path / "e.json"))
        assert isinstance(proc, subprocess.Popen) and execs.argvs == [argv]
        assert execs.at[0] - asked < 3.0, "the owner's thread was held past its liveness"
        assert execs.at[0] - asked >= ANSWER_TIMEOUT_S
        assert zygote.pid is None, "a zygote that did not answer is asked nothing more"
        again = zygote.spawn(argv, env=_child_env(tmp_path / "a.json"))
        assert isinstance(again, subprocess.Popen) and len(execs.argvs) == 2
        assert await trio.to_thread.run_sync(again.wait) == 0
        assert await trio.to_thread.run_sync(proc.wait) == 0
        assert await trio.to_thread.run_sync(_gone, first, 15), "the wedged zygote is killed"
        assert await zygote.ready(60) and zygote.pid not in (None, first)
        nursery.cancel_scope.cancel()


def test_a_worker_a_zygote_forked_for_a_dead_harness_actor_is_found_unrecorded() -> None:
    """A harness actor killed between a fork and the worker's pid file: its successor finds
    the worker among the host's children by the title its zygote gave it, as it finds an
    exec'd one by its command line, and kills it."""
    title = f"{FORKED_TITLE_PREFIX}{WORKER_MODULE}"
    code = f"import setproctitle, signal; setproctitle.setproctitle({title!r}); signal.pause()"
    proc = subprocess.Popen([sys.executable, "-c", code], env={**base_env(), "SPT_NOENV": "1"})
    try:
        wait_until(
            lambda: Path(f"/proc/{proc.pid}/cmdline").read_bytes().startswith(title.encode()),
            15,
            "the stand-in worker's title",
        )
        assert proc.pid in _unrecorded_workers(os.getpid(), set())
        assert proc.pid not in _unrecorded_workers(os.getpid(), {proc.pid})
    finally:
        proc.kill()
        proc.wait()


async def test_what_the_zygote_did_not_preload_is_execd(tmp_path: Path) -> None:
    execs = Execs()
    zygote = Zygote((CHILD,), base_env(), fallback=execs)
    async with trio.open_nursery() as nursery:
        await nursery.start(zygote.run)
        assert await zygote.ready(30)
        argv = [sys.executable, "-m", "tests.integration._zygote_child", "an-argument"]
        proc = zygote.spawn(argv, env=_child_env(tmp_path / "c.json"))
        assert isinstance(proc, subprocess.Popen) and execs.argvs == [argv]
        assert await trio.to_thread.run_sync(proc.wait) == 0
        assert _report(tmp_path / "c.json")["ppid"] == os.getpid()
        nursery.cancel_scope.cancel()


async def test_a_killed_zygote_leaves_its_children_and_the_spawn_execs_until_the_next_is_ready(
    tmp_path: Path,
) -> None:
    """kill -9 of the zygote: its child lives on (its exit then seen through a pidfd, the
    status unknown); a spawn meanwhile is exec'd; a new zygote takes over."""
    execs = Execs()
    zygote = Zygote((CHILD,), base_env(), fallback=execs)
    argv = [sys.executable, "-m", CHILD]
    async with trio.open_nursery() as nursery:
        await nursery.start(zygote.run)
        assert await zygote.ready(30)
        first = zygote.pid
        assert first is not None
        orphan = zygote.spawn(argv, env=_child_env(tmp_path / "o.json", CHILD_HOLD="1"))
        assert isinstance(orphan, Forked)
        _report(tmp_path / "o.json")
        pidfd = os.pidfd_open(first)
        os.kill(first, signal.SIGKILL)
        # Dead before the spawn, which comes before this task yields (and its owner sees it).
        assert select.select([pidfd], [], [], 15)[0]
        os.close(pidfd)
        fallback = zygote.spawn(argv, env=_child_env(tmp_path / "f.json"))
        assert isinstance(fallback, subprocess.Popen) and execs.argvs == [argv]
        assert await trio.to_thread.run_sync(fallback.wait) == 0
        assert await zygote.ready(30)
        assert zygote.pid not in (None, first)
        assert orphan.poll() is None, "the zygote's death is not its child's"
        os.kill(orphan.pid, signal.SIGKILL)
        assert await orphan.wait() == UNKNOWN_EXIT
        again = zygote.spawn(argv, env=_child_env(tmp_path / "a.json"))
        assert isinstance(again, Forked) and await again.wait() == 0
        assert _report(tmp_path / "a.json")["ppid"] == zygote.pid
        assert zygote.statistics()["zygote_starts"] == 2
        nursery.cancel_scope.cancel()


async def test_a_child_of_a_stopped_zygote_is_still_seen_to_exit(tmp_path: Path) -> None:
    """The owner stops its zygote (the harness actor stops) before its supervisor stops the
    children: a child's exit is still seen, through its pidfd (was: it waited for a report
    no zygote would send, and the actor's stop hung on its first worker)."""
    zygote = Zygote((CHILD,), base_env(), fallback=Execs())
    async with trio.open_nursery() as nursery:
        await nursery.start(zygote.run)
        assert await zygote.ready(60)
        env = _child_env(tmp_path / "h.json", CHILD_HOLD="1")
        child = zygote.spawn([sys.executable, "-m", CHILD], env=env)
        assert isinstance(child, Forked)
        _report(tmp_path / "h.json")
        nursery.cancel_scope.cancel()
    assert zygote.proc is not None and zygote.proc.poll() is not None
    assert child.poll() is None, "the zygote's stop is not its child's"
    os.kill(child.pid, signal.SIGTERM)
    with trio.fail_after(15):
        assert await child.wait() == UNKNOWN_EXIT


async def test_an_owner_that_stops_before_the_zygote_is_ready_leaves_no_traceback(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """A host stopped as it starts: the zygote finds its owner gone when it would say it is
    ready, and exits quietly (its stderr is the host's log)."""
    zygote = Zygote((CHILD,), base_env(), fallback=Execs())
    async with trio.open_nursery() as nursery:
        await nursery.start(zygote.run)
        nursery.cancel_scope.cancel()
    assert zygote.proc is not None and zygote.proc.returncode in (0, -signal.SIGKILL)
    assert "Traceback" not in capfd.readouterr().err


# --- in a host -----------------------------------------------------------------------------

ENV_HARNESS = (
    '[actors.harness.options.harnesses]\nenvdump = "tests.integration._env_harness:EnvDump"\n'
)


def _state(host: HostProcess) -> dict[str, Any]:
    return host.ask("inspect", actor="harness")["state"]


def _worker_pid(host: HostProcess, session_id: str) -> int:
    (pid,) = [w["pid"] for w in _state(host)["workers"] if w["session_id"] == session_id]
    return int(pid)


async def test_d13_d15_a_forked_worker_has_its_key_and_none_of_the_hosts_secrets(
    host_factory,
) -> None:
    """H-09 for a forked worker: its ``os.environ`` holds the spawn environment (the model,
    the one key its spec asks for) and nothing else of the host's; its environ block shows
    the spawn environment without the key; the zygote holds no secret at all (nothing of the
    host's reaches a client: D-13..D-15)."""
    secrets = {"CORRAL_TEST_SECRET_TOKEN": "tok-do-not-leak", "OTHER_SECRET": "other-do-not-leak"}
    host = host_factory(FAST_LIVENESS + ZYGOTE_ON + ENV_HARNESS).start(
        env={**secrets, "ENVDUMP_KEY": "key-for-the-worker"}
    )
    spec = {
        "name": "env",
        "executor": {
            "harness": "envdump",
            "model": "spec-model",
            "auth": {"type": "api_key", "api_key": "$ENVDUMP_KEY"},
        },
    }
    async with fake_dispatch(host.endpoint) as d:
        turn = await d.start_turn("s-env", spec)
        end = await d.terminal(turn)
        assert end.__struct_config__.tag == "response.completed", end
        text = "".join(e.delta for e in d.of_turn(turn) if isinstance(e, OutputTextDelta))
    environ = json.loads(text)
    zygote = _state(host)["zygote"]
    worker = _worker_pid(host, "s-env")
    assert _ppid(worker) == zygote["pid"] and zygote["forked"] == 1
    assert environ["HARNESS_ENVDUMP_API_KEY"] == "key-for-the-worker"
    assert environ["HARNESS_ENVDUMP_MODEL"] == "spec-model"
    block = _environ(worker)
    assert block["HARNESS_ENVDUMP_MODEL"] == "spec-model"
    for place in (json.dumps(environ), json.dumps(block), json.dumps(_environ(zygote["pid"]))):
        for name, value in secrets.items():
            assert name not in place and value not in place
    assert "key-for-the-worker" not in json.dumps(block)
    assert "key-for-the-worker" not in json.dumps(_environ(zygote["pid"]))
    host.stop()


async def test_e01_forked_workers_park_their_elicitations_apart_and_each_verdict_arrives(
    host: HostProcess,
) -> None:
    """E-01 with workers forked from one zygote: each session's worker parks its own
    elicitation (its own message id: the broker keeps one message per id) and each verdict
    reaches it, so both turns complete."""
    ask = scripted({"elicit": {"message": "Go on?"}}, {"text": "Done.", "on_decline": "No."})
    sessions = [f"s-park-{n}" for n in range(4)]
    async with fake_dispatch(host.endpoint) as d:
        turns = [await d.start_turn(session, ask) for session in sessions]
        requests = [
            await d.wait_type("response.elicitation_request", turn_id=turn, timeout=30)
            for turn in turns
        ]
        listed = [r.elicitation_id for r in requests]
        rows = await trio.to_thread.run_sync(lambda: host.elicitations(*listed, timeout=30))
        parked = {r["elicitation_id"] for r in rows if r["state"] == "parked"}
        assert parked == set(listed)
        for session, req in zip(sessions, requests, strict=True):
            reply = await d.send(
                Approval(session_id=session, elicitation_id=req.elicitation_id, action="accept"),
                durable=True,
            )
            assert reply == InputAccepted(status=204), (session, reply)
        for turn in turns:
            end = await d.terminal(turn, timeout=30)
            assert end.__struct_config__.tag == "response.completed", end
    assert _state(host)["zygote"]["forked"] == len(sessions)


@pytest.mark.chaos
async def test_kill_9_of_a_forked_worker_mid_turn_ends_it_harness_crashed(
    host: HostProcess,
) -> None:
    long = scripted({"text": "x", "repeat": 3000, "delay_ms": 5})
    async with fake_dispatch(host.endpoint) as d:
        turn = await d.start_turn("s-kill", long)
        await d.wait_type("response.output_text.delta", turn_id=turn)
        worker = _worker_pid(host, "s-kill")
        assert _ppid(worker) == _state(host)["zygote"]["pid"]
        os.kill(worker, signal.SIGKILL)
        end = await d.terminal(turn)
    assert end.error["code"] == "harness_crashed"
    assert "killed by signal 9" in end.error["message"], "its status, from the zygote"


@pytest.mark.chaos
async def test_kill_9_of_the_zygote_keeps_its_workers_and_workers_still_start(
    host: HostProcess,
) -> None:
    """A worker the dead zygote forked serves on and still ends ``harness_crashed`` when
    killed; a new session's worker starts (exec'd, or forked from the next zygote)."""
    long = scripted({"text": "x", "repeat": 3000, "delay_ms": 5})
    async with fake_dispatch(host.endpoint) as d:
        first = await d.start_turn("s-old", scripted({"text": "one"}))
        await d.terminal(first)
        old = _worker_pid(host, "s-old")
        zygote = _state(host)["zygote"]
        started = zygote["zygote_starts"]
        os.kill(zygote["pid"], signal.SIGKILL)
        await trio.to_thread.run_sync(
            lambda: wait_until(
                lambda: _state(host)["zygote"]["zygote_starts"] > started, 30, "the next zygote"
            )
        )
        new = await d.start_turn("s-new", scripted({"text": "two"}))
        assert (await d.terminal(new)).__struct_config__.tag == "response.completed"
        turn = await d.start_turn("s-old", long)
        await d.wait_type("response.output_text.delta", turn_id=turn)
        assert _worker_pid(host, "s-old") == old, "the same worker serves its session"
        os.kill(old, signal.SIGKILL)
        end = await d.terminal(turn)
    assert end.error["code"] == "harness_crashed"
    assert process_gone(old, None)


async def test_without_a_zygote_workers_are_execd_by_the_harness_actor(host_factory) -> None:
    host = host_factory(FAST_LIVENESS + "[actors.harness.options]\nzygote = false\n").start()
    async with fake_dispatch(host.endpoint) as d:
        turn = await d.start_turn("s-exec", scripted({"text": "x"}))
        assert (await d.terminal(turn)).__struct_config__.tag == "response.completed"
    state = _state(host)
    assert state["zygote"] is None
    assert _ppid(_worker_pid(host, "s-exec")) == host.actor("harness")["pid"]
    host.stop()


def _host_zygote(host: HostProcess) -> dict[str, Any]:
    return host.status()["host"]["zygote"]


@pytest.mark.chaos
async def test_the_hosts_actors_are_forked_from_its_zygote_outlive_it_and_die_with_the_host(
    host: HostProcess,
) -> None:
    """By default the host forks its actors from a zygote of its own. A ``kill -9`` of that
    zygote leaves its actors running, and the workers of the harness actor it forked (all are
    tied to the host by a pidfd, not to their parent, and a worker's pid file names the host:
    the zygote is no host); an actor killed afterwards is started again and serves turns; a
    ``kill -9`` of the host ends them all, forked or not."""
    zygote = _host_zygote(host)
    harness = host.actor("harness")["pid"]
    assert _ppid(harness) == zygote["pid"] and zygote["forked"] >= 1
    async with fake_dispatch(host.endpoint) as d:
        turn = await d.start_turn("s-before", scripted({"text": "one"}))
        assert (await d.terminal(turn)).__struct_config__.tag == "response.completed"
    worker = _worker_pid(host, "s-before")
    (pidfile,) = [f for f in host.state_dir.rglob("*.pid") if f'"pid": {worker},' in f.read_text()]
    assert json.loads(pidfile.read_text())["host_pid"] == host.proc.pid
    os.kill(zygote["pid"], signal.SIGKILL)
    await trio.to_thread.run_sync(
        lambda: wait_until(
            lambda: (_host_zygote(host)["pid"] or zygote["pid"]) != zygote["pid"],
            30,
            "the host's next zygote",
        )
    )
    assert host.actor("harness")["pid"] == harness, "the actor outlives its zygote"
    async with fake_dispatch(host.endpoint) as d:
        turn = await d.start_turn("s-before", scripted({"text": "two"}))
        assert (await d.terminal(turn)).__struct_config__.tag == "response.completed"
    assert _worker_pid(host, "s-before") == worker, "its worker too"
    before = host.actor("harness")
    os.kill(harness, signal.SIGKILL)
    again = await trio.to_thread.run_sync(host.restarted, "harness", before)
    assert _ppid(again["pid"]) in (_host_zygote(host)["pid"], host.proc.pid)
    async with fake_dispatch(host.endpoint) as d:
        turn = await d.start_turn("s-after", scripted({"text": "fine"}))
        assert (await d.terminal(turn, timeout=30)).__struct_config__.tag == "response.completed"
    actor = host.actor("harness")["pid"]
    host.kill9()
    await trio.to_thread.run_sync(
        lambda: wait_until(lambda: process_gone(actor, None), 10, "the actor gone with its host")
    )


def _rollup(pid: int, field: str) -> int:
    """A ``/proc/PID/smaps_rollup`` figure, in kB."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in the smaps of {pid}")


def test_the_hosts_first_zygote_is_forked_from_it_and_shares_its_pages_but_no_secret_or_file(
    host_factory,
) -> None:
    """``corral up`` forks the actors' zygote from the host before trio runs (#20): the host,
    the zygote and every actor then share the host's pages (the interpreter, the modules all
    of them import), where an exec'd zygote held a copy of its own and the host's were its
    alone. The zygote keeps none of the host's files open (its log, its state), and its
    environ block, which every process of the user reads, shows none of the host's secrets:
    the host blanks them before the fork. A later zygote, after a death, is exec'd."""
    secrets = {"CORRAL_TEST_SECRET_TOKEN": "tok-do-not-leak"}
    host = host_factory(FAST_LIVENESS).start(env=secrets)
    zygote = _host_zygote(host)
    assert zygote["zygotes_forked"] == 1 and zygote["zygote_starts"] == 1
    assert _ppid(zygote["pid"]) == host.proc.pid
    # The host's pages are shared (the exec'd zygote's host shared none: 0 kB).
    assert _rollup(host.proc.pid, "Shared_Dirty") > 8 * 1024
    # Beside stdin (/dev/null), stdout and stderr: its two sockets, the seed socket its
    # actors inherit (the harness actor's, corral/_zygote/_seed.py), its selector, the pidfds
    # of its children; nothing of the host's (its log file, the bus, the control socket).
    fds = Path(f"/proc/{zygote['pid']}/fd")
    held = sorted(os.readlink(fd) for fd in fds.iterdir() if int(fd.name) > 2)
    assert [h.split(":")[0] for h in held if not h.startswith("anon_inode:")] == ["socket"] * 3
    assert {h for h in held if h.startswith("anon_inode:")} == {
        "anon_inode:[eventpoll]",
        "anon_inode:[pidfd]",
    }
    assert os.readlink(fds / "0") == "/dev/null"
    for pid in (zygote["pid"], host.actor("harness")["pid"]):
        block = json.dumps(_environ(pid))
        assert "CORRAL_TEST_SECRET_TOKEN" not in block and "tok-do-not-leak" not in block
    os.kill(zygote["pid"], signal.SIGKILL)
    wait_until(lambda: _host_zygote(host)["pid"] not in (None, zygote["pid"]), 30, "a new zygote")
    again = _host_zygote(host)
    assert again["zygotes_forked"] == 1 and again["zygote_starts"] == 2
    assert Path(f"/proc/{again['pid']}/cmdline").read_bytes().startswith(b"corral: zygote")
    host.stop()

    # A forked zygote dies with its host (its parent-death signal), and so do its actors.
    other = host_factory(FAST_LIVENESS).start()
    zygote, actor = _host_zygote(other)["pid"], other.actor("harness")["pid"]
    other.kill9()
    for pid in (zygote, actor):
        wait_until(lambda pid=pid: process_gone(pid, None), 10, f"{pid} gone with its host")


def test_without_the_hosts_zygote_actors_are_execd_by_the_host(host_factory) -> None:
    host = host_factory(FAST_LIVENESS + "[supervisor]\nzygote = false\n").start()
    assert host.status()["host"]["zygote"] is None
    assert _ppid(host.actor("harness")["pid"]) == host.proc.pid
    host.stop()


@pytest.mark.parametrize(
    ("item", "loaded"),
    [("corral.actors.dispatch", False), ("corral.actors.dispatch:DispatchActor", True)],
)
def test_a_preload_of_module_colon_name_loads_what_a_lazy_package_defers(
    item: str, loaded: bool
) -> None:
    """The dispatch package imports its actor's module only when ``DispatchActor`` is looked
    up (corral/_lazy.py): the host's zygote preloads ``module:Class``, so that a forked actor
    does not import (and pay for, page by page) its own module after the fork."""
    script = (
        "import sys; from corral._zygote._template import preload; "
        f"preload({item!r}); print('corral.actors.dispatch._actor' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(loaded)


_FIRST_REQUEST = """
import http.server, importlib, sys, threading, trio, httpx
from corral._zygote._template import preload
for item in sys.argv[1:]:
    preload(item)
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
threading.Thread(target=server.serve_forever, daemon=True).start()
before = set(sys.modules)
async def main():
    async with httpx.AsyncClient() as client:
        await client.get(f"http://localhost:{server.server_address[1]}/")
trio.run(main)
print(" ".join(sorted(set(sys.modules) - before)))
"""


@pytest.mark.parametrize("preloaded", [False, True])
def test_a_zygote_that_preloads_the_http_client_modules_leaves_a_first_request_nothing_to_import(
    preloaded: bool, tmp_path: Path
) -> None:
    """httpx imports httpcore (h2, hpack, anyio, certifi: ~55 modules) at its first request,
    which the dispatch, policy and tools actors and an ``openai`` worker make after the fork:
    preloaded (``HTTP_CLIENT_MODULES``, in both zygotes' preloads) they are shared pages."""
    items = HTTP_CLIENT_MODULES if preloaded else ()
    out = subprocess.run(
        [sys.executable, "-c", _FIRST_REQUEST, *items],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    imported = out.stdout.split()
    if preloaded:
        assert imported == []
    else:
        assert "httpcore" in imported
