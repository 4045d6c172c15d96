"""The effective OS env of a session: cwd rules, fallback directories, faithful copies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from corral.spec import load_spec_yaml, spec_to_dict
from corral.tools._api import ToolContext, ToolError
from corral.tools.os_env import (
    clone_os_env,
    default_os_env_root,
    effective_cwd,
    effective_os_env,
    sanitize_conversation_id,
    unsupported_reason,
    workspace_from_env,
)
from tests._tool_context import tool_context


def _spec(os_env: Any = None) -> dict[str, Any]:
    return {} if os_env is None else {"os_env": os_env}


def test_t06_workspace_wins_over_absolute_spec_cwd(tmp_path: Path) -> None:
    workspace = tmp_path / "picked-subdir"
    workspace.mkdir()
    spec_cwd = tmp_path / "agent-spec-cwd"
    spec_cwd.mkdir()
    env = effective_os_env(
        _spec({"type": "caller_process", "cwd": str(spec_cwd), "sandbox": {"type": "none"}}),
        workspace=workspace,
        conversation_id="conv_abs_override",
        os_env_root=tmp_path / "fallback",
    )
    assert env["cwd"] == str(workspace)
    assert not (tmp_path / "fallback").exists()


def test_t06_workspace_wins_over_relative_spec_cwd(tmp_path: Path) -> None:
    env = effective_os_env(
        _spec({"cwd": "src"}), workspace=tmp_path, conversation_id="c", os_env_root=tmp_path / "r"
    )
    assert env["cwd"] == str(tmp_path)


def test_t07_absolute_spec_cwd_used_as_written_without_workspace(tmp_path: Path) -> None:
    spec_cwd = tmp_path / "agent-spec-cwd"  # deliberately not created: it is used, not made
    env = effective_os_env(
        _spec({"type": "caller_process", "cwd": str(spec_cwd)}),
        workspace=None,
        conversation_id="conv_no_workspace_abs",
        os_env_root=tmp_path / "fallback",
    )
    assert env["cwd"] == str(spec_cwd)
    assert not spec_cwd.exists()
    assert not (tmp_path / "fallback").exists()


def test_t07_home_relative_spec_cwd_is_expanded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    env = effective_os_env(
        _spec({"cwd": "~/proj"}), workspace=None, conversation_id="c", os_env_root=tmp_path / "r"
    )
    assert env["cwd"] == str(tmp_path / "proj")


@pytest.mark.parametrize("cwd", [None, "", ".", "./", "missing"])
def test_t08_placeholder_cwd_maps_to_workspace_and_root_is_not_created(
    tmp_path: Path, cwd: str | None
) -> None:
    workspace = tmp_path / "project"
    workspace.mkdir()
    os_env: dict[str, Any] = {"type": "caller_process", "sandbox": {"type": "none"}}
    if cwd != "missing":
        os_env["cwd"] = cwd
    env = effective_os_env(
        _spec(os_env),
        workspace=workspace,
        conversation_id="conv_runner_workspace",
        os_env_root=tmp_path / "fallback",
    )
    assert env["cwd"] == str(workspace)
    assert not (tmp_path / "fallback").exists()


@pytest.mark.parametrize("cwd", [None, "", ".", "./", "relative/dir"])
def test_t10_placeholder_or_relative_cwd_without_workspace_uses_fallback(
    tmp_path: Path, cwd: str | None
) -> None:
    env = effective_os_env(
        _spec({"type": "caller_process", "cwd": cwd}),
        workspace=None,
        conversation_id="conv/default workspace",
        os_env_root=tmp_path / "fallback",
    )
    expected = tmp_path / "fallback" / "conv_default_workspace" / "workspace"
    assert env["cwd"] == str(expected)
    assert expected.is_dir()


def test_t09_spec_without_os_env_uses_workspace(tmp_path: Path) -> None:
    workspace = tmp_path / "project"
    workspace.mkdir()
    env = effective_os_env(
        {}, workspace=workspace, conversation_id="conv/no os env", os_env_root=tmp_path / "fb"
    )
    assert env == {"type": "caller_process", "cwd": str(workspace)}
    assert not (tmp_path / "fb").exists()


def test_t10_spec_without_os_env_gets_created_conversation_dir(tmp_path: Path) -> None:
    env = effective_os_env(
        {}, workspace=None, conversation_id="conv/no os env", os_env_root=tmp_path / "root"
    )
    assert env["type"] == "caller_process"
    assert Path(env["cwd"]) == tmp_path / "root" / "conv_no_os_env" / "workspace"
    assert Path(env["cwd"]).is_dir()


def test_t10_conversations_get_separate_dirs(tmp_path: Path) -> None:
    a = effective_os_env({}, workspace=None, conversation_id="a", os_env_root=tmp_path)
    b = effective_os_env({}, workspace=None, conversation_id="b", os_env_root=tmp_path)
    assert a["cwd"] != b["cwd"]


def test_t05_inherit_os_env_counts_as_absent(tmp_path: Path) -> None:
    env = effective_os_env(
        _spec("inherit"), workspace=tmp_path, conversation_id="c", os_env_root=tmp_path / "r"
    )
    assert env == {"type": "caller_process", "cwd": str(tmp_path)}


@pytest.mark.parametrize(
    ("conversation_id", "expected"),
    [
        ("conv/default workspace", "conv_default_workspace"),
        ("conv/no os env", "conv_no_os_env"),
        ("3d7f35bf59b0472c8157693018a2cb80", "3d7f35bf59b0472c8157693018a2cb80"),
        ("..", "__"),
        ("../../etc", "______etc"),
        ("a\\b\x00c", "a_b_c"),
        ("", "default"),
        ("caf\u00e9", "caf_"),
    ],
)
def test_t10_sanitize_conversation_id(conversation_id: str, expected: str) -> None:
    assert sanitize_conversation_id(conversation_id) == expected


def test_t10_sanitize_long_ids_stay_short_and_distinct() -> None:
    one = sanitize_conversation_id("x" * 300 + "1")
    two = sanitize_conversation_id("x" * 300 + "2")
    assert len(one) == len(two) == 128
    assert one != two
    assert one.startswith("x" * 100)


_SANDBOX_YAML = """
name: clone-check
os_env:
  type: caller_process
  cwd: /tmp/work
  fork: true
  start_in_scratch: true
  future_os_field: {nested: [1, 2]}
  sandbox:
    type: darwin_seatbelt
    read_paths: ["~/.databrickscfg"]
    write_paths: ["."]
    write_files: ["~/.ssh/known_hosts"]
    allow_network: true
    cwd_allow_hidden: [".git", ".venv"]
    cwd_hidden_scan_max_entries: 12345
    cwd_hidden_scan_overflow: warn
    env_passthrough: [DATABRICKS_HOST, DATABRICKS_TOKEN]
    egress_rules: ["GET api.github.com/repos/databricks/*/**"]
    egress_allow_private_destinations: true
    added_later: [x]
