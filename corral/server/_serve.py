"""Running the control plane: the app under hypercorn's trio worker, and ``server.json``.

:func:`serve` is the trio entry point (``python -m corral.server`` calls it, tests call it
in-process): it opens the plane, listens, writes ``server.json`` once the socket is bound,
reports the plane through ``task_status`` and runs until :meth:`ControlPlane.begin_shutdown`
(or until cancelled). A clean stop closes the runner's tunnel with 1012 so it reconnects at
once to the next server on the same port, ends client streams, and gives requests in flight
``graceful_timeout_s`` to finish.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Collection
from pathlib import Path
from typing import cast
from urllib.parse import urlsplit

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve
from hypercorn.typing import ASGIFramework

from ..config import ServerSettings
from ._http import build_app
from ._plane import ControlPlane, PlaneOptions
from ._state import ServerInfo, choose_port, write_server_json

__all__ = ["serve"]

log = logging.getLogger("corral.server")


async def serve(
    state_dir: Path,
    settings: ServerSettings,
    *,
    options: PlaneOptions | None = None,
    harnesses: Collection[str] = (),
    task_status: trio.TaskStatus[ControlPlane] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the embedded control plane until it is shut down.

    Args:
        state_dir: the host's state dir (the plane uses ``state_dir/server``).
        settings: ``[server]`` of ``corral.toml``.
        options: timings and limits; the defaults suit production.
        harnesses: harness kinds the host's config registers (``[actors.harness.options]
            harnesses``), which its runner runs besides those it announces.
        task_status: gets the running :class:`ControlPlane` once it listens and
            ``server.json`` is written (its ``info`` says where).

    Raises:
        ConfigError: the configured port cannot be bound, or the state is unusable.
        StateDirBusy: another control plane runs on this state dir.
    """
    plane = ControlPlane(state_dir, settings, options, harnesses=harnesses)
    try:
        await plane.open()
        port = await trio.to_thread.run_sync(choose_port, settings.host, settings.port, plane.dir)
        # Starlette's and hypercorn's ASGI typings spell the same protocol differently.
        app = cast(ASGIFramework, build_app(plane))
        config = _hypercorn_config(settings.host, port, plane.options)
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(
                functools.partial(hypercorn_serve, app, config, shutdown_trigger=plane.closing.wait)
            )
            bound = urlsplit(binds[0]).port or port
            info = ServerInfo(
                url=f"http://{_url_host(settings.host)}:{bound}",
                port=bound,
                pid=os.getpid(),
                runner_token=plane.runner_token,
                runner_id=plane.runner_id,
                started_at=time.time(),
            )
            await trio.to_thread.run_sync(write_server_json, plane.dir, info)
            plane.info = info
            log.info("control plane listening on %s", info.url)
            task_status.started(plane)
        log.info("control plane stopped")
    finally:
        with trio.CancelScope(shield=True):
            await plane.close()


def _hypercorn_config(host: str, port: int, options: PlaneOptions) -> HypercornConfig:
    config = HypercornConfig()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    # Hypercorn's own messages go through corral's log format.
    config.errorlog = logging.getLogger("corral.server.hypercorn")
    config.graceful_timeout = options.graceful_timeout_s
    # Tunnel frames carry whole request and response bodies; the runner allows 100 MiB.
    config.websocket_max_message_size = 128 * 1024 * 1024
    config.include_server_header = False
    return config


def _url_host(host: str) -> str:
    """The host to put in the URL: a wildcard listener is reached through loopback."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host
