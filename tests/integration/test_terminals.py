"""Terminals against a real tmux: T-12 to T-16, the resource shape, cleanup, no shell."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from corral.tools._api import ToolContext, ToolError
from corral.tools.terminals import TOOLS, TerminalInstance, Terminals, parse_terminals
from tests._tool_context import tool_context
from tests.conftest import wait_for

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")

_TOOLS = {tool.name: tool for tool in TOOLS}
CONV = "conv_terminal_test"
SPEC: dict[str, Any] = {
    "terminals": {
        "zsh": {"command": "/bin/sh"},
        "cat": {"command": "cat"},
    }
}


class Published:
    """A ``ctx.publish`` that records what it is given."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    async def __call__(self, event: dict[str, Any]) -> None:
        self.events.append(event)


def make_ctx(
    tmp_path: Path,
    terminals: Terminals | None,
    *,
    published: Published | None = None,
    spec: dict[str, Any] | None = None,
    workspace: Path | None = None,
    session_id: str = CONV,
    max_output_chars: int = 100_000,
) -> ToolContext:
    return tool_context(
        tmp_path,
        session_id=session_id,
        spec=SPEC if spec is None else spec,
        workspace=workspace,
        publish=published if published is not None else Published(),
        terminals=terminals,
        max_output_chars=max_output_chars,
    )


async def call(ctx: ToolContext, name: str, **args: Any) -> dict[str, Any]:
    return json.loads(await _TOOLS[name].run(ctx, args))


def count_lookups(terminals: Terminals) -> list[tuple[str, str, str]]:
    """Record every :meth:`Terminals.lookup` (the instance lookup T-13..T-16 count)."""
    calls: list[tuple[str, str, str]] = []
    original = terminals.lookup

    async def counting(conversation_id: str, terminal: str, session: str) -> Any:
        calls.append((conversation_id, terminal, session))
        return await original(conversation_id, terminal, session)

    terminals.lookup = counting  # type: ignore[method-assign]
    return calls


def kill_servers(socket_dir: Path) -> None:
    """Safety net: no test leaves a tmux server behind, whatever it asserted."""
    if not socket_dir.exists():
        return
    for sock in socket_dir.glob("*.sock"):
        subprocess.run(["tmux", "-S", str(sock), "kill-server"], capture_output=True, timeout=10)


@pytest.fixture
async def terminals(tmp_path: Path) -> AsyncIterator[Terminals]:
    manager = Terminals(tmp_path / "terminals")
    try:
        yield manager
    finally:
        await manager.aclose()
        kill_servers(manager.socket_dir)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "project"
    path.mkdir()
    return path.resolve()


async def screen(terminals: Terminals, terminal: str = "zsh", session: str = "s1") -> str:
    return (await terminals.read(CONV, terminal, session))["output"]


# --- T-12 ------------------------------------------------------------------------------------


async def test_t12_terminal_runs_in_the_workspace(
    tmp_path: Path, terminals: Terminals, workspace: Path
) -> None:
    ctx = make_ctx(tmp_path, terminals, workspace=workspace)
    out = await call(ctx, "sys_terminal_launch", terminal="zsh", session="s1")
    assert out["status"] == "launched"
    assert out["cwd"] == str(workspace)
    await call(ctx, "sys_terminal_send", terminal="zsh", session="s1", text="pwd")

    async def pwd_shown() -> bool:
        return str(workspace) in (await screen(terminals)).splitlines()

    await wait_for(pwd_shown, "pwd output in the terminal")


async def test_t12_without_workspace_the_session_fallback_directory_is_used(
    tmp_path: Path, terminals: Terminals
) -> None:
    ctx = make_ctx(tmp_path, terminals, workspace=None, session_id="conv/no ws")
    out = await call(ctx, "sys_terminal_launch", terminal="zsh")
    expected = tmp_path / "fallback" / "conv_no_ws" / "workspace"
    assert out["cwd"] == str(expected)
    assert expected.is_dir()
    await terminals.close_all("conv/no ws")


