"""The OS tools against real files and real processes: T-01 to T-05, containment, limits."""

from __future__ import annotations

import json
import os
import signal
import stat
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import trio

from corral.tools import os_files
from corral.tools import shell as shell_runs
from corral.tools._api import ToolContext, ToolError
from corral.tools.os_tools import TOOLS
from tests._tool_context import tool_context

_TOOLS = {tool.name: tool for tool in TOOLS}


def make_ctx(
    tmp_path: Path,
    *,
    spec: dict[str, Any] | None = None,
    workspace: Path | None = None,
    session_id: str = "conv_runner_os_env_test",
    timeout_s: float = 60.0,
    max_output_chars: int = 100_000,
) -> ToolContext:
    return tool_context(
        tmp_path,
        session_id=session_id,
        spec=spec if spec is not None else {},
        workspace=workspace,
        timeout_s=timeout_s,
        max_output_chars=max_output_chars,
    )


async def call(ctx: ToolContext, name: str, **args: Any) -> dict[str, Any]:
    return json.loads(await _TOOLS[name].run(ctx, args))


def spec_at(cwd: Path) -> dict[str, Any]:
    return {"os_env": {"type": "caller_process", "cwd": str(cwd), "sandbox": {"type": "none"}}}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    return work


@pytest.fixture
def ctx(tmp_path: Path, root: Path) -> ToolContext:
    return make_ctx(tmp_path, spec=spec_at(root))