"""

_LIST_FIELDS = (
    "read_paths",
    "write_paths",
    "write_files",
    "cwd_allow_hidden",
    "env_passthrough",
    "egress_rules",
    "added_later",
)


def test_t11_effective_env_keeps_every_field_without_sharing(tmp_path: Path) -> None:
    spec = spec_to_dict(load_spec_yaml(_SANDBOX_YAML))
    original = spec["os_env"]
    env = effective_os_env(spec, workspace=None, conversation_id="c", os_env_root=tmp_path)
    # Every field of the OS env and its sandbox round-trips, known or not.
    assert env == original
    assert set(env["sandbox"]) == {
        "type",
        "read_paths",
        "write_paths",
        "write_files",
        "allow_network",
        "cwd_allow_hidden",
        "cwd_hidden_scan_max_entries",
        "cwd_hidden_scan_overflow",
        "env_passthrough",
        "egress_rules",
        "egress_allow_private_destinations",
        "added_later",
    }
    assert env["fork"] is True and env["start_in_scratch"] is True
    assert env["sandbox"] is not original["sandbox"]
    for name in _LIST_FIELDS:
        assert env["sandbox"][name] == original["sandbox"][name]
        assert env["sandbox"][name] is not original["sandbox"][name], name
    env["sandbox"]["egress_rules"].append("GET evil.example/**")
    env["future_os_field"]["nested"].append(3)
    assert original["sandbox"]["egress_rules"] == ["GET api.github.com/repos/databricks/*/**"]
    assert original["future_os_field"] == {"nested": [1, 2]}


def test_t11_workspace_override_does_not_touch_the_spec(tmp_path: Path) -> None:
    spec = {"os_env": {"cwd": ".", "sandbox": {"type": "none", "write_paths": ["."]}}}
    env = effective_os_env(spec, workspace=tmp_path, conversation_id="c", os_env_root=tmp_path)
    assert spec["os_env"]["cwd"] == "."
    assert env["sandbox"] == {"type": "none", "write_paths": ["."]}
    assert env["sandbox"]["write_paths"] is not spec["os_env"]["sandbox"]["write_paths"]


def test_t11_clone_os_env_is_deep() -> None:
    original = {"sandbox": {"egress_rules": ["a"]}, "x": [1]}
    clone = clone_os_env(original)
    assert clone == original
    assert clone["sandbox"] is not original["sandbox"]
    assert clone["x"] is not original["x"]


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"type": "caller_process"}, None),
        ({"type": "caller_process", "sandbox": {"type": "none"}}, None),
        ({"type": "caller_process", "sandbox": "none"}, None),
        ({"type": "caller_process", "sandbox": {"egress_rules": []}}, None),
        ({"type": "docker"}, "os_env type 'docker'"),
        ({"type": "caller_process", "sandbox": {"type": "darwin_seatbelt"}}, "darwin_seatbelt"),
        (
            {"type": "caller_process", "sandbox": {"type": "linux_bwrap", "egress_rules": ["x"]}},
            "egress_rules",
        ),
        ({"type": "caller_process", "fork": True}, "fork"),
        ({"type": "caller_process", "start_in_scratch": True}, "start_in_scratch"),
    ],
)
def test_t05_unsupported_environments_are_named(env: dict[str, Any], fragment: str | None) -> None:
    reason = unsupported_reason(env)
    if fragment is None:
        assert reason is None
    else:
        assert reason is not None and fragment in reason


def _ctx(tmp_path: Path, spec: dict[str, Any], workspace: Path | None) -> ToolContext:
    return tool_context(tmp_path, session_id="conv/ctx", spec=spec, workspace=workspace)


async def test_t05_effective_cwd_follows_the_context(tmp_path: Path) -> None:
    assert await effective_cwd(_ctx(tmp_path, {}, tmp_path)) == tmp_path
    fallback = await effective_cwd(_ctx(tmp_path, {}, None))
    assert fallback == tmp_path / "fallback" / "conv_ctx" / "workspace"
    assert fallback.is_dir()


async def test_t05_effective_cwd_refuses_an_unsupported_sandbox(tmp_path: Path) -> None:
    spec = {"os_env": {"type": "caller_process", "sandbox": {"type": "darwin_seatbelt"}}}
    with pytest.raises(ToolError, match="darwin_seatbelt"):
        await effective_cwd(_ctx(tmp_path, spec, tmp_path))


def test_workspace_from_env_prefers_corral_name(tmp_path: Path) -> None:
    assert workspace_from_env({}) is None
    assert workspace_from_env({"CORRAL_WORKSPACE": "", "OMNIGENT_RUNNER_WORKSPACE": ""}) is None
    assert workspace_from_env({"OMNIGENT_RUNNER_WORKSPACE": str(tmp_path)}) == tmp_path
    both = {"CORRAL_WORKSPACE": str(tmp_path / "a"), "OMNIGENT_RUNNER_WORKSPACE": str(tmp_path)}
    assert workspace_from_env(both) == tmp_path / "a"
    relative = workspace_from_env({"CORRAL_WORKSPACE": "rel"})
    assert relative is not None and relative.is_absolute() and relative.name == "rel"


def test_t10_default_os_env_root(tmp_path: Path) -> None:
    assert default_os_env_root(tmp_path, {}) == tmp_path / "os-envs"
    assert not (tmp_path / "os-envs").exists()
    omni = {"OMNIGENT_RUNNER_OS_ENV_ROOT": str(tmp_path / "o")}
    assert default_os_env_root(tmp_path, omni) == tmp_path / "o"
    both = {**omni, "CORRAL_OS_ENV_ROOT": str(tmp_path / "c")}
    assert default_os_env_root(tmp_path, both) == tmp_path / "c"
