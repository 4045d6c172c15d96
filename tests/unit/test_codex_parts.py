"""The codex kind's pure parts: what Codex is given of a turn's message, a turn's settings,
the session's ``config.toml`` and the CLI's environment (harnesses/codex/_input.py,
_settings.py, _home.py). The kind itself runs through the real CLI in tests/integration."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from corral.harnesses._turn import TurnFailed
from corral.harnesses.codex._home import (
    KEY_VAR,
    Launch,
    cli_env,
    config_text,
    prepare,
    save_thread,
    saved_thread,
)
from corral.harnesses.codex._input import runner_tools, turn_input
from corral.harnesses.codex._settings import provider_of, resolve_settings
from corral.harnesses.protocol import TurnStart


def _user(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": list(parts)}


def _said(role: str, text: str) -> dict[str, Any]:
    part = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": part, "text": text}]}


def test_the_last_user_message_is_the_input_and_the_text_before_it_the_history() -> None:
    csv = base64.b64encode(b"a,b\n1,2\n").decode()
    message = {
        "content": [
            _said("user", "I am Ann"),
            _said("assistant", "Hi"),
            {"type": "function_call", "call_id": "c1", "name": "sys_os_shell", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "done"},
            _user(
                {"type": "input_text", "text": "look"},
                {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
                {"type": "input_file", "file_data": f"data:text/csv;base64,{csv}"},
                {"type": "input_file", "file_data": "data:application/zip;base64,AA=="},
            ),
        ]
    }
    given = turn_input(message)
    assert given.parts == [
        {"type": "text", "text": "look"},
        {"type": "image", "url": "data:image/png;base64,AAAA"},
        {"type": "text", "text": "a,b\n1,2\n"},
    ]
    assert given.text == "look\na,b\n1,2\n"
    # Only the text of the history: another harness's tool calls name tools Codex lacks.
    assert given.history == [_said("user", "I am Ann"), _said("assistant", "Hi")]
    assert turn_input({"content": "just text"}).parts == [{"type": "text", "text": "just text"}]
    assert turn_input({"content": []}).parts == []


def test_the_runners_tools_become_codex_dynamic_tools_in_either_shape() -> None:
    schema = {"type": "object", "properties": {"path": {"type": "string"}}}
    message = {
        "tools": [
            {"type": "function", "function": {"name": "sys_os_read", "parameters": schema}},
            {"type": "function", "name": "sys_list", "description": "list"},
            {"type": "web_search"},
            "not a tool",
        ]
    }
    assert runner_tools(message) == [
        {"type": "function", "name": "sys_os_read", "description": "", "inputSchema": schema},
        {
            "type": "function",
            "name": "sys_list",
            "description": "list",
            "inputSchema": {"type": "object", "properties": {}},
        },
    ]


def _turn(executor: dict[str, Any], **start: Any) -> Any:
    """What resolve_settings reads of a turn."""
    spec = {"name": "coder", "prompt": "Be terse.", "executor": {"harness": "codex", **executor}}
    begin = TurnStart(session_id="s", turn_id="t", spec=spec, message={}, harness="codex", **start)
    return SimpleNamespace(start=begin, spec=spec, message=begin.message)


def test_settings_come_from_the_spec_then_the_workers_environment() -> None:
    env = {"HARNESS_CODEX_API_KEY": "sk-hidden", "HARNESS_CODEX_MODEL": "gpt-env"}
    settings = resolve_settings(_turn({"auth": {"api_key": "$OPENAI_API_KEY"}}), env)
    assert (settings.model, settings.api_key, settings.base_url) == (
        "gpt-env",
        "sk-hidden",
        "https://api.openai.com/v1",
    )
    assert settings.instructions == "Be terse." and settings.idle_timeout_s == 600
    assert "sk-hidden" not in repr(settings)
    local = _turn(
        {"model": "m", "auth": {"base_url": "http://127.0.0.1:9/v1/"}}, model_override="o"
    )
    settings = resolve_settings(local, {})
    assert (settings.model, settings.api_key, settings.base_url) == (
        "o",
        None,
        "http://127.0.0.1:9/v1",
    )
    assert provider_of(settings.base_url) == "127.0.0.1"
    assert provider_of("https://api.openai.com/v1") == "openai"


@pytest.mark.parametrize(
    ("executor", "code", "message"),
    [
        ({}, "config_error", "no model: set executor.model or HARNESS_CODEX_MODEL"),
        ({"model": "m", "base_url": "ftp://x"}, "config_error", "base_url must be an http(s) URL"),
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


def test_the_config_names_the_provider_keeps_the_cli_offline_and_holds_no_key(
    tmp_path: Path,
) -> None:
    launch = Launch("/opt/codex", tmp_path / "home", tmp_path / "work", "http://h:1/v1", "sk-x")
    prepare(launch)
    text = (launch.codex_home / "config.toml").read_text()
    assert text == config_text(launch)
    for line in (
        'model_provider = "corral"',
        'base_url = "http://h:1/v1"',
        'wire_api = "responses"',
        f'env_key = "{KEY_VAR}"',
        "[analytics]\nenabled = false",
        "[features]\nplugins = false",
        '[shell_environment_policy]\ninherit = "core"',
    ):
        assert line in text
    assert "sk-x" not in text
    assert oct(launch.codex_home.stat().st_mode & 0o777) == "0o700"
    assert launch.workdir.is_dir() and launch.tmp.is_dir()
    keyless = Launch("/opt/codex", tmp_path / "h2", tmp_path / "w2", 'http://h:1/"v1"', None)
    assert "requires_openai_auth = false" in config_text(keyless)
    assert 'base_url = "http://h:1/\\"v1\\""' in config_text(keyless)  # quoted as TOML reads it


def test_the_cli_environment_is_built_not_inherited(tmp_path: Path) -> None:
    launch = Launch("/opt/clis/codex", tmp_path / "home", tmp_path / "w", "http://h/v1", "sk-x")
    worker = {
        "PATH": "/usr/bin",
        "LANG": "C.UTF-8",
        "HARNESS_CODEX_API_KEY": "sk-x",
        "CORRAL_CLI_PATH": "/opt/clis",
        "AWS_SECRET_ACCESS_KEY": "nope",
    }
    assert cli_env(launch, worker) == {
        "PATH": "/opt/clis:/usr/bin",
        "LANG": "C.UTF-8",
        "HOME": str(tmp_path / "home"),
        "CODEX_HOME": str(tmp_path / "home" / ".codex"),
        "TMPDIR": str(tmp_path / "home" / "tmp"),
        KEY_VAR: "sk-x",
    }


def test_the_thread_is_saved_and_read_back_and_a_bad_file_is_no_thread(tmp_path: Path) -> None:
    assert saved_thread(tmp_path) is None
    save_thread(tmp_path, "thr-1")
    assert saved_thread(tmp_path) == "thr-1"
    (tmp_path / "corral-thread.json").write_text(json.dumps({"thread": 7}))
    assert saved_thread(tmp_path) is None
    (tmp_path / "corral-thread.json").write_text("{torn")
    assert saved_thread(tmp_path) is None