def _gone(pid: int) -> bool:
    """Whether ``pid`` no longer runs (a zombie waiting for its reaper counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return all(
        _gone(int(p.name))
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and _pgid_of(int(p.name)) == pgid
    )


def _pgid_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[2])
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return None


# -- T-01 to T-05: the four tools in the spec's cwd -----------------------------------------


async def test_t01_t02_t03_t04_tools_use_agent_spec_cwd(ctx: ToolContext, root: Path) -> None:
    write = await call(ctx, "sys_os_write", path="note.txt", content="hello\nplanet\n")
    assert write["created"] is True
    assert root.joinpath("note.txt").read_text() == "hello\nplanet\n"
    edit = await call(ctx, "sys_os_edit", path="note.txt", oldText="planet", newText="world")
    assert edit["replacements"] == 1
    read = await call(ctx, "sys_os_read", path="note.txt")
    assert read["content"] == "hello\nworld\n"
    assert read["truncated"] is False
    shell = await call(ctx, "sys_os_shell", command="pwd")
    assert shell["exit_code"] == 0
    assert Path(shell["stdout"].strip()).resolve() == root.resolve()
    assert list(shell) == ["stdout", "stderr", "exit_code", "timed_out", "shell", "cwd"]
    assert shell["timed_out"] is False and shell["stderr"] == ""
    assert shell["cwd"] == str(root)
    assert Path(shell["shell"]).name == "bash"


async def test_t01_overwrite_reports_not_created_and_keeps_mode(
    ctx: ToolContext, root: Path
) -> None:
    target = root / "run.sh"
    target.write_text("old")
    target.chmod(0o750)
    out = await call(ctx, "sys_os_write", path="run.sh", content="new")
    assert out == {"path": "run.sh", "created": False, "bytes_written": 3}
    assert target.read_text() == "new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o750
    assert [p.name for p in root.iterdir()] == ["run.sh"]  # no temporary file left behind


async def test_t01_write_creates_parent_dirs_and_exact_text(ctx: ToolContext, root: Path) -> None:
    text = "caf\u00e9\r\nline2\n\n"
    out = await call(ctx, "sys_os_write", path="a/b/c.txt", content=text)
    assert out["created"] is True
    assert root.joinpath("a/b/c.txt").read_bytes() == text.encode()


async def test_t01_write_refuses_a_directory(ctx: ToolContext, root: Path) -> None:
    (root / "d").mkdir()
    with pytest.raises(ToolError, match="is a directory"):
        await call(ctx, "sys_os_write", path="d", content="x")
    with pytest.raises(ToolError, match="is a directory"):
        await call(ctx, "sys_os_write", path=".", content="x")


async def test_t08_placeholder_cwd_writes_into_workspace(tmp_path: Path) -> None:
    workspace = tmp_path / "project"
    workspace.mkdir()
    spec = {"os_env": {"type": "caller_process", "cwd": ".", "sandbox": {"type": "none"}}}
    ctx = make_ctx(tmp_path, spec=spec, workspace=workspace)
    out = await call(ctx, "sys_os_write", path="created.txt", content="from workspace")
    assert out["created"] is True
    assert workspace.joinpath("created.txt").read_text() == "from workspace"
    assert not (tmp_path / "fallback").exists()


async def test_t10_tools_default_to_conversation_workspace(tmp_path: Path) -> None:
    spec = {"os_env": {"type": "caller_process", "sandbox": {"type": "none"}}}
    ctx = make_ctx(tmp_path, spec=spec, session_id="conv/default workspace")
    out = await call(ctx, "sys_os_write", path="created.txt", content="hi")
    assert out["created"] is True
    made = tmp_path / "fallback" / "conv_default_workspace" / "workspace" / "created.txt"
    assert made.read_text() == "hi"
    shell = await call(ctx, "sys_os_shell", command="cat created.txt")
    assert shell["stdout"] == "hi"


async def test_t05_unsupported_sandbox_runs_nothing(tmp_path: Path, root: Path) -> None:
    spec = {
        "os_env": {
            "type": "caller_process",
            "cwd": str(root),
            "sandbox": {"type": "darwin_seatbelt"},
        }
    }
    ctx = make_ctx(tmp_path, spec=spec)
    with pytest.raises(ToolError, match="darwin_seatbelt"):
        await call(ctx, "sys_os_write", path="x.txt", content="x")
    with pytest.raises(ToolError, match="darwin_seatbelt"):
        await call(ctx, "sys_os_shell", command="touch y.txt")
    assert list(root.iterdir()) == []


def test_t20_file_mutating_tools_are_flagged() -> None:
    assert {t.name for t in TOOLS if t.mutates_files} == {
        "sys_os_write",
        "sys_os_edit",
        "sys_os_shell",
    }
    assert all(t.family == "os" for t in TOOLS)


# -- T-02 edit ------------------------------------------------------------------------------


async def test_t02_edit_not_found_leaves_file_alone(ctx: ToolContext, root: Path) -> None:
    (root / "f.txt").write_text("alpha\n")
    with pytest.raises(ToolError, match=r"^oldText not found in 'f.txt'"):
        await call(ctx, "sys_os_edit", path="f.txt", oldText="beta", newText="x")
    assert (root / "f.txt").read_text() == "alpha\n"


async def test_t02_edit_ambiguous_needs_replace_all(ctx: ToolContext, root: Path) -> None:
    (root / "f.txt").write_text("a-a-a")
    with pytest.raises(ToolError, match="occurs 3 times"):
        await call(ctx, "sys_os_edit", path="f.txt", oldText="a", newText="b")
    assert (root / "f.txt").read_text() == "a-a-a"
    out = await call(ctx, "sys_os_edit", path="f.txt", oldText="a", newText="b", replace_all=True)
    assert out["replacements"] == 3
    assert (root / "f.txt").read_text() == "b-b-b"


async def test_t02_edit_keeps_bytes_that_are_not_utf8(ctx: ToolContext, root: Path) -> None:
    (root / "latin.txt").write_bytes(b"caf\xe9 = 1\nname = old\n")
    out = await call(ctx, "sys_os_edit", path="latin.txt", oldText="old", newText="new")
    assert out["replacements"] == 1
    assert (root / "latin.txt").read_bytes() == b"caf\xe9 = 1\nname = new\n"


async def test_t02_edit_accepts_old_string_aliases_and_empty_replacement(
    ctx: ToolContext, root: Path
) -> None:
    (root / "f.txt").write_text("keep DROP keep")
    await call(ctx, "sys_os_edit", path="f.txt", old_string=" DROP", new_string="")
    assert (root / "f.txt").read_text() == "keep keep"


async def test_t02_edit_rejects_empty_old_text(ctx: ToolContext, root: Path) -> None:
    (root / "f.txt").write_text("x")
    with pytest.raises(ToolError, match="oldText must be a non-empty string"):
        await call(ctx, "sys_os_edit", path="f.txt", oldText="", newText="y")


# -- T-03 read ------------------------------------------------------------------------------


async def test_t03_read_answers_omnigents_shape(ctx: ToolContext, root: Path) -> None:
    """§G.6: the absolute path, the window (1-based offset, 2000 lines by default) and the
    line counts, in omnigent's field order."""
    (root / "note.txt").write_text("hello\nworld\n")
    out = await call(ctx, "sys_os_read", path="note.txt")
    assert out == {
        "path": str((root / "note.txt").resolve()),
        "content": "hello\nworld\n",
        "encoding": "utf-8",
        "offset": 1,
        "limit": 2000,
        "returned_lines": 2,
        "total_lines": 2,
        "truncated": False,
    }
    (root / "no_newline.txt").write_text("a\nb")
    out = await call(ctx, "sys_os_read", path="no_newline.txt")
    assert (out["returned_lines"], out["total_lines"]) == (2, 2)
    (root / "empty.txt").write_text("")
    out = await call(ctx, "sys_os_read", path="empty.txt")
    assert (out["content"], out["returned_lines"], out["total_lines"]) == ("", 0, 0)


