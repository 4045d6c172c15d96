"""systemd's service notifications (``sd_notify(3)``), spoken without libsystemd.

A unit of ``Type=notify`` starts the host with ``NOTIFY_SOCKET`` naming a unix datagram
socket; each notification is one datagram of ``KEY=VALUE`` lines. The host sends:

- ``READY=1`` once every actor runs (``systemctl start`` returns then, not at the exec);
- ``STOPPING=1`` when it begins to stop (SIGTERM, ``corral stop``), before the drain;
- ``WATCHDOG=1`` every half of ``WATCHDOG_USEC`` (``WatchdogSec=``), from the supervisor's
  own event loop: a hung supervisor stops pinging and systemd restarts it;
- ``STATUS=...``, a line ``systemctl status`` shows.

``WATCHDOG_USEC`` counts only when ``WATCHDOG_PID`` is unset or names this process. The
variables are removed from the environment once read, so no child inherits them (sd_notify's
``unset_environment``). Without ``NOTIFY_SOCKET`` every send does nothing: the host runs the
same under a shell, a container or systemd. A socket name starting with ``@`` is in the
abstract namespace. A send that fails (the manager gone, its queue full) is logged once and
never stops the host.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import MutableMapping

import trio

log = logging.getLogger("corral.host")

NOTIFY_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


class Notifier:
    """The host's channel to its service manager, if it has one."""

    def __init__(self, environ: MutableMapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        raw = {name: env.pop(name, "") for name in NOTIFY_ENV}
        self.address: str | None = None
        if raw["NOTIFY_SOCKET"]:
            name = raw["NOTIFY_SOCKET"]
            self.address = "\0" + name[1:] if name.startswith("@") else name
        #: Seconds between two ``WATCHDOG=1`` pings (half the manager's timeout), or None.
        self.watchdog_s: float | None = None
        pid = raw["WATCHDOG_PID"]
        if raw["WATCHDOG_USEC"] and (not pid or pid == str(os.getpid())):
            try:
                usec = int(raw["WATCHDOG_USEC"])
            except ValueError:
                log.warning("ignoring WATCHDOG_USEC=%r: not a number", raw["WATCHDOG_USEC"])
            else:
                self.watchdog_s = usec / 2e6 if usec > 0 else None
        self._sock: socket.socket | None = None
        self._failed = False

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *lines: str) -> None:
        """Send one notification of ``lines`` (``READY=1``, ``STATUS=...``)."""
        if self.address is None:
            return
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.setblocking(False)
            self._sock.sendto("\n".join(lines).encode(), self.address)
        except OSError as exc:
            if not self._failed:
                log.warning("cannot notify the service manager at %s: %s", self.address, exc)
                self._failed = True

    async def watchdog(self) -> None:
        """Ping the watchdog every :attr:`watchdog_s` seconds, forever (nothing if unset)."""
        if self.watchdog_s is None or self.address is None:
            return
        while True:
            self.send("WATCHDOG=1")
            await trio.sleep(self.watchdog_s)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
