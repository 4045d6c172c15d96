"""Local gates of the session and agent tools: P-20 to P-22, S-40, S-41."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from corral.tools._api import ToolContext, ToolError
from corral.tools.paths import (
    DOWNLOAD_ESCAPE_MESSAGE,
    bare_filename,
    download_destination,
    resolve_inside,
)
from corral.tools.session_tools import EXACTLY_ONE_MODE_MESSAGE, PENDING, READY, TOOLS
from tests._tool_context import tool_context

_TOOLS = {tool.name: tool for tool in TOOLS}


async def run(ctx: ToolContext, name: str, **args: Any) -> str:
    return await _TOOLS[name].run(ctx, args)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    work = tmp_path / "workspace"
    work.mkdir()
    return work


@pytest.fixture
def ctx(tmp_path: Path, workspace: Path) -> ToolContext:
    return tool_context(tmp_path, workspace=workspace)


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# -- P-20 / P-21 sys_agent_download --------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["../escape.tar.gz", "sub/escape.tar.gz", "/abs.tar.gz", "a\\b.tar.gz", ".", ".."]
)
async def test_p20_dest_filename_must_be_bare(
    ctx: ToolContext, tmp_path: Path, workspace: Path, name: str
) -> None:
    with pytest.raises(ToolError, match="dest_filename must be a bare file name"):
        await run(ctx, "sys_agent_download", session_id="conv_x", dest_filename=name)
    assert list(workspace.iterdir()) == []
    assert tree(tmp_path) == ["workspace"]


@pytest.mark.parametrize("name", ["", 7])
async def test_p20_dest_filename_must_be_a_non_empty_string(ctx: ToolContext, name: Any) -> None:
    with pytest.raises(ToolError, match=r"^dest_filename must be a non-empty string$"):
        await run(ctx, "sys_agent_download", session_id="conv_x", dest_filename=name)


async def test_p21_symlink_escape_from_cwd_is_refused(tmp_path: Path, workspace: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    outside_target = outside / "stolen.tar.gz"
    (workspace / "escape.tar.gz").symlink_to(outside_target)
    ctx = tool_context(tmp_path, workspace=workspace)
    with pytest.raises(ToolError, match=f"^{DOWNLOAD_ESCAPE_MESSAGE}$"):
        await run(ctx, "sys_agent_download", session_id="conv_x", dest_filename="escape.tar.gz")
    assert DOWNLOAD_ESCAPE_MESSAGE == (
        "sys_agent_download resolved destination escapes the working directory"
    )
    assert not outside_target.exists()
    assert (workspace / "escape.tar.gz").is_symlink()


async def test_p21_symlink_to_cwd_itself_is_refused(tmp_path: Path, workspace: Path) -> None:
    (workspace / "self").symlink_to(workspace)
    with pytest.raises(ToolError, match=f"^{DOWNLOAD_ESCAPE_MESSAGE}$"):
        download_destination(workspace, "self")


async def test_p21_bare_name_inside_passes_the_gate_and_writes_nothing(
    ctx: ToolContext, workspace: Path
) -> None:
    (workspace / "real.tar.gz").write_bytes(b"old")
    (workspace / "alias.tar.gz").symlink_to(workspace / "real.tar.gz")
    assert download_destination(workspace, "alias.tar.gz") == (workspace / "real.tar.gz")
    with pytest.raises(ToolError, match=r"^sys_agent_download requires server access$"):
        await run(ctx, "sys_agent_download", session_id="conv_x", dest_filename="bundle.tar.gz")
    assert sorted(p.name for p in workspace.iterdir()) == ["alias.tar.gz", "real.tar.gz"]
    assert (workspace / "real.tar.gz").read_bytes() == b"old"


def test_p20_bare_filename_accepts_plain_names() -> None:
    for name in ("my_agent-v5.tar.gz", ".hidden", "..dots", "a b.tgz"):
        assert bare_filename(name) == name


# -- P-22 / S-40 / S-41 sys_session_create ---------------------------------------------------


async def test_p22_config_path_escape_rejected(tmp_path: Path, workspace: Path) -> None:
    (tmp_path / "outside.yaml").write_text("name: outside\n")
    ctx = tool_context(tmp_path, workspace=workspace)
    with pytest.raises(ToolError, match="escapes the working directory"):
        await run(ctx, "sys_session_create", config_path="../outside.yaml")
    with pytest.raises(ToolError, match="escapes the working directory"):
        await run(ctx, "sys_session_create", config_path=str(tmp_path / "outside.yaml"))


async def test_p22_config_path_symlink_escape_rejected(tmp_path: Path, workspace: Path) -> None:
    # A FIFO outside: if the tool opened it for reading, this test would hang, not pass.
    os.mkfifo(tmp_path / "outside.yaml")
    (workspace / "helper.yaml").symlink_to(tmp_path / "outside.yaml")
    ctx = tool_context(tmp_path, workspace=workspace)
    with pytest.raises(
        ToolError, match=r"^config_path 'helper\.yaml' escapes the working directory$"
    ):
        await run(ctx, "sys_session_create", config_path="helper.yaml", title="t", message="m")


@pytest.mark.parametrize(
    "args",
    [
        {"agent_id": "ag_x", "config_path": "helper.yaml", "title": "t", "message": "m"},
        {"title": "t", "message": "m"},
        {"agent_id": "", "config_path": None, "message": "m"},
    ],
    ids=["both", "neither", "empty"],
)
async def test_s40_requires_exactly_one_mode(ctx: ToolContext, args: dict[str, Any]) -> None:
    with pytest.raises(ToolError, match="exactly one of 'agent_id'") as caught:
        await run(ctx, "sys_session_create", **args)
    assert str(caught.value) == EXACTLY_ONE_MODE_MESSAGE


async def test_s40_mode_check_comes_before_containment(ctx: ToolContext) -> None:
    with pytest.raises(ToolError, match="exactly one of"):
        await run(ctx, "sys_session_create", agent_id="ag_x", config_path="../outside.yaml")


async def test_s41_missing_config_is_config_not_found(ctx: ToolContext) -> None:
    out = json.loads(await run(ctx, "sys_session_create", config_path="nope.yaml", message="m"))
    assert out == {"error": "config_not_found", "config_path": "nope.yaml"}


async def test_s39_config_inside_passes_the_gates(ctx: ToolContext, workspace: Path) -> None:
    (workspace / "helper.yaml").write_text("name: helper\n")
    # Past the gates the tool asks the server, and this context has none.
    with pytest.raises(ToolError, match=r"^sys_session_create requires server access$"):
        await run(ctx, "sys_session_create", config_path="helper.yaml", title="t", message="m")
    with pytest.raises(ToolError, match=r"^sys_session_create requires server access$"):
        await run(ctx, "sys_session_create", agent_id="ag_x", title="t", message="m")


async def test_agent_id_must_be_a_string(ctx: ToolContext) -> None:
    with pytest.raises(ToolError, match=r"^agent_id must be a string$"):
        await run(ctx, "sys_session_create", agent_id=5)


# -- the rest of the family -----------------------------------------------------------------


async def test_t26_pending_tools_say_so(ctx: ToolContext) -> None:
    assert set(_TOOLS) == PENDING | READY and not PENDING & READY
    for name in sorted(PENDING):
        with pytest.raises(ToolError, match=f"^{name} is not available on this runner yet$"):
            await run(ctx, name, session_id="conv_x")


def test_resolve_inside_names_the_argument(tmp_path: Path) -> None:
    with pytest.raises(ToolError, match=r"^config_path '\.\./x' escapes the working directory$"):
        resolve_inside(tmp_path, "../x", what="config_path")
    with pytest.raises(ToolError, match="NUL"):
        resolve_inside(tmp_path, "a\x00b")
    assert resolve_inside(tmp_path, "a/../b") == tmp_path.resolve() / "b"
    assert resolve_inside(tmp_path, ".") == tmp_path.resolve()