async def test_t03_default_limit_is_2000_lines(ctx: ToolContext, root: Path) -> None:
    (root / "long.txt").write_text("".join(f"{i}\n" for i in range(1, 2501)))
    out = await call(ctx, "sys_os_read", path="long.txt")
    assert out["content"].splitlines()[-1] == "2000"
    assert (out["returned_lines"], out["total_lines"], out["next_offset"]) == (2000, 2500, 2001)
    # A window the limit ends is not "truncated": nothing was cut, the rest is a page away.
    assert out["truncated"] is False


async def test_t03_read_pages_by_lines(ctx: ToolContext, root: Path) -> None:
    (root / "lines.txt").write_text("".join(f"line{i}\n" for i in range(1, 11)))
    out = await call(ctx, "sys_os_read", path="lines.txt", offset=3, limit=2)
    assert out["content"] == "line3\nline4\n"
    assert out["truncated"] is False and out["next_offset"] == 5
    assert (out["offset"], out["limit"], out["returned_lines"], out["total_lines"]) == (3, 2, 2, 10)
    tail = await call(ctx, "sys_os_read", path="lines.txt", offset=9, limit=5)
    assert tail["content"] == "line9\nline10\n"
    assert tail["truncated"] is False and "next_offset" not in tail
    assert (tail["returned_lines"], tail["total_lines"]) == (2, 10)
    exact = await call(ctx, "sys_os_read", path="lines.txt", offset=9, limit=2)
    assert exact["truncated"] is False and "next_offset" not in exact
    past = await call(ctx, "sys_os_read", path="lines.txt", offset=50)
    assert (past["content"], past["returned_lines"], past["total_lines"]) == ("", 0, 10)


async def test_t03_large_file_is_capped(tmp_path: Path, root: Path) -> None:
    ctx = make_ctx(tmp_path, spec=spec_at(root), max_output_chars=1000)
    (root / "big.txt").write_text("x" * 600 + "\n" + "y" * 5_000_000 + "\n" + "z\n")
    out = await call(ctx, "sys_os_read", path="big.txt")
    assert len(out["content"]) == 1000
    assert out["content"] == "x" * 600 + "\n" + "y" * 399
    assert out["truncated"] is True and out["next_offset"] == 2
    assert (out["returned_lines"], out["total_lines"]) == (2, 3)


