"""The host's control socket: one JSON request line in, one JSON response line out.

The socket file is created with mode 0600 inside the state dir, so only the host's user can
inspect or steer it. Requests are ``{"op": "status", ...}``; responses are
``{"ok": true, "result": ...}`` or ``{"ok": false, "error": "..."}``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import socket as stdsocket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

log = logging.getLogger("corral.control")

Op = Callable[[dict[str, Any]], Awaitable[Any]]
_MAX_REQUEST = 1024 * 1024


async def serve_control(
    path: Path, ops: dict[str, Op], *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Listen on ``path`` and answer requests with ``ops`` until cancelled."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    sock = trio.socket.socket(stdsocket.AF_UNIX, stdsocket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        await sock.bind(str(path))
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    sock.listen(64)
    listener = trio.SocketListener(sock)
    try:
        async with trio.open_nursery() as nursery:
            task_status.started()
            await trio.serve_listeners(
                functools.partial(_serve_one, ops=ops), [listener], handler_nursery=nursery
            )
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


async def _serve_one(stream: trio.abc.Stream, ops: dict[str, Op]) -> None:
    async with stream:
        buf = b""
        with trio.move_on_after(30):
            while b"\n" not in buf and len(buf) < _MAX_REQUEST:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    break
                buf += chunk
        response = await _answer(buf.split(b"\n", 1)[0], ops)
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.send_all(json.dumps(response).encode() + b"\n")


async def _answer(line: bytes, ops: dict[str, Op]) -> dict[str, Any]:
    try:
        request = json.loads(line)
        op = ops[request["op"]]
    except (ValueError, KeyError, TypeError):
        return {"ok": False, "error": "bad request"}
    try:
        return {"ok": True, "result": await op(request)}
    except Exception as exc:
        log.exception("control op %s failed", request.get("op"))
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}


def request(path: Path, op: str, timeout: float = 10.0, **args: Any) -> Any:
    """Blocking client: send one request to a host's control socket and return its result.

    Raises:
        ConnectionError: nothing listens at ``path``.
        RuntimeError: the host answered with an error.
    """
    with stdsocket.socket(stdsocket.AF_UNIX, stdsocket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(path))
        s.sendall(json.dumps({"op": op, **args}).encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    response = json.loads(buf)
    if not response.get("ok"):
        raise RuntimeError(response.get("error", "unknown error"))
    return response["result"]
