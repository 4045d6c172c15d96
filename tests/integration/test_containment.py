"""What a model's shell can reach of the host (issue #16, items 3 and 4), through real hosts.

A host whose environment holds fake secrets (provider keys, cloud credentials, the runner
token) and a ``[[runners]]`` entry with a tunnel token runs scripted agents whose
``sys_os_shell`` calls go looking: ``env``, ``/proc/$PPID/environ``, ``/proc/1/environ``,
the host's environ by pid, every process's environ, the state dir and ``~/.ssh``. Without a
sandbox no secret is in any output, event, log or file of the state dir; in a sandbox
(bubblewrap) nothing outside the workspace is there either, the network is off, nothing can
be written outside the workspace, and what the command started in the background is gone
with it. A host without bubblewrap fails a sandboxed turn with the reason.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.conftest import FAST_LIVENESS, HostProcess, wait_until
from tests.fake_openai import FakeOpenAI, Reply, responses_events
from tests.fake_server import FakeOmnigentServer
from tests.integration._gateway import FakeGateway, fake_gateway

HOST_ACTORS = frozenset({"harness", "tools", "policy", "dispatch", "gateway"})

OPENAI_KEY = "sk-test-" + secrets.token_hex(12)
SECRETS = {
    "OPENAI_API_KEY": OPENAI_KEY,
    "ANTHROPIC_API_KEY": "sk-ant-test-" + secrets.token_hex(12),
    "AWS_SECRET_ACCESS_KEY": "aws-test-" + secrets.token_hex(12),
    "CORRAL_RUNNER_TOKEN": "runner-test-" + secrets.token_hex(12),
}
TUNNEL_TOKEN = "tunnel-test-" + secrets.token_hex(12)
EVERY_SECRET = [*SECRETS.values(), TUNNEL_TOKEN]

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap missing")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(server: FakeOmnigentServer) -> str:
    url = json.dumps(server.base_url)
    return (
        FAST_LIVENESS
        + f'[actors.dispatch.options]\nserver_url = {url}\nsubscribers = ["test-gateway"]\n'
        + f"[actors.policy.options]\nserver_url = {url}\n"
        # A runner whose tunnel token the gateway, dispatch and policy hold (its server is
        # not there: the gateway keeps retrying, which is all this needs of it).
        + f'[[runners]]\nserver = "http://127.0.0.1:{_closed_port()}"\nid = "runner-a"\n'
        + f'token = "{TUNNEL_TOKEN}"\n'
    )


def _start(factory: Any, server: FakeOmnigentServer, **env: str) -> HostProcess:
    with pytest.MonkeyPatch.context() as patch:
        for name, value in {**SECRETS, **env}.items():
            patch.setenv(name, value)
        return factory(_config(server)).start()


@pytest.fixture(scope="module")
def chost(module_host_factory, module_server: FakeOmnigentServer) -> Iterator[HostProcess]:
    h = _start(module_host_factory, module_server)
    yield h
    if h.proc is not None and h.proc.poll() is None:
        h.stop()


def _agent(server: FakeOmnigentServer, cwd: Path, commands: list[str], sandbox: str) -> str:
    lines = [
        "name: prober",
        "executor:",
        "  harness: scripted",
        "  model: scripted-model",
        "  auth: {type: api_key, api_key: $OPENAI_API_KEY, base_url: 'http://127.0.0.1:9/v1'}",
        "  script:",
        "    turns:",
        "      -",
    ]
    lines += [
        "        - " + json.dumps({"tool": "sys_os_shell", "arguments": {"command": c}})
        for c in commands
    ]
    lines.append(f"os_env: {{type: caller_process, cwd: {json.dumps(str(cwd))}, {sandbox}}}")
    return server.add_agent("\n".join(lines) + "\n")


async def _run(
    host: HostProcess, server: FakeOmnigentServer, cwd: Path, commands: list[str], sandbox: str
) -> tuple[FakeGateway, str, list[dict[str, Any]]]:
    agent_id = _agent(server, cwd, commands, sandbox)
    sid = server.add_session(agent_id)["id"]
    async with fake_gateway(host.endpoint) as gw:
        await gw.init(sid, agent_id)
        await gw.message(sid, "look around")
        await gw.until_status(sid, timeout=60)
    results = [
        json.loads(e["item"]["output"])
        for e in gw.events.get(sid, [])
        if e["type"] == "response.output_item.done" and e["item"]["type"] == "function_call_output"
    ]
    return gw, sid, results


def _probes(host: HostProcess) -> list[str]:
    pid = host.proc.pid if host.proc else 0
    return [
        "env",
        "tr '\\0' '\\n' < /proc/$PPID/environ",
        "tr '\\0' '\\n' < /proc/1/environ",
        f"tr '\\0' '\\n' < /proc/{pid}/environ",
        # Every process the shell can see, its parents' parents included.
        "for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f; done 2>/dev/null; true",
        f"ls -la {host.state_dir} {host.state_dir}/*",
        "ls -la ~/.ssh && cat ~/.ssh/* ; true",
    ]


def _no_secret_anywhere(host: HostProcess, gw: FakeGateway, sid: str) -> None:
    stream = json.dumps(gw.events.get(sid, []))
    found = [s for s in EVERY_SECRET if s in stream]
    assert found == [], "a secret reached the session's stream"
    for path in [host.log_path, *host.state_dir.rglob("*")]:
        if path.is_file():
            data = path.read_bytes()
            assert not [s for s in EVERY_SECRET if s.encode() in data], f"a secret in {path}"


async def test_a_shell_finds_no_secret_in_any_environ_without_a_sandbox(
    chost: HostProcess, module_server: FakeOmnigentServer, tmp_path: Path
) -> None:
    gw, sid, results = await _run(chost, module_server, tmp_path, _probes(chost), "")
    env, parent, _init, host, every, state, _ssh = results
    assert all(r["exit_code"] == 0 for r in (env, parent, host, every, state)), results
    # Real reads: the parent is the tools actor, the host's environ was there to read.
    assert "CORRAL_STATE_DIR=" in parent["stdout"] and "PATH=" in host["stdout"]
    assert len(every["stdout"].splitlines()) > 20
    _no_secret_anywhere(chost, gw, sid)
    # The worker still got its key, though no environ block showed it: the harness actor
    # expanded $OPENAI_API_KEY from what the host handed it hidden.
    assert gw.statuses(sid)[-1] == "idle"


def test_the_host_hands_each_actor_only_what_it_needs(chost: HostProcess) -> None:
    """The environ block of every process of the host (read from outside, as root could),
    and ``corral status``."""
    status = json.dumps(chost.ask("status"))
    assert "runner-a" in status and not [s for s in EVERY_SECRET if s in status]
    for actor in sorted(HOST_ACTORS):
        seen = json.dumps(chost.ask("inspect", actor=actor))
        assert not [s for s in EVERY_SECRET if s in seen], actor
    pids = [a["pid"] for a in chost.ask("status")["actors"]] + [chost.proc.pid]  # type: ignore[union-attr]
    for pid in pids:
        block = Path(f"/proc/{pid}/environ").read_bytes()
        assert not [s for s in EVERY_SECRET if s.encode() in block], pid
        assert b"CORRAL_CHILD=" not in block
        # The hand-over memfd is closed once read.
        fds = [os.readlink(p) for p in Path(f"/proc/{pid}/fd").iterdir()]
        assert not [f for f in fds if "corral-hidden-env" in f], pid


@needs_bwrap
async def test_a_sandboxed_shell_sees_only_its_workspace(
    chost: HostProcess, module_server: FakeOmnigentServer, tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "mine.txt").write_text("in the workspace\n")
    outside = tmp_path / "outside.txt"
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        commands = [
            *_probes(chost),
            "ls /proc | grep -c '^[0-9]' ; cat /proc/1/cmdline | tr '\\0' ' '",
            f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected",
            # /tmp is the sandbox's own (a tmpfs): a write there never reaches the host's.
            f"echo x > {outside}; echo x > /etc/corral-escape",
            "echo y > inside.txt && cat mine.txt",
            # Background work, even out of the shell's process group, ends with the call.
            "sleep 7919 & setsid sleep 7919 & echo started",
            # What not everyone may read is masked, even for a host run as root.
            "cat /etc/shadow /etc/gshadow | wc -c",
        ]
        gw, sid, results = await _run(
            chost, module_server, workspace, commands, "sandbox: {type: linux_bwrap}"
        )
        with pytest.raises(BlockingIOError):
            listener.accept()
    *_reads, host, _every, state, ssh, procs, net, write, inside, background, shadow = results
    assert gw.statuses(sid)[-1] == "idle"
    _no_secret_anywhere(chost, gw, sid)
    # Its own pid namespace: the host is not there to read, the parent is bwrap's init.
    assert host["exit_code"] != 0 and "No such file" in host["stderr"]
    assert int(procs["stdout"].split()[0]) < 10 and "bwrap" in procs["stdout"]
    assert state["exit_code"] != 0 and str(chost.state_dir) not in state["stdout"]
    assert "No such file" in ssh["stderr"] or ssh["stdout"].strip() == ""
    assert net["exit_code"] != 0 and "connected" not in net["stdout"]
    assert "Read-only file system" in write["stderr"], write
    assert not outside.exists() and not Path("/etc/corral-escape").exists()
    assert inside["stdout"] == "in the workspace\n"
    assert (workspace / "inside.txt").read_text() == "y\n"
    assert background["stdout"] == "started\n"
    assert shadow["stdout"].strip() == "0", shadow

    def sleepers() -> list[str]:
        found = []
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and b"7919" in (entry / "cmdline").read_bytes():
                    found.append(entry.name)
            except OSError:
                continue
        return found

    # Gone within moments of the call, not at its end to the instant: bwrap's outer process
    # exits once the command has, and the sandbox's init (whose command line holds the
    # command) then dies of its parent's death signal, taking the namespace with it — a
    # kernel step that a loaded machine may run after the call's answer (a CI-like run saw
    # one still there). Without the sandbox they would run for 7919 s.
    await trio.to_thread.run_sync(
        lambda: wait_until(lambda: sleepers() == [], 10, "the sandbox's processes gone")
    )


@needs_bwrap
async def test_a_sandbox_that_allows_the_network_reaches_it(
    chost: HostProcess, module_server: FakeOmnigentServer, tmp_path: Path
) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        command = f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected"
        _, _, (net,) = await _run(
            chost,
            module_server,
            tmp_path,
            [command],
            "sandbox: {type: linux_bwrap, allow_network: true}",
        )
    assert net["stdout"] == "connected\n"


@pytest.mark.fresh_host  # its own host: one whose PATH has no bubblewrap
async def test_without_bubblewrap_a_sandboxed_turn_fails_with_the_reason(
    host_factory, module_server: FakeOmnigentServer, tmp_path: Path
) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    h = _start(host_factory, module_server, PATH=str(empty))
    marker = tmp_path / "ran.txt"
    agent_id = _agent(
        module_server, tmp_path, [f"echo ran > {marker}"], "sandbox: {type: linux_bwrap}"
    )
    sid = module_server.add_session(agent_id)["id"]
    async with fake_gateway(h.endpoint) as gw:
        await gw.init(sid, agent_id)
        await gw.message(sid, "go")
        assert await gw.until_status(sid, timeout=60) == ["running", "failed"]
        edge = gw.events[sid][-1]
    assert "bubblewrap" in edge["error"]["message"], edge
    assert not marker.exists()


async def test_a_worker_gets_its_expanded_key_outside_its_environ(
    chost: HostProcess, module_server: FakeOmnigentServer, nursery: trio.Nursery
) -> None:
    provider = FakeOpenAI()
    await provider.start(nursery)
    provider.queue(Reply(frames=responses_events("served-x", ["fine"])))
    agent_id = module_server.add_agent(
        "name: keyed\nexecutor:\n  harness: openai-agents\n  model: fake-model\n"
        f"  auth: {{type: api_key, api_key: $OPENAI_API_KEY, base_url: '{provider.base_url}'}}\n"
    )
    sid = module_server.add_session(agent_id)["id"]
    async with fake_gateway(chost.endpoint) as gw:
        await gw.init(sid, agent_id)
        await gw.message(sid, "hi")
        assert await gw.until_status(sid, timeout=60) == ["running", "idle"]
    (request,) = provider.requests
    assert request.headers["authorization"] == f"Bearer {OPENAI_KEY}"
    (worker,) = [w for w in chost.ask("status")["workers"] if w["session_id"] == sid]
    assert OPENAI_KEY.encode() not in Path(f"/proc/{worker['pid']}/environ").read_bytes()


@needs_bwrap
async def test_an_async_shell_call_runs_in_the_same_sandbox(
    chost: HostProcess, module_server: FakeOmnigentServer, tmp_path: Path
) -> None:
    command = f"ls /proc | grep -c '^[0-9]'; ls {chost.state_dir}; echo async-done"
    call = {"tool": "sys_call_async", "arguments": {"tool": "sys_os_shell", "args": {}}}
    call["arguments"]["args"] = {"command": command}  # type: ignore[index]
    agent_id = module_server.add_agent(
        "name: background\nexecutor:\n  harness: scripted\n  script:\n    turns:\n"
        f"      - [{json.dumps(call)}]\n"
        f"      - [{json.dumps({'tool': 'sys_read_inbox', 'arguments': {}})}]\n"
        f"os_env: {{cwd: {json.dumps(str(tmp_path))}, sandbox: {{type: linux_bwrap}}}}\n"
    )
    sid = module_server.add_session(agent_id)["id"]
    inbox = chost.instance.actor_dir("tools") / "inbox"
    async with fake_gateway(chost.endpoint) as gw:
        await gw.init(sid, agent_id)
        await gw.message(sid, "start it")
        assert await gw.until_status(sid, timeout=30) == ["running", "idle"]
        await trio.to_thread.run_sync(
            lambda: wait_until(
                lambda: any(
                    b"async-done" in p.read_bytes() for p in inbox.rglob("*") if p.is_file()
                ),
                timeout=20,
                what="the async result in the inbox",
            )
        )
        await gw.message(sid, "read it")
        assert await gw.until_status(sid, count=2, timeout=30) == ["running", "idle"] * 2
    text = [
        e["item"]["output"]
        for e in gw.events[sid]
        if e["type"] == "response.output_item.done" and e["item"]["type"] == "function_call_output"
    ][1]
    result = json.loads(text.split("sys_os_shell returned: ", 1)[1].rsplit("]", 1)[0])
    assert int(result["stdout"].split()[0]) < 10 and "No such file" in result["stderr"], result