async def test_t12_a_sandbox_the_runner_cannot_provide_is_refused(
    tmp_path: Path, terminals: Terminals, workspace: Path
) -> None:
    spec = {**SPEC, "os_env": {"sandbox": {"type": "darwin_seatbelt"}}}
    ctx = make_ctx(tmp_path, terminals, workspace=workspace, spec=spec)
    with pytest.raises(ToolError, match="sandbox"):
        await call(ctx, "sys_terminal_launch", terminal="zsh")
    assert await terminals.list_resources(CONV) == []


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
async def test_t12_a_sandboxed_spec_runs_its_terminal_in_the_sessions_sandbox(
    tmp_path: Path, terminals: Terminals, workspace: Path
) -> None:
    """The terminal's command runs in the bubblewrap sandbox its shells get (#16): its own
    pid namespace, nothing of the file system outside the workspace; tmux stays outside."""
    spec = {**SPEC, "os_env": {"sandbox": {"type": "linux_bwrap"}}}
    ctx = make_ctx(tmp_path, terminals, workspace=workspace, spec=spec)
    await call(ctx, "sys_terminal_launch", terminal="zsh", session="s1")
    outside = terminals.socket_dir
    text = f"ls /proc | grep -c '^[0-9]' > procs.txt; ls {outside} 2> seen.txt; echo > done"
    await call(ctx, "sys_terminal_send", terminal="zsh", session="s1", text=text)

    async def done() -> bool:
        return (workspace / "done").exists()

    await wait_for(done, "the sandboxed command to finish")
    assert int((workspace / "procs.txt").read_text()) < 10
    assert outside.is_dir()  # there, outside the sandbox
    assert "No such file" in (workspace / "seen.txt").read_text()


# --- T-13 / T-14 -----------------------------------------------------------------------------


async def test_t13_fresh_launch_publishes_resource_created(
    tmp_path: Path, terminals: Terminals, workspace: Path
) -> None:
    published = Published()
    lookups = count_lookups(terminals)
    ctx = make_ctx(tmp_path, terminals, published=published, workspace=workspace)

    out = await call(ctx, "sys_terminal_launch", terminal="zsh", session="s1")

    assert out["status"] == "launched"
    assert lookups == [(CONV, "zsh", "s1")]
    assert len(published.events) == 1, published.events
    event = published.events[0]
    assert event["type"] == "session.resource.created"
    resource = event["resource"]
    socket = resource["metadata"]["tmux_socket"]
    assert resource == {
        "id": "terminal_zsh_s1",
        "object": "session.resource",
        "type": "terminal",
        "session_id": CONV,
        "name": "zsh:s1",
        "metadata": {
            "terminal_name": "zsh",
            "session_key": "s1",
            "running": True,
            "tmux_socket": socket,
            "tmux_target": "s1",
            "terminal_transport": "control",
        },
        "environment": "env_terminal_zsh_s1",
    }
    assert stat.S_ISSOCK(os.stat(socket).st_mode)
    # The same shape the REST resource path lists (§ii.5).
    assert await terminals.list_resources(CONV) == [resource]
    # A client can attach with the socket and target it was given.
    probe = await trio.run_process(
        ["tmux", "-S", socket, "has-session", "-t", "=s1"], capture_stderr=True, check=False
    )
    assert probe.returncode == 0


async def test_t14_metadata_follows_the_live_running_state(
    tmp_path: Path, terminals: Terminals, workspace: Path
) -> None:
    ctx = make_ctx(tmp_path, terminals, workspace=workspace)
    await call(ctx, "sys_terminal_launch", terminal="zsh", session="s1")
    await call(ctx, "sys_terminal_send", terminal="zsh", session="s1", text="exit 3")

    async def stopped() -> bool:
        [view] = await terminals.list_resources(CONV)
        return view["metadata"]["running"] is False

    await wait_for(stopped, "running: false after the shell exited")
    read = await call(ctx, "sys_terminal_read", terminal="zsh", session="s1")
    assert read["running"] is False
    with pytest.raises(ToolError, match=r"has exited"):
        await call(ctx, "sys_terminal_send", terminal="zsh", session="s1", text="echo hi")
    # Launching an exited terminal starts it afresh (and announces it again).
    published = Published()
    ctx2 = make_ctx(tmp_path, terminals, published=published, workspace=workspace)
    again = await call(ctx2, "sys_terminal_launch", terminal="zsh", session="s1")
    assert again["status"] == "launched"
    assert [e["resource"]["metadata"]["running"] for e in published.events] == [True]
    await call(ctx2, "sys_terminal_send", terminal="zsh", session="s1", text="echo back-$((1+1))")

    async def answered() -> bool:
        return "back-2" in (await screen(terminals)).splitlines()

    await wait_for(answered, "the relaunched shell answering")
    assert "exit 3" not in await screen(terminals)  # a fresh screen, not the old one


