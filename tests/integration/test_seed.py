"""The seed (issue #20, corral/_zygote/_seed.py): ``corral up`` forks it before it holds a
secret, and the harness actor's zygotes are forked from it, so that the workers share the
host's pages without ever having held the host's memory (D-13..D-15). Real processes: a host
started as operators start it, and the seed forked by a script of its own."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import trio

from corral._child_env import CLEAN_ENV, HIDDEN_ENV_FD, clean_env
from corral._zygote._seed import SEED_ENV, seed_fd
from tests.conftest import FAST_LIVENESS, HostProcess, corral, wait_until
from tests.integration._dispatch import fake_dispatch, scripted

SECRETS = {"CORRAL_TEST_SECRET_TOKEN": "tok-do-not-leak", "SOME_API_KEY": "key-do-not-leak"}
#: A secret only the config file holds (the host reads it after the seed is forked).
CONFIG_SECRET = "cfg-secret-do-not-leak"


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _title(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()


def _memory_holds(pid: int, needles: list[bytes]) -> set[bytes]:
    """Which of ``needles`` are anywhere in process ``pid``'s readable memory."""
    found: set[bytes] = set()
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb") as mem:
        for line in maps:
            fields = line.split()
            if "r" not in fields[1] or fields[-1] in ("[vvar]", "[vsyscall]"):
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            try:
                mem.seek(start)
                data = mem.read(end - start)
            except OSError:
                continue
            found |= {n for n in needles if n in data}
    return found


def _shared_dirty_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Shared_Dirty:"):
            return int(line.split()[1])
    raise AssertionError(f"no Shared_Dirty in the smaps of {pid}")


def _harness(host: HostProcess) -> dict[str, Any]:
    return host.ask("inspect", actor="harness")["state"]


def _worker(host: HostProcess, session_id: str) -> int:
    (pid,) = [w["pid"] for w in _harness(host)["workers"] if w["session_id"] == session_id]
    return int(pid)


def _seed_of(host: HostProcess) -> int:
    """The seed, as ``corral status --json`` shows it (``host.seed``): the host's child."""
    seed = host.status()["host"]["seed"]
    assert seed["alive"] and host.proc is not None
    assert _ppid(seed["pid"]) == host.proc.pid and _title(seed["pid"]) == "corral: seed"
    return int(seed["pid"])


async def test_d13_the_seed_its_zygote_and_their_workers_never_held_a_secret_of_the_hosts(
    host_factory,
) -> None:
    """``corral up`` execs itself with its secrets in a memfd, forks the seed, and only then
    reads them and its config: the seed, the harness actor's zygote it forked and that
    zygote's worker hold none of them anywhere in their memory — which the host, and each
    actor, do — and yet they share the host's pages."""
    config = FAST_LIVENESS + (
        f'[[server.policies]]\ntool = "never_called"\naction = "ask"\nmessage = "{CONFIG_SECRET}"\n'
    )
    host = host_factory(config).start(env=SECRETS)
    async with fake_dispatch(host.endpoint) as d:
        turn = await d.start_turn("s-seed", scripted({"text": "fine"}))
        assert (await d.terminal(turn)).__struct_config__.tag == "response.completed"
    assert host.proc is not None
    seed = _seed_of(host)
    zygote = _harness(host)["zygote"]
    assert zygote["zygotes_seeded"] == 1 and zygote["zygote_starts"] == 1
    assert _ppid(zygote["pid"]) == seed and _title(zygote["pid"]) == "corral: zygote"
    worker = _worker(host, "s-seed")
    assert _ppid(worker) == zygote["pid"]
    needles = [v.encode() for v in (*SECRETS.values(), CONFIG_SECRET)]
    for pid in (seed, zygote["pid"], worker):
        assert _memory_holds(pid, needles) == set(), _title(pid)
    # The test can see a secret where one is: the host holds all three, and so does an actor.
    assert _memory_holds(host.proc.pid, needles) == set(needles)
    assert _memory_holds(host.actor("harness")["pid"], needles) == set(needles)
    # Its pages are the host's: an exec'd zygote shared none with anyone but its workers.
    assert _shared_dirty_kb(seed) > 8 * 1024
    # Nor does the seed's environ block show a secret: it is the clean exec's, the host's
    # (which the host blanks further, of all but the allow-list).
    block = Path(f"/proc/{seed}/environ").read_bytes()
    assert not any(n in block for n in needles) and CLEAN_ENV.encode() in block
    assert not any(n in Path(f"/proc/{host.proc.pid}/environ").read_bytes() for n in needles)
    # An operator sees it: `corral status` names the seed.
    shown = corral("status", "--state-dir", str(host.state_dir))
    assert shown.returncode == 0 and f"seed pid {seed}" in shown.stdout, shown.stdout
    host.stop()


