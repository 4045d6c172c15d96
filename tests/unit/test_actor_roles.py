"""The host builds each actor's ChildSpec from its role (config.BUILTIN), never its name."""

from __future__ import annotations

import json
import os
from pathlib import Path

import msgspec
import pytest

from corral import config as config_module
from corral._child_env import HIDDEN_ENV
from corral._lifeline import start_time
from corral._zygote import HTTP_CLIENT_MODULES
from corral.actors._actor_specs import ENTRY, actor_preload
from corral.actors.host import Host
from corral.config import BUILTIN, actor_plan, parse_config


def _specs(host: Host) -> dict:
    return {name: host._actor_spec(name, target, s) for name, target, s in actor_plan(host.config)}


def _options(spec) -> dict:
    return json.loads(spec.env["CORRAL_CHILD"])["options"]


def test_an_actor_spec_is_its_role_overridden_where_corral_toml_allows(tmp_path: Path) -> None:
    config = parse_config(
        {
            "supervisor": {"shutdown_timeout_s": 4.0},
            "actors": {
                "tools": {"restart": "transient", "shutdown_timeout_s": 2.0},
                "mine": {"target": "pkg.mod:Mine"},
            },
        }
    )
    specs = _specs(Host(config, tmp_path))
    assert (specs["tools"].restart, specs["tools"].shutdown_timeout_s) == ("transient", 2.0)
    for name, role in BUILTIN.items():
        if name != "tools":
            assert specs[name].restart == role.restart == "permanent"
            assert specs[name].shutdown_timeout_s == 4.0, "the role names none: supervisor's"
        assert specs[name].label == f"actor {name!r}" and specs[name].bus_peer
    assert (specs["mine"].restart, specs["mine"].shutdown_timeout_s) == ("permanent", 4.0)
    assert _options(specs["dispatch"])["harness_actor"] is True
    assert "harness_actor" not in _options(specs["mine"])


def test_what_the_host_hands_an_actor_follows_its_role_not_its_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Give the journal the tools' role fields and a restart type of its own: the host treats
    it so, and the tools, stripped of theirs, get nothing."""
    roles = dict(BUILTIN)
    roles["journal"] = msgspec.structs.replace(
        BUILTIN["journal"], gets_workspace=True, restart="transient", shutdown_timeout_s=1.5
    )
    roles["tools"] = msgspec.structs.replace(BUILTIN["tools"], gets_workspace=False)
    monkeypatch.setattr(config_module, "BUILTIN", roles)
    monkeypatch.setattr("corral.actors.host.BUILTIN", roles)
    config = parse_config({"workspace": "/srv/ws", "actors": {"harness": {"enabled": False}}})
    specs = _specs(Host(config, tmp_path))
    assert _options(specs["journal"])["workspace"] == "/srv/ws"
    assert (specs["journal"].restart, specs["journal"].shutdown_timeout_s) == ("transient", 1.5)
    assert "workspace" not in _options(specs["tools"])
    assert _options(specs["dispatch"])["harness_actor"] is False, "harness is disabled"


def test_only_the_role_that_expands_vars_is_handed_the_hosts_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """H-10: ``$VAR`` in an agent spec is read from the host's environment, by the actor whose
    role says ``expands_vars`` (the harness) and by no other, nor by an actor of your own that
    runs the harness class under another name. Move the flag to the journal and the journal
    gets the variables (hidden), the harness none."""
    monkeypatch.setenv("PROVIDER_KEY_FOR_VAR", "sk-host")
    harness_class = {"target": BUILTIN["harness"].target}
    config = parse_config({"actors": {"mine": harness_class}})

    def holders() -> set[str]:
        specs = _specs(Host(config, tmp_path))
        held = {n for n, s in specs.items() if s.env.get("PROVIDER_KEY_FOR_VAR") == "sk-host"}
        for name in held:
            assert "PROVIDER_KEY_FOR_VAR" in json.loads(specs[name].env[HIDDEN_ENV])
        return held

    assert holders() == {"harness"}
    roles = dict(BUILTIN)
    roles["journal"] = msgspec.structs.replace(BUILTIN["journal"], expands_vars=True)
    roles["harness"] = msgspec.structs.replace(BUILTIN["harness"], expands_vars=False)
    monkeypatch.setattr(config_module, "BUILTIN", roles)
    assert holders() == {"journal"}


def test_the_hosts_zygote_preloads_the_entry_and_the_module_of_each_actor_it_runs() -> None:
    """#20: a forked actor imports nothing of its own; an actor not run is not preloaded."""
    config = parse_config(
        {"actors": {"tools": {"enabled": False}, "mine": {"target": "pkg.mod:Mine"}}}
    )
    preload = actor_preload(config)
    assert preload[0] == ENTRY
    targets = {target for _, target, _ in actor_plan(config)}
    assert set(preload[1:]) == targets | set(HTTP_CLIENT_MODULES)
    assert "pkg.mod:Mine" in preload and "corral.actors.tools:ToolsActor" not in preload


def test_an_actor_spec_names_the_hosts_pid_and_start_time(tmp_path: Path) -> None:
    """A forked actor's parent is the zygote: it finds the host by pid and start time."""
    spec = _specs(Host(parse_config({}), tmp_path))["journal"]
    child = json.loads(spec.env["CORRAL_CHILD"])
    assert spec.argv[1:] == ["-m", ENTRY]
    assert child["parent_pid"] == os.getpid()
    assert child["parent_start"] == start_time(os.getpid()) is not None