async def test_t14_transport_is_the_spec_one_else_the_global_default(
    tmp_path: Path, terminals: Terminals, workspace: Path
) -> None:
    spec = {
        "terminals": [
            {"name": "zsh", "command": "/bin/sh"},
            {"name": "web", "command": "/bin/sh", "transport": "pty"},
        ]
    }
    published = Published()
    ctx = make_ctx(tmp_path, terminals, published=published, spec=spec, workspace=workspace)
    await call(ctx, "sys_terminal_launch", terminal="zsh")
    await call(ctx, "sys_terminal_launch", terminal="web")
    transports = [e["resource"]["metadata"]["terminal_transport"] for e in published.events]
    assert transports == ["control", "pty"]


async def test_t14_fresh_launch_starts_the_activity_watcher(
    tmp_path: Path, workspace: Path
) -> None:
    background: list[tuple[str, dict[str, Any]]] = []

    async def publish(session_id: str, event: dict[str, Any]) -> None:
        background.append((session_id, event))

    manager = Terminals(tmp_path / "watched", publish=publish, activity_poll_s=0.05)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(manager.run)
            ctx = make_ctx(tmp_path, manager, workspace=workspace)
            await call(ctx, "sys_terminal_launch", terminal="zsh", session="s1")
            await call(ctx, "sys_terminal_send", terminal="zsh", session="s1", text="echo hi")

            async def activity_seen() -> bool:
                return bool(background)

            await wait_for(activity_seen, "a session.terminal.activity event")
            nursery.cancel_scope.cancel()
        assert background[0] == (
            CONV,
            {
                "type": "session.terminal.activity",
                "session_id": CONV,
                "terminal_id": "terminal_zsh_s1",
            },
        )
    finally:
        await manager.aclose()
        kill_servers(manager.socket_dir)


# --- T-15 / T-16 -----------------------------------------------------------------------------


async def test_t15_idempotent_launch_publishes_nothing(
    tmp_path: Path, terminals: Terminals, workspace: Path
) -> None:
    ctx = make_ctx(tmp_path, terminals, workspace=workspace)
    first = await call(ctx, "sys_terminal_launch", terminal="zsh", session="s1")
    assert first["status"] == "launched"

    published = Published()
    lookups = count_lookups(terminals)
    ctx2 = make_ctx(tmp_path, terminals, published=published, workspace=workspace)
    second = await call(ctx2, "sys_terminal_launch", terminal="zsh", session="s1")

    assert second["status"] == "already_running"
    assert published.events == []
    assert lookups == []
    assert len(await terminals.list_resources(CONV)) == 1


async def test_t16_close_publishes_resource_deleted(
    tmp_path: Path, terminals: Terminals, workspace: Path
) -> None:
    ctx = make_ctx(tmp_path, terminals, workspace=workspace)
    launched = await call(ctx, "sys_terminal_launch", terminal="zsh", session="s1")
    assert launched["status"] == "launched"
    [view] = await terminals.list_resources(CONV)
    socket = Path(view["metadata"]["tmux_socket"])

    published = Published()
    lookups = count_lookups(terminals)
    ctx2 = make_ctx(tmp_path, terminals, published=published, workspace=workspace)
    out = await call(ctx2, "sys_terminal_close", terminal="zsh", session="s1")

    assert out["status"] == "closed"
    assert published.events == [
        {
            "type": "session.resource.deleted",
            "resource_id": "terminal_zsh_s1",
            "resource_type": "terminal",
            "session_id": CONV,
        }
    ]
    assert lookups == []
    assert await terminals.list_resources(CONV) == []
    assert not socket.exists()  # the last terminal took its server with it
    # Closing again is harmless and publishes nothing.
    again = await call(ctx2, "sys_terminal_close", terminal="zsh", session="s1")
    assert again["status"] == "not_running"
    assert len(published.events) == 1


async def test_t16_closing_one_of_two_sessions_keeps_the_other(
    tmp_path: Path, terminals: Terminals, workspace: Path
) -> None:
    ctx = make_ctx(tmp_path, terminals, workspace=workspace)
    await call(ctx, "sys_terminal_launch", terminal="zsh", session="a")
    await call(ctx, "sys_terminal_launch", terminal="zsh", session="b")
    await call(ctx, "sys_terminal_close", terminal="zsh", session="a")
    assert [v["id"] for v in await terminals.list_resources(CONV)] == ["terminal_zsh_b"]


