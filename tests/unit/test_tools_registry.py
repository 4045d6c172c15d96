"""The runner-local dispatch table and the tool-surface gating (T-26, T-27, P-23 to P-27)."""

from __future__ import annotations

from typing import Any

import pytest

from corral.spec import load_spec_yaml, spec_to_dict
from corral.tools import registry
from corral.tools.registry import (
    LOCAL_TOOL_NAMES,
    all_tools,
    is_runner_local,
    not_enabled_error,
    not_in_table_error,
    relayed_builtins,
    tool_schemas,
    tool_table,
)
from corral.tools.session_tools import PENDING

OS_TOOLS = {"sys_os_read", "sys_os_write", "sys_os_edit", "sys_os_shell"}
TERMINAL_TOOLS = {
    "sys_terminal_launch",
    "sys_terminal_send",
    "sys_terminal_read",
    "sys_terminal_list",
    "sys_terminal_close",
}
SPAWN_WRITES = {"sys_session_send", "sys_session_close", "sys_session_create"}
ALWAYS_ON = {
    "sys_agent_get",
    "sys_agent_download",
    "sys_agent_list",
    "sys_session_list",
    "sys_session_get_history",
    "sys_session_get_info",
    "sys_call_async",
    "sys_read_inbox",
    "sys_cancel_async",
    "sys_cancel_task",
    "list_comments",
    "update_comment",
}


def spec(yaml_text: str) -> dict[str, Any]:
    """A spec dict as the tools get it: parsed from YAML, then ``spec_to_dict``."""
    return spec_to_dict(load_spec_yaml(yaml_text))


NO_OPT_IN = spec("name: plain\n")
DECLARED_AGENTS = spec(
    "name: orchestrator\ntools:\n  agents: [researcher]\nsub_agents:\n  - name: researcher\n"
)
SPAWN = spec("name: spawner\nspawn: true\n")
TERMINALS_LIST = spec("name: t\nterminals:\n  - {name: bash, command: bash}\n")
TERMINALS_MAP = spec("name: t\nterminals:\n  bash: {command: bash}\n")
EVERYTHING = spec(
    "name: all\nspawn: true\nagent_session_sharing: public\nterminals:\n  bash: {command: bash}\n"
)
ARMS = [NO_OPT_IN, DECLARED_AGENTS, SPAWN, TERMINALS_LIST, EVERYTHING, {}]


# -- T-26 / T-27 ----------------------------------------------------------------------------


def test_t26_local_tool_names_are_exactly_the_runner_local_families() -> None:
    expected = (
        OS_TOOLS
        | TERMINAL_TOOLS
        | {
            "sys_session_list",
            "sys_session_get_history",
            "sys_session_get_info",
            "sys_session_create",
            "sys_session_send",
            "sys_session_close",
            "sys_session_share",
            "sys_agent_get",
            "sys_agent_download",
            "sys_agent_list",
            "sys_list_models",
            "sys_read_inbox",
            "sys_call_async",
            "sys_cancel_async",
            "sys_cancel_task",
        }
    )
    assert expected == LOCAL_TOOL_NAMES
    assert all(is_runner_local(name) for name in expected)


@pytest.mark.parametrize("name", ["list_tasks", "list_comments", "get_weather", "sys_os", ""])
def test_t27_other_names_are_not_runner_local(name: str) -> None:
    assert is_runner_local(name) is False


def test_t27_list_tasks_is_never_claimed_or_relayed() -> None:
    for arm in ARMS:
        assert "list_tasks" not in relayed_builtins(arm)
        assert "list_tasks" not in tool_table(arm)
    assert "list_tasks" not in all_tools()


def test_t26_error_texts() -> None:
    assert not_in_table_error("get_weather") == (
        "Error: get_weather not in local dispatch table (no agent spec)"
    )
    assert not_enabled_error("sys_session_create") == (
        "Error: sys_session_create is not enabled for this agent"
    )


def test_t26_every_local_name_has_an_implementation() -> None:
    table = all_tools()
    assert set(table) == LOCAL_TOOL_NAMES
    for name, tool in table.items():
        assert tool.name == name
        assert tool.parameters["type"] == "object"
        assert isinstance(tool.parameters.get("properties"), dict)
        assert tool.description


def test_t26_fully_granted_spec_runs_every_local_tool() -> None:
    assert set(tool_table(EVERYTHING)) == LOCAL_TOOL_NAMES


# -- the table, gated by the spec -----------------------------------------------------------


@pytest.mark.parametrize("arm", ARMS)
def test_t05_os_and_async_tools_run_for_every_spec(arm: dict[str, Any]) -> None:
    table = tool_table(arm)
    assert OS_TOOLS | {"sys_call_async", "sys_read_inbox", "sys_cancel_async"} <= set(table)
    # Their own call-time gates answer these (P-05, S-48), so they are always dispatchable.
    assert {"sys_session_share", "sys_list_models", "sys_cancel_task"} <= set(table)


