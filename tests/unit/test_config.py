"""corral.toml: defaults, and errors that name the key."""

from __future__ import annotations

import importlib
from pathlib import Path

import msgspec
import pytest

from corral import ConfigError
from corral.config import (
    BUILTIN_ACTORS,
    BUILTIN_OPTIONS,
    Config,
    actor_plan,
    check_options,
    listen_address,
    load_config,
    parse_config,
    resolve_state_dir,
)


def test_defaults() -> None:
    c = load_config(None)
    assert c == Config()
    assert c.liveness.interval_s == 1.0 and c.liveness.liveness == 3
    assert [name for name, _, _ in actor_plan(c)] == list(BUILTIN_ACTORS)
    # The journal starts first: every other actor may append to it from its first message.
    assert next(iter(BUILTIN_ACTORS)) == "journal"
    # The test-only echo actor runs only where a config names it (tests/_echo.py).
    assert "echo" not in BUILTIN_ACTORS


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"bus": {"hwm": 0}}, "bus.hwm"),
        ({"bus": {"hwm": "x"}}, "bus.hwm"),
        ({"liveness": {"interval_s": -1}}, "liveness.interval_s"),
        ({"supervisor": {"intensity": -1}}, "supervisor.intensity"),
        ({"nope": 1}, "nope"),
        ({"actors": {"journal": {"restart": "sometimes"}}}, "actors.*.restart"),
        ({"actors": {"x": {}}}, "actors.x.target"),
        ({"actors": {"x": {"target": "no colon"}}}, "actors.x.target"),
        ({"actors": {"Bad Name": {"target": "a:B"}}}, "actors.Bad Name"),
        ({"supervisor": {"drain_timeout_s": -1}}, "supervisor.drain_timeout_s"),
        ({"metrics": {"listen": "localhost"}}, "metrics.listen"),
        ({"metrics": {"listen": "127.0.0.1:99999"}}, "metrics.listen"),
        ({"metrics": {"listen": ":9464"}}, "metrics.listen"),
        ({"metrics": {"listen": 9464}}, "metrics.listen"),
        ({"metrics": {"port": 9464}}, "metrics.port"),
        ({"logging": {"level": "verbose"}}, "logging.level"),
        ({"logging": {"format": "yaml"}}, "logging.format"),
        ({"logging": {"backups": -1}}, "logging.backups"),
        ({"logging": {"fiel": "x.log"}}, "logging.fiel"),
    ],
)
def test_invalid_values_name_the_key(data: dict, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    assert info.value.key == key


def test_bad_toml_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "c.toml"
    bad.write_text("[bus\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.toml")


def test_paths_are_relative_to_the_config_file_not_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tmp_path / "etc" / "corral.toml"
    conf.parent.mkdir()
    conf.write_text(
        '[server]\nagents_dirs = ["agents", "../shared", "~/mine", "/srv/agents"]\n'
        '[logging]\nfile = "logs/corral.log"\n'
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", "/home/someone")
    config = load_config(Path("etc/corral.toml"))
    assert config.server.agents_dirs == [
        str(tmp_path / "etc" / "agents"),
        str(tmp_path / "etc" / ".." / "shared"),
        "/home/someone/mine",
        "/srv/agents",
    ]
    assert config.logging.file == str(tmp_path / "etc" / "logs" / "corral.log")
    assert load_config(None).logging.file is None


def test_extra_and_disabled_actors() -> None:
    c = parse_config({"actors": {"tools": {"enabled": False}, "mine": {"target": "pkg.mod:Mine"}}})
    builtins = [(n, t) for n, t in BUILTIN_ACTORS.items() if n != "tools"]
    assert [(n, t) for n, t, _ in actor_plan(c)] == [*builtins, ("mine", "pkg.mod:Mine")]


def test_state_dir_resolution(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CORRAL_STATE_DIR", str(tmp_path / "env"))
    assert resolve_state_dir(str(tmp_path / "flag")) == tmp_path / "flag"
    assert resolve_state_dir(None) == tmp_path / "env"
    monkeypatch.delenv("CORRAL_STATE_DIR")
    assert resolve_state_dir(None, Config(state_dir=str(tmp_path / "cfg"))) == tmp_path / "cfg"


def test_every_builtin_actor_names_its_options_struct() -> None:
    assert BUILTIN_OPTIONS.keys() == BUILTIN_ACTORS.keys()
    for name, where in BUILTIN_OPTIONS.items():
        module, _, attr = where.partition(":")
        schema = getattr(importlib.import_module(module), attr)
        assert issubclass(schema, msgspec.Struct) and schema.__struct_config__.forbid_unknown_fields
        assert check_options(name, {}, schema) == schema(), "every option has a default"


@pytest.mark.parametrize(
    ("options", "message", "key"),
    [
        (
            {"turn_timout_s": 5},
            "Object contains unknown field `turn_timout_s` - at `$.actors.dispatch.options`",
            "actors.dispatch.options.turn_timout_s",
        ),
        (
            {"turn_timeout_s": "soon"},
            "Expected `float`, got `str` - at `$.actors.dispatch.options.turn_timeout_s`",
            "actors.dispatch.options.turn_timeout_s",
        ),
        (
            {"runners": [{"id": "r"}]},
            "Object missing required field `server` - at `$.actors.dispatch.options.runners[0]`",
            "actors.dispatch.options.runners[0].server",
        ),
    ],
)
def test_actor_options_errors_name_the_key(options: dict, message: str, key: str) -> None:
    from corral.actors.dispatch import DispatchOptions

    with pytest.raises(ConfigError) as info:
        check_options("dispatch", options, DispatchOptions)
    assert str(info.value) == f"invalid config: {message}"
    assert info.value.key == key


def test_metrics_listen_addresses_and_the_drain_default() -> None:
    assert Config().metrics.listen is None, "no endpoint unless asked"
    assert Config().supervisor.drain_timeout_s == 30.0
    assert listen_address("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert listen_address("[::1]:9464") == ("::1", 9464)
    assert listen_address("0.0.0.0:0") == ("0.0.0.0", 0)
    config = parse_config({"metrics": {"listen": "127.0.0.1:9464"}})
    assert config.metrics.listen == "127.0.0.1:9464"