# --- the spec's terminals block --------------------------------------------------------------


async def test_unknown_terminal_is_a_clear_tool_error(
    tmp_path: Path, terminals: Terminals, workspace: Path
) -> None:
    ctx = make_ctx(tmp_path, terminals, workspace=workspace)
    with pytest.raises(
        ToolError,
        match=r"^unknown terminal 'nope': this agent's spec declares these terminals: cat, zsh$",
    ):
        await call(ctx, "sys_terminal_launch", terminal="nope")
    bare = make_ctx(tmp_path, terminals, workspace=workspace, spec={})
    with pytest.raises(ToolError, match=r"declares these terminals: none$"):
        await call(bare, "sys_terminal_launch", terminal="zsh")
    with pytest.raises(ToolError, match=r"is not running; start it with sys_terminal_launch$"):
        await call(ctx, "sys_terminal_read", terminal="zsh", session="never")


def test_terminals_block_accepts_a_mapping_or_a_list() -> None:
    mapping = parse_terminals(
        {"zsh": {"command": "zsh", "args": ["-l"]}, "py": "python3 -q", "bash": None}
    )
    assert {name: d.argv for name, d in mapping.items()} == {
        "zsh": ("zsh", "-l"),
        "py": ("python3", "-q"),
        "bash": ("bash",),
    }
    listed = parse_terminals(
        ["bash", {"name": "tui", "command": ["vim", "-u", "NONE"], "env": {"A": "1"}, "cwd": "sub"}]
    )
    assert listed["bash"].argv == ("bash",)
    assert listed["tui"].argv == ("vim", "-u", "NONE")
    assert listed["tui"].env == (("A", "1"),)
    assert listed["tui"].cwd == "sub"
    assert parse_terminals(None) == {}


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ("zsh", r"terminals must be a list or a mapping$"),
        ([42], r"terminals\[0\] must be a command string or a mapping with 'name'$"),
        ([{"command": "sh"}], r"terminals\[0\] needs a name"),
        ({"a b": "sh"}, r"terminals\.a b needs a name"),
        ({"zsh": {"args": "-l"}}, r"terminals\.zsh\.args must be a list of strings$"),
        ({"zsh": {"command": ""}}, r"terminals\.zsh\.command is empty$"),
        ({"zsh": {"env": {"1X": "y"}}}, r"terminals\.zsh\.env must map variable names"),
        (["zsh", {"name": "zsh"}], r"terminals\[1\] declares terminal 'zsh' a second time$"),
    ],
)
def test_terminals_block_errors_name_the_entry(block: Any, message: str) -> None:
    with pytest.raises(ToolError, match=r"^invalid terminals block in the agent spec: " + message):
        parse_terminals(block)


# --- no shell --------------------------------------------------------------------------------


async def test_spec_and_model_strings_never_reach_a_shell(
    tmp_path: Path, terminals: Terminals, workspace: Path
) -> None:
    spec = {
        "terminals": {
            "echo": {"command": "printf", "args": ["<%s>\\n", "$(touch pwned_spec)"]},
            "cat": {"command": "cat"},
        }
    }
    ctx = make_ctx(tmp_path, terminals, workspace=workspace, spec=spec)
    await call(ctx, "sys_terminal_launch", terminal="echo")

    async def printed() -> bool:
        # The argument arrives as one literal argv element: printf shows it unexpanded.
        return "<$(touch pwned_spec)>" in await screen(terminals, "echo", "main")

    await wait_for(printed, "printf output")
    await call(ctx, "sys_terminal_launch", terminal="cat")
    text = "$(touch pwned_model); `touch pwned_tick`"
    await call(ctx, "sys_terminal_send", terminal="cat", text=text)

    async def echoed() -> bool:
        return text in await screen(terminals, "cat", "main")

    await wait_for(echoed, "cat echoing the text")
    assert sorted(p.name for p in workspace.iterdir()) == []
    with pytest.raises(ToolError, match=r"^session 'a;b' must be"):
        await call(ctx, "sys_terminal_launch", terminal="cat", session="a;b")
    with pytest.raises(ToolError, match=r"is not a key name"):
        await call(ctx, "sys_terminal_send", terminal="cat", keys=["-X"])