async def test_t03_line_count_is_bounded(tmp_path: Path, root: Path) -> None:
    ctx = make_ctx(tmp_path, spec=spec_at(root))
    line = b"x" * 1023 + b"\n"
    (root / "huge.txt").write_bytes(b"first\n" + line * (os_files.MAX_COUNT_BYTES // 1024 + 128))
    out = await call(ctx, "sys_os_read", path="huge.txt", limit=1)
    assert out["content"] == "first\n"
    assert out["total_lines"] is None and out["next_offset"] == 2


async def test_t03_binary_file_is_a_clear_error(ctx: ToolContext, root: Path) -> None:
    (root / "blob.bin").write_bytes(b"\x7fELF\x00\x01\x02" + bytes(range(256)))
    with pytest.raises(ToolError, match=r"^'blob.bin' is a binary file"):
        await call(ctx, "sys_os_read", path="blob.bin")


async def test_t03_non_utf8_text_reads_with_replacement(ctx: ToolContext, root: Path) -> None:
    (root / "latin.txt").write_bytes(b"caf\xe9\n")
    out = await call(ctx, "sys_os_read", path="latin.txt")
    assert out["content"] == "caf\ufffd\n"


async def test_t03_multibyte_characters_across_chunks(ctx: ToolContext, root: Path) -> None:
    text = "\u20ac" * 70_000  # 3 bytes each: a long line read in several chunks
    (root / "euro.txt").write_text(text)
    out = await call(ctx, "sys_os_read", path="euro.txt")
    assert out["content"] == text


async def test_t03_missing_directory_and_fifo(ctx: ToolContext, root: Path) -> None:
    with pytest.raises(ToolError, match=r"^'nope.txt' does not exist$"):
        await call(ctx, "sys_os_read", path="nope.txt")
    (root / "d").mkdir()
    with pytest.raises(ToolError, match="is a directory"):
        await call(ctx, "sys_os_read", path="d")
    os.mkfifo(root / "pipe")  # nobody writes to it: reading it must not hang
    with pytest.raises(ToolError, match="is not a regular file"):
        await call(ctx, "sys_os_read", path="pipe")


@pytest.mark.parametrize("bad", [None, "", 3])
async def test_t03_path_must_be_a_non_empty_string(ctx: ToolContext, bad: Any) -> None:
    with pytest.raises(ToolError, match="path"):
        await call(ctx, "sys_os_read", path=bad)


# -- containment: every tool that touches a path --------------------------------------------


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    out = tmp_path / "outside"
    out.mkdir()
    (out / "secret.txt").write_text("secret\n")
    return out


@pytest.mark.parametrize("path", ["../outside/secret.txt", "a/../../outside/secret.txt", "ABS"])
async def test_p22_read_edit_write_refuse_paths_outside_cwd(
    ctx: ToolContext, outside: Path, path: str
) -> None:
    if path == "ABS":
        path = str(outside / "secret.txt")
    with pytest.raises(ToolError, match="escapes the working directory"):
        await call(ctx, "sys_os_read", path=path)
    with pytest.raises(ToolError, match="escapes the working directory"):
        await call(ctx, "sys_os_edit", path=path, oldText="secret", newText="owned")
    with pytest.raises(ToolError, match="escapes the working directory"):
        await call(ctx, "sys_os_write", path=path, content="owned")
    assert (outside / "secret.txt").read_text() == "secret\n"


async def test_p21_symlink_escape_is_refused_for_read_edit_write(
    ctx: ToolContext, root: Path, outside: Path
) -> None:
    (root / "link").symlink_to(outside)
    (root / "file-link").symlink_to(outside / "secret.txt")
    for path in ("link/secret.txt", "file-link"):
        with pytest.raises(ToolError, match="escapes the working directory"):
            await call(ctx, "sys_os_read", path=path)
        with pytest.raises(ToolError, match="escapes the working directory"):
            await call(ctx, "sys_os_edit", path=path, oldText="secret", newText="owned")
        with pytest.raises(ToolError, match="escapes the working directory"):
            await call(ctx, "sys_os_write", path=path, content="owned")
    with pytest.raises(ToolError, match="escapes the working directory"):
        await call(ctx, "sys_os_write", path="link/new.txt", content="owned")
    assert (outside / "secret.txt").read_text() == "secret\n"
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


async def test_p21_dangling_symlink_to_outside_is_not_created(
    ctx: ToolContext, root: Path, outside: Path
) -> None:
    (root / "dangling").symlink_to(outside / "created-by-write.txt")
    with pytest.raises(ToolError, match="escapes the working directory"):
        await call(ctx, "sys_os_write", path="dangling", content="owned")
    assert not (outside / "created-by-write.txt").exists()


async def test_symlinks_inside_cwd_and_absolute_paths_inside_are_fine(
    ctx: ToolContext, root: Path
) -> None:
    (root / "real").mkdir()
    (root / "alias").symlink_to(root / "real")
    await call(ctx, "sys_os_write", path="alias/a.txt", content="via alias")
    assert (root / "real" / "a.txt").read_text() == "via alias"
    out = await call(ctx, "sys_os_read", path=str(root / "real" / "a.txt"))
    assert out["content"] == "via alias"


# -- T-04 shell -----------------------------------------------------------------------------


async def test_t04_shell_reports_exit_code_and_stderr(ctx: ToolContext) -> None:
    out = await call(ctx, "sys_os_shell", command="echo out; echo err >&2; exit 3")
    assert out["stdout"] == "out\n"
    assert out["stderr"] == "err\n"
    assert out["exit_code"] == 3
    assert out["timed_out"] is False


async def test_t04_shell_command_is_one_argument_not_interpolated(
    ctx: ToolContext, root: Path
) -> None:
    out = await call(ctx, "sys_os_shell", command="printf '%s|' \"$0\" 'a b' \"it's\"")
    assert out["stdout"].endswith("|a b|it's|")


async def test_t04_timed_out_command_loses_its_whole_process_group(tmp_path: Path) -> None:
    # The shell exits at once, but its background child keeps stdout open: the call only
    # ends at the timeout, and the child must not survive it.
    work = tmp_path / "w"
    work.mkdir()
    ctx = make_ctx(tmp_path, spec=spec_at(work))
    out = await call(ctx, "sys_os_shell", command="sleep 1000 & echo $!; echo $$", timeout=1.5)
    child, shell = (int(x) for x in out["stdout"].split())
    assert out["timed_out"] is True
    assert _gone(child)
    assert _group_gone(shell)


async def test_t04_term_ignoring_command_is_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shell_runs, "KILL_GRACE_S", 0.3)
    work = tmp_path / "w"
    work.mkdir()
    ctx = make_ctx(tmp_path, spec=spec_at(work))
    # SIGTERM stays ignored across exec, so only SIGKILL ends these.
    command = "trap '' TERM; echo $$; sleep 1000 & wait"
    out = await call(ctx, "sys_os_shell", command=command, timeout=1.5)
    assert out["timed_out"] is True
    assert out["exit_code"] == -signal.SIGKILL
    assert _group_gone(int(out["stdout"]))


async def test_t04_call_deadline_caps_requested_timeout(tmp_path: Path, root: Path) -> None:
    ctx = make_ctx(tmp_path, spec=spec_at(root), timeout_s=1.5)
    with trio.fail_after(30):
        out = await call(ctx, "sys_os_shell", command="echo $$; exec sleep 1000", timeout=600)
    assert out["timed_out"] is True
    assert out["exit_code"] == -signal.SIGTERM
    assert _group_gone(int(out["stdout"]))


async def test_t04_cancelled_call_kills_the_process_group(ctx: ToolContext, root: Path) -> None:
    pid_file = root / "pid"
    command = f"sleep 1000 & echo $! > {pid_file}.tmp; mv {pid_file}.tmp {pid_file}; wait"
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_TOOLS["sys_os_shell"].run, ctx, {"command": command})
            while not pid_file.exists():  # wait until the command is really running
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    assert _gone(int(pid_file.read_text()))