async def test_a_killed_seed_leaves_the_harness_zygote_execd_and_turns_still_run(
    host_factory,
) -> None:
    """With the seed gone, the harness actor's next zygote is exec'd (its own child, as
    without a seed), the workers the old one forked serve on, and new sessions start."""
    host = host_factory(FAST_LIVENESS).start()
    async with fake_dispatch(host.endpoint) as d:
        first = await d.start_turn("s-one", scripted({"text": "one"}))
        await d.terminal(first)
        old = _worker(host, "s-one")
        os.kill(_seed_of(host), signal.SIGKILL)
        await trio.to_thread.run_sync(
            lambda: wait_until(lambda: not host.status()["host"]["seed"]["alive"], 10, "seed gone")
        )
        zygote = _harness(host)["zygote"]
        os.kill(zygote["pid"], signal.SIGKILL)
        await trio.to_thread.run_sync(
            lambda: wait_until(
                lambda: (_harness(host)["zygote"]["pid"] or zygote["pid"]) != zygote["pid"],
                30,
                "the next zygote",
            )
        )
        again = _harness(host)["zygote"]
        assert again["zygotes_seeded"] == 1 and again["zygote_starts"] == 2
        assert _ppid(again["pid"]) == host.actor("harness")["pid"], "exec'd by the actor"
        new = await d.start_turn("s-two", scripted({"text": "two"}))
        assert (await d.terminal(new)).__struct_config__.tag == "response.completed"
        assert _ppid(_worker(host, "s-two")) == again["pid"]
        turn = await d.start_turn("s-one", scripted({"text": "three"}))
        assert (await d.terminal(turn)).__struct_config__.tag == "response.completed"
        assert _worker(host, "s-one") == old, "the seed's worker serves its session on"
    host.stop()


SEED_SCRIPT = """
import json, os, socket, sys
from corral._child_env import CLEAN_ENV
from corral._zygote._messages import MAX_DATAGRAM, Sprout, decode_report, encode
from corral._zygote._seed import fork_seed, sprout

os.environ[CLEAN_ENV] = str(os.getpid())
fd = fork_seed(("corral.bus",))
seed = socket.socket(fileno=os.dup(fd))
seed.send(b"not a request")                      # no sockets, and no Sprout
r, w = os.pipe()
socket.send_fds(seed, [encode(Sprout(items=[]))], [r])  # one file, not two sockets
requests, reports = sprout(fd, ["json"], {"CORRAL_LOG_LEVEL": "debug"})
ready = decode_report(reports.recv(MAX_DATAGRAM))
print(json.dumps({"zygote": ready.pid}), flush=True)
seed_pid = int(sys.stdin.readline())
os.kill(seed_pid, 9)
os.waitpid(seed_pid, 0)
try:
    sprout(fd, ["json"], {})
except OSError as exc:
    print("refused:", type(exc).__name__, flush=True)
"""