@pytest.mark.parametrize(
    ("arm", "writes"),
    [
        (NO_OPT_IN, set()),
        (DECLARED_AGENTS, {"sys_session_send", "sys_session_close"}),
        (SPAWN, SPAWN_WRITES),
        ({}, set()),
    ],
    ids=["no-opt-in", "declared-agents", "spawn-flag", "unknown-spec"],
)
def test_p24_table_withholds_ungranted_spawn_writes(arm: dict[str, Any], writes: set[str]) -> None:
    assert set(tool_table(arm)) & SPAWN_WRITES == writes


@pytest.mark.parametrize(
    ("arm", "expected"),
    [(TERMINALS_LIST, TERMINAL_TOOLS), (TERMINALS_MAP, TERMINAL_TOOLS), (NO_OPT_IN, set())],
    ids=["terminals-list", "terminals-map", "no-terminals"],
)
def test_p27_table_has_terminal_tools_only_with_terminals(
    arm: dict[str, Any], expected: set[str]
) -> None:
    assert set(tool_table(arm)) & TERMINAL_TOOLS == expected


def test_p27_empty_terminals_block_grants_nothing() -> None:
    for empty in ({"terminals": []}, {"terminals": {}}, {"terminals": None}):
        assert not set(tool_table(empty)) & TERMINAL_TOOLS
        assert not relayed_builtins(empty) & TERMINAL_TOOLS


def test_p24_empty_or_malformed_agents_grant_nothing() -> None:
    for tools in ({"agents": []}, {"agents": None}, ["agents"], "agents"):
        assert not relayed_builtins({"tools": tools}) & SPAWN_WRITES
    assert not relayed_builtins({"spawn": "true"}) & SPAWN_WRITES


# -- P-23 to P-27: the set relayed to native harnesses --------------------------------------


@pytest.mark.parametrize("arm", ARMS)
def test_p23_always_on_builtins_are_relayed_for_every_spec(arm: dict[str, Any]) -> None:
    assert relayed_builtins(arm) >= ALWAYS_ON


@pytest.mark.parametrize(
    ("arm", "writes"),
    [
        (NO_OPT_IN, set()),
        (DECLARED_AGENTS, {"sys_session_send", "sys_session_close"}),
        (SPAWN, SPAWN_WRITES),
    ],
    ids=["no-opt-in", "declared-agents", "spawn-flag"],
)
def test_p24_p25_spawn_writes_follow_exactly_the_grant(
    arm: dict[str, Any], writes: set[str]
) -> None:
    relayed = relayed_builtins(arm)
    assert relayed & SPAWN_WRITES == writes
    assert ("sys_list_models" in relayed) == ("sys_session_send" in writes)


@pytest.mark.parametrize("arm", ARMS)
def test_p26_os_tools_are_never_relayed(arm: dict[str, Any]) -> None:
    assert not relayed_builtins(arm) & OS_TOOLS


@pytest.mark.parametrize(
    ("arm", "expected"),
    [(TERMINALS_LIST, TERMINAL_TOOLS), (TERMINALS_MAP, TERMINAL_TOOLS), (NO_OPT_IN, set())],
    ids=["terminals-declared", "terminals-map", "no-terminals"],
)
def test_p27_terminal_tools_relayed_per_spec_gate(arm: dict[str, Any], expected: set[str]) -> None:
    assert relayed_builtins(arm) & TERMINAL_TOOLS == expected


def test_p05_share_is_relayed_only_when_sharing_is_enabled() -> None:
    assert "sys_session_share" not in relayed_builtins(NO_OPT_IN)
    assert "sys_session_share" not in relayed_builtins({"agent_session_sharing": "none"})
    for level in ("non-public", "public"):
        assert "sys_session_share" in relayed_builtins({"agent_session_sharing": level})


def test_p23_relayed_set_for_no_opt_in_is_exactly_the_always_on_set() -> None:
    assert relayed_builtins(NO_OPT_IN) == ALWAYS_ON


def test_relayed_set_is_a_fresh_set() -> None:
    relayed_builtins(NO_OPT_IN).add("sys_os_shell")
    assert "sys_os_shell" not in relayed_builtins(NO_OPT_IN)


# -- schemas for harnesses that run their tools through the runner ---------------------------


@pytest.mark.parametrize("arm", ARMS)
def test_tool_schemas_shape_and_gating(arm: dict[str, Any]) -> None:
    schemas = tool_schemas(arm)
    names = [s["name"] for s in schemas]
    assert len(names) == len(set(names))
    for schema in schemas:
        assert set(schema) == {"type", "name", "description", "parameters"}
        assert schema["type"] == "function"
        assert schema["parameters"]["type"] == "object"
    assert set(names) <= set(tool_table(arm))
    assert set(names) >= OS_TOOLS
    assert not set(names) & PENDING  # tools that would only answer "not available"
    assert (set(names) >= TERMINAL_TOOLS) == registry.declares_terminals(arm)


def test_tool_schemas_start_with_the_os_tools_in_order() -> None:
    names = [s["name"] for s in tool_schemas(NO_OPT_IN)]
    assert names[:4] == ["sys_os_read", "sys_os_write", "sys_os_edit", "sys_os_shell"]