async def test_t04_background_job_does_not_outlive_a_finished_call(
    ctx: ToolContext,
) -> None:
    out = await call(ctx, "sys_os_shell", command="sleep 1000 >/dev/null 2>&1 & echo $!")
    assert out["timed_out"] is False and out["exit_code"] == 0
    assert _gone(int(out["stdout"]))


@pytest.mark.parametrize("timeout", [0, -1, "10", True, float("inf")])
async def test_t04_bad_timeout_is_refused(ctx: ToolContext, timeout: Any) -> None:
    with pytest.raises(ToolError, match="timeout must be a positive number"):
        await call(ctx, "sys_os_shell", command="true", timeout=timeout)


async def test_t04_ten_megabytes_of_output_are_capped_in_bounded_memory(
    tmp_path: Path, root: Path
) -> None:
    ctx = make_ctx(tmp_path, spec=spec_at(root), max_output_chars=1000)
    command = "head -c 10000000 /dev/zero | tr '\\0' a"
    tracemalloc.start()
    try:
        out = await call(ctx, "sys_os_shell", command=command)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out["stdout"] == "a" * 1000 + "\n...[truncated 9999000 chars]"
    assert out["exit_code"] == 0
    assert peak < 3_000_000, f"peak {peak} bytes: output was held whole"


async def test_t04_stdout_and_stderr_share_the_cap(tmp_path: Path, root: Path) -> None:
    ctx = make_ctx(tmp_path, spec=spec_at(root), max_output_chars=100)
    out = await call(
        ctx, "sys_os_shell", command="printf 'o%.0s' $(seq 500); printf 'e%.0s' $(seq 30) >&2"
    )
    assert out["stderr"] == "e" * 30
    assert out["stdout"] == "o" * 70 + "\n...[truncated 430 chars]"
    both = await call(
        ctx, "sys_os_shell", command="printf 'o%.0s' $(seq 500); printf 'e%.0s' $(seq 500) >&2"
    )
    assert both["stdout"] == "o" * 50 + "\n...[truncated 450 chars]"
    assert both["stderr"] == "e" * 50 + "\n...[truncated 450 chars]"


async def test_t04_non_utf8_output_is_replaced(ctx: ToolContext) -> None:
    out = await call(ctx, "sys_os_shell", command="printf 'ok\\377\\376end'; printf '\\351' >&2")
    assert out["stdout"] == "ok\ufffd\ufffdend"
    assert out["stderr"] == "\ufffd"


async def test_t04_shell_stdin_is_empty(ctx: ToolContext) -> None:
    with trio.fail_after(30):
        out = await call(ctx, "sys_os_shell", command="cat; echo done")
    assert out["stdout"] == "done\n"


async def test_t07_missing_spec_cwd_is_an_error_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "does-not-exist"
    ctx = make_ctx(tmp_path, spec=spec_at(missing))
    with pytest.raises(ToolError, match="does not exist"):
        await call(ctx, "sys_os_shell", command="true")
    assert not missing.exists()
