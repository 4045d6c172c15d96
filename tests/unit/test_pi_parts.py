"""The pi kind's parts: what pi is given of a turn's message, a turn's settings, the session's
pi directory and the CLI's command line and environment (harnesses/pi/_input.py,
_settings.py, _home.py), and the RPC client against a stand-in pi on real pipes, so bad
input can be sent on purpose (harnesses/pi/_rpc.py). The kind itself runs through the real
CLI in tests/integration/test_pi_*.py."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from corral.harnesses._cli_process import CliExited, open_cli
from corral.harnesses._turn import TurnFailed
from corral.harnesses.pi._home import (
    GATE,
    GATE_TITLE,
    OFFLINE,
    TOOL_TITLE,
    Launch,
    argv,
    cli_env,
    prepare,
)
from corral.harnesses.pi._input import SEED_HEAD, prompt_text, runner_tools, turn_input
from corral.harnesses.pi._rpc import CommandFailed, PiRpc, UiRequest
from corral.harnesses.pi._settings import provider_of, resolve_settings
from corral.harnesses.protocol import TurnStart


def _said(role: str, text: str) -> dict[str, Any]:
    part = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": part, "text": text}]}


def test_the_last_user_message_is_the_prompt_and_the_words_before_it_the_history() -> None:
    message = {
        "content": [
            _said("user", "I am Ann"),
            _said("assistant", "Hi"),
            {"type": "function_call", "call_id": "c1", "name": "sys_os_shell", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "done"},
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "look"},
                    {"type": "input_image", "image_url": {"url": "data:image/png;base64,AAAA"}},
                    {"type": "input_image", "image_url": "https://example.com/x.png"},
                ],
            },
        ]
    }
    given = turn_input(message)
    assert given.text == "look"
    assert given.images == [{"type": "image", "data": "AAAA", "mimeType": "image/png"}]
    # Only the words of the history: another harness's tool calls name tools pi lacks.
    assert given.history == [("user", "I am Ann"), ("assistant", "Hi")]
    assert prompt_text(given, seed=False) == "look"
    assert prompt_text(given, seed=True) == (
        f"{SEED_HEAD}\n\nUser: I am Ann\n\nAssistant: Hi\n\nThe user's new message:\n\nlook"
    )
    assert turn_input({"content": "just text"}).text == "just text"
    # No user message last: nothing to prompt with.
    assert turn_input({"content": [_said("assistant", "x")]}).text == ""


def test_the_runners_tools_are_taken_in_either_shape_with_their_schema_as_json() -> None:
    schema = {"type": "object", "properties": {"path": {"type": "string"}}}
    message = {
        "tools": [
            {"type": "function", "function": {"name": "sys_os_read", "parameters": schema}},
            {"type": "function", "name": "sys_list", "description": "list"},
            {"type": "web_search"},
            "not a tool",
        ]
    }
    assert runner_tools(message) == (
        ("sys_os_read", "", json.dumps(schema, sort_keys=True)),
        ("sys_list", "list", '{"properties": {}, "type": "object"}'),
    )
    assert runner_tools({}) == ()


def _turn(executor: dict[str, Any], **start: Any) -> Any:
    """What resolve_settings reads of a turn."""
    spec = {"name": "coder", "prompt": "Be terse.", "executor": {"harness": "pi", **executor}}
    begin = TurnStart(session_id="s", turn_id="t", spec=spec, message={}, harness="pi", **start)
    return SimpleNamespace(start=begin, spec=spec, message=begin.message)


def test_settings_come_from_the_spec_then_the_workers_environment() -> None:
    env = {"HARNESS_PI_API_KEY": "sk-hidden", "HARNESS_PI_MODEL": "gpt-env"}
    settings = resolve_settings(_turn({"auth": {"api_key": "$OPENAI_API_KEY"}}), env)
    assert (settings.model, settings.api_key, settings.base_url, settings.api) == (
        "gpt-env",
        "sk-hidden",
        "https://api.openai.com/v1",
        "openai-responses",
    )
    assert settings.instructions == "Be terse." and settings.idle_timeout_s == 600
    assert "sk-hidden" not in repr(settings)
    local = _turn(
        {"model": "m", "auth": {"base_url": "http://127.0.0.1:9/v1/"}}, model_override="o"
    )
    settings = resolve_settings(local, {})
    assert (settings.model, settings.api_key, settings.base_url, settings.api) == (
        "o",
        None,
        "http://127.0.0.1:9/v1",
        "openai-completions",
    )
    anthropic = _turn({"model": "c", "base_url": "https://api.anthropic.com", "auth": {}})
    assert resolve_settings(anthropic, {"HARNESS_PI_API_KEY": "k"}).api == "anthropic-messages"
    chosen = _turn({"model": "m", "api": "openai-responses", "base_url": "http://h:1/v1"})
    assert resolve_settings(chosen, {}).api == "openai-responses"
    assert provider_of("http://127.0.0.1:9/v1") == "127.0.0.1"
    assert provider_of("https://api.anthropic.com") == "anthropic"


@pytest.mark.parametrize(
    ("executor", "code", "message"),
    [
        ({}, "config_error", "no model: set executor.model or HARNESS_PI_MODEL"),
        ({"model": "m", "base_url": "ftp://x"}, "config_error", "base_url must be an http(s) URL"),
        ({"model": "m", "api": "grpc"}, "config_error", "api must be one of openai-completions"),
        (
            {"model": "m", "auth": {"api_key": "k"}, "idle_timeout_s": -1},
            "config_error",
            "idle_timeout_s",
        ),
        ({"model": "m"}, "missing_credentials", "no API key for https://api.openai.com/v1"),
    ],
)
def test_bad_settings_fail_the_turn_naming_what_is_wrong(
    executor: dict[str, Any], code: str, message: str
) -> None:
    with pytest.raises(TurnFailed) as failed:
        resolve_settings(_turn(executor), {})
    assert failed.value.code == code and failed.value.message.startswith(message)


def _launch(tmp_path: Path, **changes: Any) -> Launch:
    fields: dict[str, Any] = {
        "cli_path": "/opt/clis/pi",
        "home": tmp_path / "home",
        "workdir": tmp_path / "work",
        "base_url": "http://h:1/v1",
        "api": "openai-completions",
        "model": "m",
        "instructions": "--looks like an option",
        "api_key": "sk-x",
        **changes,
    }
    return Launch(**fields)


def test_the_session_dir_holds_the_provider_the_gate_and_the_instructions(
    tmp_path: Path,
) -> None:
    launch = _launch(tmp_path)
    prepare(launch)
    assert launch.agent_dir == tmp_path / "home" / ".pi" / "agent"
    assert (launch.agent_dir / "models.json").stat().st_mode & 0o777 == 0o600
    gate = (launch.agent_dir / GATE).read_text()
    assert "ctx.ui.confirm" in gate and GATE_TITLE in gate and "block: true" in gate
    assert (
        "const RUNNER_TOOLS: Array<{ name: string; description: string; parameters: any }> = [];"
        in gate
    )
    tool = ("sys_os_read", "", '{"type": "object"}')
    prepare(_launch(tmp_path, tools=(tool,)))
    gate = (launch.agent_dir / GATE).read_text()
    assert TOOL_TITLE in gate and "ctx.ui.input" in gate
    registered = (
        '[{"name": "sys_os_read", "description": "sys_os_read", "parameters": {"type": "object"}}]'
    )
    assert f"parameters: any }}> = {registered};" in gate
    line = argv(launch)
    assert line[:9] == [
        "/opt/clis/pi", "--mode", "rpc", "--no-session", "--provider", "corral", "--model",
        "m", "--no-extensions",
    ]  # fmt: skip
    assert line[9:] == [
        "-e",
        str(launch.agent_dir / GATE),
        "--append-system-prompt",
        str(launch.agent_dir / "corral-instructions.md"),
    ]
    assert "--append-system-prompt" not in argv(_launch(tmp_path, instructions=None))
    # Rewritten whole at the next start: a key removed is gone.
    prepare(_launch(tmp_path, api_key=None))
    assert "sk-x" not in (launch.agent_dir / "models.json").read_text()


def test_the_cli_runs_offline_on_its_own_node_with_its_own_home_and_no_key(
    tmp_path: Path,
) -> None:
    launch = _launch(tmp_path)
    worker = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HARNESS_PI_API_KEY": "sk-x"}
    env = cli_env(launch, worker)
    assert env == {
        "PATH": "/opt/clis:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": str(tmp_path / "home"),
        "PI_CODING_AGENT_DIR": str(launch.agent_dir),
        **OFFLINE,
    }


#: A stand-in pi: answers commands by id, says things out of turn, asks a dialog.
_STAND_IN = textwrap.dedent(
    """
    import json, sys

    def send(obj):
        print(json.dumps(obj), flush=True)

    for line in sys.stdin:
        msg = json.loads(line)
        kind = msg.get("type")
        if kind == "prompt":
            print("not json", flush=True)
            send({"type": "response", "id": "nobody", "command": "prompt", "success": True})
            send({"type": "response", "id": msg["id"], "command": "prompt", "success": True,
                  "data": {"disposition": "started"}})
            send({"type": "extension_ui_request", "id": "q1", "method": "confirm",
                  "title": "t", "message": "m"})
        elif kind == "bad":
            send({"type": "response", "id": msg["id"], "command": "bad", "success": False,
                  "error": "Unknown command"})
        elif kind == "extension_ui_response":
            send({"type": "agent_settled", "aborted": False, "answer": msg})
        elif kind == "exit":
            sys.exit(3)
    """
)


async def test_the_client_matches_responses_by_id_and_hands_events_to_the_listener(
    tmp_path: Path,
) -> None:
    script = tmp_path / "stand_in.py"
    script.write_text(_STAND_IN)
    async with (
        open_cli([sys.executable, str(script)], env={}, cwd=tmp_path) as cli,
        trio.open_nursery() as nursery,
    ):
        rpc = PiRpc(cli)

        async def read() -> None:
            with pytest.raises(CliExited):
                await rpc.read()

        nursery.start_soon(read)
        with rpc.listen() as events:
            assert await rpc.command("prompt", message="hi") == {"disposition": "started"}
            assert rpc.answered
            asked = await events.receive()
            assert asked["method"] == "confirm"
            await rpc.answer(UiRequest(id="q1", method="confirm"), confirmed=True)
            settled = await events.receive()
        assert settled["answer"] == {"type": "extension_ui_response", "id": "q1", "confirmed": True}
        with pytest.raises(CommandFailed, match=r"^pi refused bad: Unknown command$"):
            await rpc.command("bad")
        with pytest.raises(CliExited, match="exit code 3"):
            await rpc.command("exit")
        assert isinstance(rpc.ended, CliExited)
        with rpc.listen() as events:
            assert [e async for e in events] == []  # ended: the channel is closed at once