async def test_keys_are_pressed_by_name(
    tmp_path: Path, terminals: Terminals, workspace: Path
) -> None:
    ctx = make_ctx(tmp_path, terminals, workspace=workspace)
    await call(ctx, "sys_terminal_launch", terminal="zsh", session="s1")
    await call(ctx, "sys_terminal_send", terminal="zsh", session="s1", text="sleep 600")

    [view] = await terminals.list_resources(CONV)
    socket = view["metadata"]["tmux_socket"]

    async def sleeping() -> bool:
        # The foreground process of the pane, as tmux sees it: C-c must reach sleep, not
        # the shell still reading its line.
        probe = await trio.run_process(
            [
                "tmux",
                "-S",
                socket,
                "display-message",
                "-p",
                "-t",
                "=s1:",
                "#{pane_current_command}",
            ],
            capture_stdout=True,
        )
        return probe.stdout.decode().strip() == "sleep"

    await wait_for(sleeping, "sleep to be running in the terminal")
    await call(ctx, "sys_terminal_send", terminal="zsh", session="s1", keys=["C-c"])
    await call(ctx, "sys_terminal_send", terminal="zsh", session="s1", text="echo after-$((6*7))")

    async def interrupted() -> bool:
        return "after-42" in (await screen(terminals)).splitlines()

    await wait_for(interrupted, "the shell answering after C-c")


async def test_read_is_capped_and_keeps_the_newest_text(
    tmp_path: Path, terminals: Terminals, workspace: Path
) -> None:
    ctx = make_ctx(tmp_path, terminals, workspace=workspace, max_output_chars=40)
    await call(ctx, "sys_terminal_launch", terminal="zsh", session="s1")
    await call(ctx, "sys_terminal_send", terminal="zsh", session="s1", text="seq 1 300")

    async def done() -> bool:
        return "300" in (await screen(terminals)).splitlines()

    await wait_for(done, "seq output")
    read = await call(ctx, "sys_terminal_read", terminal="zsh", session="s1", lines=100)
    head, _, tail = read["output"].partition("\n")
    assert head.startswith("...[truncated ") and head.endswith(" chars]")
    assert len(tail) == 40
    assert "300" in tail.splitlines()


async def test_list_shows_declared_and_running_terminals(
    tmp_path: Path, terminals: Terminals, workspace: Path
) -> None:
    ctx = make_ctx(tmp_path, terminals, workspace=workspace)
    await call(ctx, "sys_terminal_launch", terminal="zsh", session="s1")
    listed = await call(ctx, "sys_terminal_list")
    assert listed == {
        "terminals": [
            {
                "terminal": "zsh",
                "command": ["/bin/sh"],
                "declared": True,
                "sessions": [{"session": "s1", "running": True, "resource_id": "terminal_zsh_s1"}],
            },
            {"terminal": "cat", "command": ["cat"], "declared": True, "sessions": []},
        ]
    }


# --- per conversation, close_all, stale servers, socket paths --------------------------------


async def test_conversations_are_isolated_and_close_all_closes_one(
    tmp_path: Path, terminals: Terminals, workspace: Path
) -> None:
    a = make_ctx(tmp_path, terminals, workspace=workspace, session_id="conv_a")
    b = make_ctx(tmp_path, terminals, workspace=workspace, session_id="conv_b")
    await call(a, "sys_terminal_launch", terminal="zsh", session="s1")
    await call(a, "sys_terminal_launch", terminal="cat", session="s1")
    await call(b, "sys_terminal_launch", terminal="zsh", session="s1")
    [b_view] = await terminals.list_resources("conv_b")
    a_sockets = {v["metadata"]["tmux_socket"] for v in await terminals.list_resources("conv_a")}
    assert b_view["metadata"]["tmux_socket"] not in a_sockets

    events = await terminals.close_all("conv_a")

    assert sorted(e["resource_id"] for e in events) == ["terminal_cat_s1", "terminal_zsh_s1"]
    assert all(e["session_id"] == "conv_a" for e in events)
    assert await terminals.list_resources("conv_a") == []
    assert await terminals.list_resources("conv_b") == [b_view]
    assert not any(Path(s).exists() for s in a_sockets)


