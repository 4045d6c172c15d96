"""``python -m corral.server``: run the embedded control plane in the foreground.

``python -m corral.server --state-dir DIR [--config FILE] [--host H] [--port P]`` runs until
SIGTERM or SIGINT, then stops cleanly. Settings come from ``[server]`` of ``corral.toml``;
the flags override them. Exit codes: 0 after a clean stop, 1 when the server could not start
(the reason is logged), 2 for a usage or config error.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import sys
from pathlib import Path

import msgspec
import trio

from .. import logs
from .._exceptions import ConfigError, CorralError
from .._proctitle import set_title
from ..config import ServerSettings, load_config, resolve_state_dir
from ._serve import serve

log = logging.getLogger("corral.server")


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 0-65535, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    """Parse the flags, run the server, return the exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m corral.server",
        description="Run corral's embedded control plane (the server side of the runner tunnel).",
    )
    parser.add_argument("--state-dir", type=Path, help="state dir (env CORRAL_STATE_DIR)")
    parser.add_argument("--config", type=Path, help="corral.toml; [server] is read")
    parser.add_argument("--host", help="address to listen on (default: [server].host)")
    parser.add_argument("--port", type=_port, help="port (0: reuse the last one, else any)")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
        # Started by a host: log as it does; on its own: as its config says.
        handed = logs.SETTINGS_ENV in os.environ
        logs.setup("server", None if handed else logs.resolve(config.logging), strict=not handed)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    settings = config.server
    if args.host is not None:
        settings = msgspec.structs.replace(settings, host=args.host)
    if args.port is not None:
        settings = msgspec.structs.replace(settings, port=args.port)
    state_dir = resolve_state_dir(str(args.state_dir) if args.state_dir else None, config)
    set_title(f"corral: server {state_dir}")
    harness = config.actors.get("harness")
    registered = harness.options.get("harnesses") if harness is not None else None
    code = 0
    try:
        trio.run(_run, state_dir, settings, list(registered or {}))
    except* ConfigError as group:
        _log_causes(group)
        code = 2
    except* CorralError as group:
        _log_causes(group)
        code = 1
    except* OSError as group:
        _log_causes(group)
        code = 1
    return code


def _log_causes(group: BaseExceptionGroup[BaseException]) -> None:
    for error in group.exceptions:
        log.error("cannot start: %s", error)


async def _run(state_dir: Path, settings: ServerSettings, harnesses: list[str]) -> None:
    # The receiver is open before the server starts, so an early SIGTERM still stops it
    # cleanly instead of killing it halfway through writing its state.
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            plane = await nursery.start(
                functools.partial(serve, state_dir, settings, harnesses=harnesses)
            )
            async for signum in signals:
                log.info("%s: shutting down", signal.Signals(signum).name)
                plane.begin_shutdown()
                break


if __name__ == "__main__":
    sys.exit(main())