def test_the_seed_refuses_a_malformed_request_and_forks_the_next(tmp_path: Path) -> None:
    """A datagram that is not a Sprout, or comes without its two sockets, is logged and
    dropped; the seed serves the next request: the zygote it forks says Ready, its parent
    the seed. Once the seed is gone, asking it is an error the owner falls back on."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SEED_SCRIPT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        said = json.loads(proc.stdout.readline())
        seed = _ppid(said["zygote"])
        assert _ppid(seed) == proc.pid and _title(seed) == "corral: seed"
        # The zygote's environment is the one asked for, shown as an exec'd zygote's is.
        environ = Path(f"/proc/{said['zygote']}/environ").read_bytes()
        assert b"CORRAL_LOG_LEVEL=debug\0" in environ
        proc.stdin.write(f"{seed}\n")
        proc.stdin.flush()
        assert proc.stdout.readline().startswith("refused: ")
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    _, err = proc.communicate()
    assert "the seed forked no zygote" in err and err.count("the seed forked no zygote") == 2


def test_the_clean_exec_shows_the_allow_list_and_hides_the_rest() -> None:
    """What ``corral up`` execs itself with: the actors' allow-list, the state dir and config,
    the interpreter's and loader's settings in the environ block; every other variable
    (tokens, keys, proxies) in the memfd; never a stale clean mark."""
    environ = {
        "PATH": "/bin",
        "HOME": "/h",
        "PYTHONPATH": "/p",
        "PYTHONHASHSEED": "0",
        "LD_LIBRARY_PATH": "/l",
        "CORRAL_STATE_DIR": "/s",
        "CORRAL_LOG_LEVEL": "debug",
        "CORRAL_RUNNER_TOKEN": "tok",
        "OPENAI_API_KEY": "sk",
        "HTTPS_PROXY": "http://u:pw@proxy",
        CLEAN_ENV: "1",
        HIDDEN_ENV_FD: "7",
    }
    shown, hidden = clean_env(environ)
    assert set(shown) == {
        "PATH",
        "HOME",
        "PYTHONPATH",
        "PYTHONHASHSEED",
        "LD_LIBRARY_PATH",
        "CORRAL_STATE_DIR",
        "CORRAL_LOG_LEVEL",
    }
    assert set(hidden) == {"CORRAL_RUNNER_TOKEN", "OPENAI_API_KEY", "HTTPS_PROXY", HIDDEN_ENV_FD}


def test_a_seed_socket_is_trusted_only_where_it_is_the_same_socket(tmp_path: Path) -> None:
    """:data:`SEED_ENV` names an fd and its inode: an exec'd process, whose fd of that number
    is another file (or none), has no seed socket."""
    a, b = socket.socketpair()
    with a, b, open(tmp_path / "f", "w") as other:
        ino = os.fstat(a.fileno()).st_ino
        assert seed_fd({SEED_ENV: f"{a.fileno()}:{ino}"}) == a.fileno()
        assert seed_fd({SEED_ENV: f"{other.fileno()}:{ino}"}) is None
        assert seed_fd({SEED_ENV: f"{b.fileno()}:{ino}"}) is None
        assert seed_fd({SEED_ENV: "999:1"}) is None and seed_fd({}) is None


def test_a_corral_up_that_cannot_exec_itself_runs_on_without_a_seed() -> None:
    """The second exec failing (here: no interpreter where ``sys.executable`` says) is told on
    stderr and costs the seed only: the process goes on with its environment whole, and
    ``fork_seed`` forks nothing in a process that was not exec'd clean."""
    script = (
        "import os, sys\n"
        "sys.executable = '/nonexistent/python'\n"
        "from corral._child_env import reexec_clean\n"
        "from corral._zygote import fork_seed\n"
        "reexec_clean()\n"
        "print(os.environ['SOME_API_KEY'], fork_seed(('json',)), flush=True)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **SECRETS},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["key-do-not-leak", "None"]
    assert "could not exec itself clean (no seed)" in out.stderr


def _children_titled(parent: int, title: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and _ppid(int(entry.name)) == parent:
                found += [int(entry.name)] if _title(int(entry.name)) == title else []
        except (OSError, IndexError):
            continue
    return found


def test_a_host_whose_actors_fork_nothing_keeps_no_seed(host_factory) -> None:
    """With the harness actor's workers exec'd (``zygote = false``), no actor would ask the
    seed for a zygote: ``corral up`` stops it once it has read its config, and ``corral
    status`` shows none."""
    host = host_factory(FAST_LIVENESS + "[actors.harness.options]\nzygote = false\n").start()
    assert host.proc is not None
    pid = host.proc.pid
    assert host.status()["host"]["seed"] is None
    wait_until(lambda: not _children_titled(pid, "corral: seed"), 10, "the seed gone, reaped")
    host.stop()
