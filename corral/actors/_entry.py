"""The first code a child actor process runs: ``python -m corral.actors._entry``.

The parent passes everything in the ``CORRAL_CHILD`` variable (JSON), handed over hidden
(:mod:`corral._child_env`: the runner tokens in it must not show in the environ block): the
actor's name and ``module:Class``, the bus endpoint, the state dir, the actor's options and
the bus/liveness settings. The child arranges to die with the host, connects to the bus
with its own zmq context, and serves until SIGTERM.

An actor exec'd by the host asks the kernel for SIGKILL when its parent dies. One forked by
the host's zygote (:mod:`corral._zygote`) has the zygote for its parent, whose death must not
take the actor with it: it watches a pidfd on the host instead, as a harness worker does.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import msgspec
import trio

from .. import logs
from .._child_env import take_hidden_env
from .._heap import release_when_quiet
from .._lifeline import die_with_host, die_with_parent, host_lifeline
from .._proctitle import set_title
from ..bus import open_peer
from ..config import BusSettings, LivenessSettings
from ._actor import Actor, ActorContext

log = logging.getLogger("corral.actors.entry")


def load_target(target: str) -> type[Actor]:
    """Import ``module:Class``."""
    module_name, _, attr = target.partition(":")
    cls = getattr(importlib.import_module(module_name), attr)
    if not (isinstance(cls, type) and issubclass(cls, Actor)):
        raise TypeError(f"{target} is not an Actor")
    return cls


async def serve_actor(cls: type[Actor], spec: dict[str, Any], lifeline: int | None = None) -> None:
    """Connect to the bus and run the actor until SIGTERM/SIGINT or a Stop message
    (``lifeline``: a pidfd on the host, whose exit ends this process at once)."""
    bus = msgspec.convert(spec["bus"], BusSettings)
    liveness = msgspec.convert(spec["liveness"], LivenessSettings)
    ctx = ActorContext(
        name=spec["name"],
        state_dir=Path(spec["state_dir"]),
        options=spec.get("options", {}),
        host_pid=int(spec["parent_pid"]),
        host_start=spec.get("parent_start"),
    )
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with open_peer(
            spec["name"], spec["endpoint"], bus=bus, liveness=liveness, accepts=cls.inbound()
        ) as peer:
            actor = cls(ctx, peer)
            async with trio.open_nursery() as nursery:
                if lifeline is not None:
                    nursery.start_soon(die_with_host, lifeline)

                async def stop_on_signal() -> None:
                    async for signum in signals:
                        log.info("%s: stopping on %s", ctx.name, signal.Signals(signum).name)
                        nursery.cancel_scope.cancel()

                nursery.start_soon(stop_on_signal)
                nursery.start_soon(release_when_quiet, peer.traffic)
                try:
                    await actor.serve()
                finally:
                    nursery.cancel_scope.cancel()
                    with trio.CancelScope(shield=True), trio.move_on_after(2):
                        await actor.terminate()


def main() -> None:
    """Entry point of a child actor process."""
    take_hidden_env()  # its spec and secrets come through a memfd, not its environ block
    spec = json.loads(os.environ.pop("CORRAL_CHILD"))
    lifeline = _tie_to_host(int(spec["parent_pid"]), spec.get("parent_start"))
    set_title(f"corral: {spec['name']}")
    logs.setup(spec["name"])
    try:
        cls = load_target(spec["target"])
    except Exception:
        log.exception("cannot load actor %s", spec["target"])
        sys.exit(78)
    trio.run(serve_actor, cls, spec, lifeline)


def _tie_to_host(host_pid: int, host_start: int | None) -> int | None:
    """Die with the host: by the kernel's parent-death signal when the host is the parent
    (None), else through a pidfd on it (returned). Exits now if the host is gone."""
    if os.getppid() == host_pid:
        die_with_parent(host_pid)
        return None
    return host_lifeline(host_pid, host_start)


if __name__ == "__main__":
    main()