def _server_pid(socket: str) -> int:
    out = subprocess.run(
        ["tmux", "-S", socket, "display-message", "-p", "#{pid}"],
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    )
    return int(out.stdout)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie the test runner has not reaped counts as gone.
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return False


async def test_stale_servers_of_a_crashed_incarnation_are_killed_at_start(
    tmp_path: Path, workspace: Path
) -> None:
    base = tmp_path / "terminals"
    crashed = Terminals(base)
    try:
        ctx = make_ctx(tmp_path, crashed, workspace=workspace)
        await call(ctx, "sys_terminal_launch", terminal="zsh", session="s1")
        [view] = await crashed.list_resources(CONV)
        socket = view["metadata"]["tmux_socket"]
        pid = _server_pid(socket)
        # The "crash": the manager is dropped without aclose(); a new one starts over the
        # same directory.
        published: list[tuple[str, dict[str, Any]]] = []

        async def publish(session_id: str, event: dict[str, Any]) -> None:
            published.append((session_id, event))

        restarted = Terminals(base, publish=publish)
        events = await restarted.start()

        expected = (
            CONV,
            {
                "type": "session.resource.deleted",
                "resource_id": "terminal_zsh_s1",
                "resource_type": "terminal",
                "session_id": CONV,
            },
        )
        assert events == [expected]
        assert published == [expected]
        assert not Path(socket).exists()

        async def gone() -> bool:
            return not _alive(pid)

        await wait_for(gone, "the stale tmux server to exit")
        assert await restarted.start() == []  # once only
    finally:
        kill_servers(crashed.socket_dir)


async def test_long_base_dir_puts_sockets_in_a_private_tmp_dir(
    tmp_path: Path, workspace: Path
) -> None:
    base = tmp_path / ("d" * 60) / ("e" * 60) / "terminals"
    manager = Terminals(base)
    try:
        assert manager.socket_dir.parent == Path("/tmp")
        assert not manager.socket_dir.exists()  # made on first launch only
        assert Terminals(base).socket_dir == manager.socket_dir  # found again after a restart
        ctx = make_ctx(tmp_path, manager, workspace=workspace)
        await call(ctx, "sys_terminal_launch", terminal="zsh")
        assert stat.S_IMODE(os.stat(manager.socket_dir).st_mode) == 0o700
        [view] = await manager.list_resources(CONV)
        assert len(view["metadata"]["tmux_socket"]) <= 100
        assert Path(view["metadata"]["tmux_socket"]).parent == manager.socket_dir
        await manager.aclose()
        assert not manager.socket_dir.exists()  # nothing left in /tmp
    finally:
        await manager.aclose()
        kill_servers(manager.socket_dir)
        shutil.rmtree(manager.socket_dir, ignore_errors=True)


async def test_tools_need_a_terminals_manager(tmp_path: Path, workspace: Path) -> None:
    ctx = make_ctx(tmp_path, None, workspace=workspace)
    with pytest.raises(ToolError, match=r"^terminals are not available in this runner$"):
        await call(ctx, "sys_terminal_list")


async def test_lookup_reports_the_instance(
    tmp_path: Path, terminals: Terminals, workspace: Path
) -> None:
    ctx = make_ctx(tmp_path, terminals, workspace=workspace)
    await call(ctx, "sys_terminal_launch", terminal="zsh", session="s1")
    instance = await terminals.lookup(CONV, "zsh", "s1")
    assert isinstance(instance, TerminalInstance)
    assert (instance.terminal, instance.session, instance.running) == ("zsh", "s1", True)
    assert await terminals.lookup(CONV, "zsh", "other") is None


async def test_a_tmp_socket_dir_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    base = tmp_path / ("d" * 60) / ("e" * 60) / "terminals"
    manager = Terminals(base)
    socket_dir = manager.socket_dir
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    try:
        socket_dir.symlink_to(elsewhere)  # someone else's trap in /tmp
        with pytest.raises(PermissionError, match=r"is not a directory owned by this user$"):
            await manager.start()
        ctx = make_ctx(tmp_path, manager, workspace=tmp_path)
        with pytest.raises(PermissionError, match=r"is not a directory owned by this user$"):
            await call(ctx, "sys_terminal_launch", terminal="zsh")
        assert list(elsewhere.iterdir()) == []
    finally:
        if socket_dir.is_symlink():
            socket_dir.unlink()
        shutil.rmtree(socket_dir, ignore_errors=True)
