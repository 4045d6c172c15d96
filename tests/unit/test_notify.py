"""``sd_notify`` as the host speaks it (``corral/actors/_notify.py``): the variables it reads
and removes, datagrams on real sockets (a path and the abstract namespace), failures that
never stop the host. ``tests/integration/test_service.py`` runs it under a real host."""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

import pytest
import trio

from corral.actors._notify import Notifier


def _receiver(address: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(5)
    return sock


def test_without_notify_socket_nothing_is_sent_and_nothing_fails() -> None:
    env: dict[str, str] = {"WATCHDOG_USEC": "1000000"}
    notifier = Notifier(env)
    assert not notifier.enabled
    notifier.send("READY=1")
    assert env == {}, "read and removed, so no child inherits them"


def test_a_notification_is_one_datagram_of_lines(tmp_path: Path) -> None:
    path = str(tmp_path / "n.sock")
    with _receiver(path) as sock:
        env = {"NOTIFY_SOCKET": path, "OTHER": "kept"}
        notifier = Notifier(env)
        notifier.send("READY=1", "STATUS=running: 6 actors")
        assert sock.recv(4096) == b"READY=1\nSTATUS=running: 6 actors"
        notifier.close()
    assert env == {"OTHER": "kept"}


def test_an_abstract_socket_name_starts_with_an_at_sign() -> None:
    name = f"corral-test-{os.getpid()}"
    with _receiver("\0" + name) as sock:
        notifier = Notifier({"NOTIFY_SOCKET": "@" + name})
        notifier.send("STOPPING=1")
        assert sock.recv(4096) == b"STOPPING=1"
        notifier.close()


@pytest.mark.parametrize(
    ("env", "interval"),
    [
        ({"WATCHDOG_USEC": "4000000"}, 2.0),
        ({"WATCHDOG_USEC": "4000000", "WATCHDOG_PID": str(os.getpid())}, 2.0),
        ({"WATCHDOG_USEC": "4000000", "WATCHDOG_PID": "1"}, None),  # another process's
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({}, None),
    ],
)
def test_the_watchdog_is_pinged_at_half_its_timeout_and_only_for_this_process(
    env: dict[str, str], interval: float | None
) -> None:
    notifier = Notifier({"NOTIFY_SOCKET": "/nowhere", **env})
    assert notifier.watchdog_s == interval


async def test_the_watchdog_pings_until_cancelled(tmp_path: Path) -> None:
    path = str(tmp_path / "w.sock")
    with _receiver(path) as sock:
        sock.setblocking(False)
        notifier = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "20000"})  # 10 ms
        pings = 0
        async with trio.open_nursery() as nursery:
            nursery.start_soon(notifier.watchdog)
            with trio.fail_after(10):
                while pings < 3:
                    await trio.lowlevel.wait_readable(sock)
                    assert sock.recv(64) == b"WATCHDOG=1"
                    pings += 1
            nursery.cancel_scope.cancel()
        notifier.close()


def test_a_send_that_fails_is_logged_once_and_never_raises(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})
    with caplog.at_level(logging.WARNING, logger="corral.host"):
        notifier.send("READY=1")
        notifier.send("STOPPING=1")
    warnings = [r for r in caplog.records if "cannot notify" in r.getMessage()]
    assert len(warnings) == 1
    notifier.close()
