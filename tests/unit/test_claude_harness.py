"""The claude-sdk kind's pieces that need no CLI: its settings, command line, environment,
MCP answers and exception unwrapping (docs/harnesses.md, *claude-sdk*)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from corral.harnesses._turn import TurnFailed
from corral.harnesses.claude import _mcp
from corral.harnesses.claude._session import collapsed, resumable, save_state
from corral.harnesses.claude._settings import argv, cli_env, resolve

KEY_VAR = "HARNESS_CLAUDE_SDK_API_KEY"
TOOL = {
    "type": "function",
    "function": {
        "name": "sys_os_read",
        "description": "Read a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    },
}


def _resolve(executor: dict[str, Any], message: dict[str, Any] | None = None, **env: str):
    spec = {"name": "a", "prompt": "Be brief.", "executor": {"harness": "claude-sdk", **executor}}
    environ = {KEY_VAR: "sk-hidden", **env}
    return resolve(spec, message or {}, {}, environ, harness="claude-sdk", model_override=None)


def test_the_key_comes_from_the_workers_hidden_variable_else_a_literal() -> None:
    assert _resolve({}).api_key == "sk-hidden"
    spec = {"executor": {"auth": {"api_key": "sk-literal"}}}
    settings = resolve(spec, {}, {}, {}, harness="claude-sdk", model_override=None)
    assert settings.api_key == "sk-literal"
    # A $VAR the harness actor did not resolve is no key (never sent as the literal text).
    with pytest.raises(TurnFailed) as failed:
        resolve(
            {"executor": {"auth": {"api_key": "$NOPE"}}},
            {},
            {},
            {},
            harness="claude-sdk",
            model_override=None,
        )
    assert failed.value.code == "missing_credentials"
    assert KEY_VAR in failed.value.message


@pytest.mark.parametrize(
    ("executor", "field"),
    [
        ({"permission_mode": "yolo"}, "permission_mode"),
        ({"system_prompt": "prepend"}, "system_prompt"),
        ({"idle_timeout_s": -1}, "idle_timeout_s"),
        ({"turn_timeout_s": "soon"}, "turn_timeout_s"),
        ({"auth": {"base_url": "ftp://x"}}, "base_url"),
        ({"auth": "sk-x"}, "auth"),
    ],
)
def test_a_bad_setting_fails_the_turn_naming_it(executor: dict[str, Any], field: str) -> None:
    with pytest.raises(TurnFailed) as failed:
        _resolve(executor)
    assert failed.value.code == "config_error" and field in failed.value.message


def test_a_base_url_with_v1_is_taken_without_it_and_names_the_provider() -> None:
    settings = _resolve({"auth": {"base_url": "http://127.0.0.1:9/v1/"}})
    assert settings.base_url == "http://127.0.0.1:9"
    assert settings.provider == "127.0.0.1"
    assert _resolve({}).provider == "anthropic"


def test_the_model_is_the_override_then_the_spec_then_the_workers_variable() -> None:
    assert _resolve({"model": "m-spec"}).model == "m-spec"
    assert _resolve({}, HARNESS_CLAUDE_SDK_MODEL="m-env").model == "m-env"
    spec = {"executor": {"model": "m-spec", "auth": {"api_key": "k"}}}
    override = resolve(spec, {}, {}, {}, harness="claude-sdk", model_override="m-override")
    assert override.model == "m-override"


def test_the_command_line_offers_the_runner_tools_over_mcp_only_when_there_are_some() -> None:
    bare = argv("/bin/claude", _resolve({"model": "m"}), resume=None)
    assert bare[:3] == ["/bin/claude", "-p", "--output-format"]
    assert bare[bare.index("--model") + 1] == "m"
    assert bare[bare.index("--append-system-prompt") + 1] == "Be brief."
    assert "--mcp-config" not in bare and "--resume" not in bare
    settings = _resolve({"system_prompt": "replace"}, {"tools": [TOOL], "instructions": "Hi."})
    full = argv("/bin/claude", settings, resume="sess-1")
    assert full[full.index("--system-prompt") + 1] == "Hi."  # the turn's own instructions
    config = json.loads(full[full.index("--mcp-config") + 1])
    assert config == {"mcpServers": {"corral": {"type": "sdk", "name": "corral"}}}
    assert full[full.index("--allowedTools") + 1] == "mcp__corral"
    assert full[full.index("--resume") + 1] == "sess-1"


def test_the_cli_environment_holds_only_the_allow_list_the_key_and_the_offline_settings(
    tmp_path: Path,
) -> None:
    worker = {
        "PATH": "/usr/bin",
        "LANG": "C.UTF-8",
        KEY_VAR: "sk-hidden",
        "CORRAL_CLI_PATH": "/opt/clis",
        "AWS_SECRET_ACCESS_KEY": "host-secret",
        "HOME": "/root",
    }
    settings = _resolve({"auth": {"base_url": "http://127.0.0.1:9"}})
    env = cli_env("/opt/clis/claude", settings, tmp_path, worker)
    assert env["HOME"] == str(tmp_path)
    assert env["PATH"].split(":")[0] == "/opt/clis"
    assert env["ANTHROPIC_API_KEY"] == "sk-hidden"
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:9"
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == env["DISABLE_TELEMETRY"] == "1"
    assert not {KEY_VAR, "CORRAL_CLI_PATH", "AWS_SECRET_ACCESS_KEY"} & set(env)


async def test_the_mcp_server_lists_and_calls_the_turns_tools() -> None:
    settings = _resolve({}, {"tools": [TOOL, {"type": "web_search"}, "junk"]})
    calls: list[tuple[str, dict[str, Any]]] = []

    async def call_tool(name: str, arguments: dict[str, Any]) -> str:
        calls.append((name, arguments))
        return "the notes"

    async def ask(message: dict[str, Any]) -> dict[str, Any]:
        return await _mcp.answer(message, settings, call_tool)

    hello = await ask({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}})
    assert hello["result"]["capabilities"] == {"tools": {"listChanged": False}}
    listed = await ask({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert [t["name"] for t in listed["result"]["tools"]] == ["sys_os_read"]
    assert listed["result"]["tools"][0]["inputSchema"]["properties"] == {"path": {"type": "string"}}
    params = {"name": "sys_os_read", "arguments": {"path": "n.txt"}}
    done = await ask({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": params})
    assert done == {
        "jsonrpc": "2.0",
        "id": 2,
        "result": {"content": [{"type": "text", "text": "the notes"}]},
    }
    assert calls == [("sys_os_read", {"path": "n.txt"})]
    # Bad input is a JSON-RPC error, never a call.
    other = {"name": "sys_os_shell", "arguments": {}}
    refused = await ask({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": other})
    assert refused["error"]["code"] == _mcp.INVALID_PARAMS
    unknown = await ask({"jsonrpc": "2.0", "id": 4, "method": "resources/list"})
    assert unknown["error"]["code"] == _mcp.METHOD_NOT_FOUND
    assert (await ask({"jsonrpc": "2.0", "method": "notifications/initialized"}))["result"] == {}
    assert len(calls) == 1


async def test_collapsed_raises_what_a_nursery_wrapped() -> None:
    async def fail() -> None:
        raise TurnFailed("x", "boom")

    with pytest.raises(TurnFailed), collapsed():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fail)
            await trio.sleep_forever()
    # Cancellations only: one cancellation, which its scope catches.
    with trio.move_on_after(0.01) as scope:
        with collapsed():
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.sleep_forever)
                await trio.sleep_forever()
    assert scope.cancelled_caught
    # Two errors stay a group.
    with pytest.raises(ExceptionGroup), collapsed():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fail)
            nursery.start_soon(fail)


def test_a_session_is_resumed_only_while_claude_code_still_has_it(tmp_path: Path) -> None:
    save_state(tmp_path, "abc")
    assert resumable(tmp_path, {"session_id": "abc"}) is None  # no transcript
    project = tmp_path / ".claude" / "projects" / "-work"
    project.mkdir(parents=True)
    (project / "abc.jsonl").write_text("{}\n")
    assert resumable(tmp_path, json.loads((tmp_path / "claude-sdk.json").read_text())) == "abc"
    assert resumable(tmp_path, {"session_id": "../abc"}) is None
    assert resumable(tmp_path, {}) is None
