"""What the host hands each actor it starts: its ChildSpec, built from its role.

Every difference between actors is a field of their role (:class:`corral.config.ActorRole`),
so :class:`ActorSpecs` reads the role and ``corral.toml``, never an actor's name: the restart
type and shutdown timeout of its :class:`~corral.actors._specs.ChildSpec`, the options it is
handed (the host's runners, the workspace, which other actors run) and the variables that
reach it hidden (:func:`corral._child_env.hide`). It is apart from
:mod:`corral.actors.host` because it is pure: a test builds an actor's spec from a
``Config`` without starting a host. :func:`check_actor_options` checks those options before
the host starts anything.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from .._child_env import NETWORK_VARS, actor_env, hide, spec_variables
from .._lifeline import start_time
from .._zygote import HTTP_CLIENT_MODULES
from ..config import (
    BUILTIN_ACTORS,
    BUILTIN_OPTIONS,
    ActorSettings,
    Config,
    RunnerSettings,
    actor_plan,
    check_options,
    role_of,
)
from ..instance import Instance
from ._specs import ChildSpec

log = logging.getLogger("corral.host")


#: What an actor process runs first (``python -m ENTRY``).
ENTRY = "corral.actors._entry"


def actor_preload(config: Config) -> tuple[str, ...]:
    """What the host's zygote imports: the actors' entry, the class of each actor the host
    runs, ``module:Class`` (the dispatch and gateway packages load their classes' modules only
    when the class is looked up), and what an HTTP client imports on its first request (the
    dispatch, policy and tools actors make them): a forked actor then imports nothing."""
    targets = sorted({target for _, target, _ in actor_plan(config)})
    return (ENTRY, *targets, *HTTP_CLIENT_MODULES)


@dataclass(frozen=True, slots=True)
class ActorSpecs:
    """The specs of one host's actors: its ``corral.toml``, its state dir and the runners it
    serves (ids resolved), the same for every actor."""

    config: Config
    instance: Instance
    runners: list[RunnerSettings]

    def spec(self, name: str, target: str, settings: ActorSettings) -> ChildSpec:
        """How the host starts actor ``name`` (``module:Class`` ``target``) and restarts it."""
        role = role_of(name)
        return ChildSpec(
            name=name,
            argv=[sys.executable, "-m", ENTRY],
            env=self._environ(name, target, settings),
            restart=settings.restart or role.restart,
            shutdown_timeout_s=settings.shutdown_timeout_s
            or role.shutdown_timeout_s
            or self.config.supervisor.shutdown_timeout_s,
            label=f"actor {name!r}",
        )

    def _environ(self, name: str, target: str, settings: ActorSettings) -> dict[str, str]:
        """An actor's environment: its environ block holds only :func:`actor_env` and the
        state dir; its spec (the runner tokens in it), the proxy settings of an actor that
        talks to servers and, for the actor that expands ``$VAR`` in agent specs, the host's
        variables it expands them from reach it hidden (:func:`corral._child_env.hide`)."""
        hidden = {"CORRAL_CHILD": json.dumps(self.child_record(name, target, settings))}
        role = role_of(name)
        if role.serves_runners:
            hidden.update({k: os.environ[k] for k in NETWORK_VARS if k in os.environ})
        if role.expands_vars:
            hidden.update(spec_variables())
        return hide({**actor_env(), "CORRAL_STATE_DIR": str(self.instance.state_dir)}, hidden)

    def child_record(self, name: str, target: str, settings: ActorSettings) -> dict[str, Any]:
        """The ``CORRAL_CHILD`` an actor reads first (:mod:`corral.actors._entry`): its name,
        target, bus and state dir, and its options with what its role adds to them."""
        options = dict(settings.options)
        role = role_of(name)
        if role.serves_runners and self.runners:
            # The host's runners, after any listed in the actor's own options.
            options["runners"] = [
                *options.get("runners", []),
                *msgspec.to_builtins(self.runners),
            ]
        if role.gets_workspace and self.config.workspace:
            options["workspace"] = self.config.workspace
        tools = self.config.actors.get("tools")
        if role.gets_workspace and tools is not None and "os_env_root" in tools.options:
            # Where the tools keep per-session working directories: a CLI harness runs there.
            options.setdefault("os_env_root", tools.options["os_env_root"])
        if role.knows_actors:
            plan = {actor for actor, _, _ in actor_plan(self.config)}
            for option, other in role.knows_actors.items():
                options.setdefault(option, other in plan)
        return {
            "name": name,
            "target": target,
            "endpoint": self.instance.bus_endpoint,
            "state_dir": str(self.instance.state_dir),
            "options": options,
            "bus": msgspec.to_builtins(self.config.bus),
            "liveness": msgspec.to_builtins(self.config.liveness),
            "parent_pid": os.getpid(),
            # Tells the host from a process that reused its pid (an actor forked by the
            # host's zygote watches the host through a pidfd: corral.actors._entry).
            "parent_start": start_time(os.getpid()),
        }


def check_actor_options(config: Config) -> dict[str, Any]:
    """Decode the options of every built-in actor the host will run with its options Struct;
    each one decoded, by actor.

    The host does it before it starts anything, so that a typo in ``[actors.<name>.options]``
    stops ``corral up`` with the key named instead of crash-looping the actor. An actor whose
    ``target`` replaces the built-in class is left to check its own options, and so is one
    whose module does not import here (its child process reports that, and crash-loops).

    Raises:
        ConfigError: naming the first bad key (``actors.dispatch.options.turn_timout_s``).
    """
    decoded: dict[str, Any] = {}
    for name, target, settings in actor_plan(config):
        where = BUILTIN_OPTIONS.get(name)
        if where is None or target != BUILTIN_ACTORS[name]:
            continue
        module, _, attr = where.partition(":")
        try:
            schema = getattr(importlib.import_module(module), attr)
        except Exception as exc:
            log.warning("cannot import %s in the host: %s", where, exc)
            continue
        decoded[name] = check_options(name, settings.options, schema)
    return decoded


def forks_from_zygotes(config: Config, options: Mapping[str, Any]) -> bool:
    """Whether an actor of the host forks its children from a zygote of its own (a built-in
    actor whose decoded ``options`` (:func:`check_actor_options`) say ``zygote = true``: the
    harness actor's workers, by default), in an actor forked from the host's zygote (which
    hands it the seed socket)."""
    if not config.supervisor.zygote:
        return False
    return any(getattr(o, "zygote", False) for o in options.values())
