"""trio ⇄ pyzmq: a ZeroMQ socket that trio tasks can share.

A ZeroMQ socket exposes one file descriptor, ``ZMQ_FD``, and it is *edge*-triggered: it
becomes readable when the socket's state changes, and reading ``ZMQ_EVENTS`` (which every
send and recv does internally) consumes that edge. A naive loop of "try, and on ``Again``
wait for the fd" therefore either lets two tasks wait on one fd (trio raises
``BusyResourceError``) or sleeps forever after another task's send swallowed the edge.

The rules this adapter follows:

* every operation first tries with ``NOBLOCK`` (a receive asks ``ZMQ_EVENTS`` instead of
  trying); it waits only when that raises ``Again`` (or shows nothing to receive);
* before waiting it re-reads ``ZMQ_EVENTS``, because the condition may already hold;
* exactly one task waits on the fd; other waiters park on a :class:`trio.lowlevel.ParkingLot`;
* after every successful send or recv — each of which may have consumed the edge — the
  waiters are woken to re-read ``ZMQ_EVENTS`` (the fd waiter by cancelling its wait). A lone
  fd waiter is woken only if ``ZMQ_EVENTS``, read here, shows what it waits for: otherwise
  the next change raises a new edge. That spares a receive loop a pass through the
  scheduler for every message its own actor sends (a tenth of a round trip's CPU);
* :func:`trio.lowlevel.notify_closing` runs before the socket closes.

Batched operations (:meth:`Socket.receive_batch`, :meth:`Socket.send_many`) take one trio
checkpoint per batch, which is what lets the broker keep up with raw blocking pyzmq.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

import trio
import zmq

from .._exceptions import BusClosed

Frames = list[bytes]

# pyzmq's convenience layer costs more than the send itself at these rates (IntFlag
# arithmetic, keyword handling), so the hot paths call the backend methods with int flags.
_send = zmq.backend.Socket.send
_recv = zmq.backend.Socket.recv
_get = cast("Callable[[zmq.SyncSocket, int], int]", zmq.backend.Socket.get)
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_POLLOUT = int(zmq.POLLOUT)
_NOBLOCK = int(zmq.NOBLOCK)
_NOBLOCK_MORE = int(zmq.NOBLOCK | zmq.SNDMORE)


def _send_frames(sock: zmq.SyncSocket, frames: Sequence[bytes]) -> None:
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        _send(sock, frame, _NOBLOCK if i == last else _NOBLOCK_MORE, True, False)


def _recv_frames(sock: zmq.SyncSocket) -> Frames:
    part = _recv(sock, _NOBLOCK, False, False)
    frames = [part.bytes]
    while part.more:
        part = _recv(sock, _NOBLOCK, False, False)
        frames.append(part.bytes)
    return frames


def configure(sock: zmq.SyncSocket, *, hwm: int, linger_ms: int) -> None:
    """Set the options every corral socket must have explicitly.

    ``ROUTER_MANDATORY`` turns a send to a missing peer into ``EHOSTUNREACH`` and a send to a
    full peer into ``EAGAIN`` — without it a ROUTER silently drops both.
    """
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    sock.setsockopt(zmq.LINGER, linger_ms)
    if sock.type == zmq.ROUTER:
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        # A restarted actor reconnects under the same identity; let it take over at once.
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)


class Socket:
    """A pyzmq socket usable from many trio tasks at once.

    Args:
        sock: a configured, non-async pyzmq socket owned by this object from now on.
    """

    def __init__(self, sock: zmq.SyncSocket) -> None:
        self._sock = sock
        self._fd = sock.fileno()  # ZMQ_FD
        self._lot = trio.lowlevel.ParkingLot()
        self._fd_wait: trio.CancelScope | None = None
        #: What the fd waiter waits for (``POLLIN`` or ``POLLOUT``).
        self._fd_flag = 0
        self._closed = False

    @property
    def zmq_socket(self) -> zmq.SyncSocket:
        """The underlying pyzmq socket (for options; do not send or receive on it)."""
        return self._sock

    # --- waiting ---------------------------------------------------------------------------

    def _wake(self) -> None:
        if self._lot:
            # Waiters on perhaps different conditions: each re-reads ZMQ_EVENTS.
            if self._fd_wait is not None:
                self._fd_wait.cancel()
            self._lot.unpark_all()
        elif self._fd_wait is not None and _get(self._sock, _EVENTS) & self._fd_flag:
            self._fd_wait.cancel()

    async def _wait(self, flag: int) -> None:
        while True:
            if self._closed:
                raise BusClosed("socket closed")
            if _get(self._sock, _EVENTS) & flag:
                return
            if self._fd_wait is None:
                with trio.CancelScope() as scope:
                    self._fd_wait, self._fd_flag = scope, flag
                    try:
                        await trio.lowlevel.wait_readable(self._fd)
                    except trio.ClosedResourceError:
                        raise BusClosed("socket closed") from None
                    finally:
                        self._fd_wait = None
                # Whoever parked behind us may now be able to proceed.
                self._lot.unpark_all()
            else:
                await self._lot.park()

    # --- sending ---------------------------------------------------------------------------

    def send_nowait(self, frames: Sequence[bytes]) -> None:
        """Send one multipart message now, or raise :class:`trio.WouldBlock`.

        Raises:
            trio.WouldBlock: the high-water mark is reached.
            zmq.ZMQError: ``EHOSTUNREACH`` from a ROUTER whose peer is gone.
        """
        if self._closed:
            raise BusClosed("socket closed")
        try:
            _send_frames(self._sock, frames)
        except zmq.Again:
            raise trio.WouldBlock from None
        self._wake()

    async def send(self, frames: Sequence[bytes]) -> None:
        """Send one multipart message, waiting while the high-water mark is reached."""
        await self.send_many((frames,))

    async def send_many(self, messages: Sequence[Sequence[bytes]]) -> None:
        """Send several multipart messages with one checkpoint for the whole batch."""
        await trio.lowlevel.checkpoint_if_cancelled()
        sock = self._sock
        i = 0
        n = len(messages)
        while i < n:
            if self._closed:
                raise BusClosed("socket closed")
            try:
                _send_frames(sock, messages[i])
            except zmq.Again:
                self._wake()
                await self._wait(_POLLOUT)
                continue
            i += 1
        self._wake()
        await trio.lowlevel.cancel_shielded_checkpoint()

    # --- receiving -------------------------------------------------------------------------

    def receive_nowait(self) -> Frames:
        """Receive one multipart message now, or raise :class:`trio.WouldBlock`."""
        if self._closed:
            raise BusClosed("socket closed")
        try:
            frames = _recv_frames(self._sock)
        except zmq.Again:
            raise trio.WouldBlock from None
        self._wake()
        return frames

    async def receive(self) -> Frames:
        """Receive one multipart message, waiting until one arrives."""
        batch = await self.receive_batch(1)
        return batch[0]

    async def receive_batch(self, max_messages: int = 256) -> list[Frames]:
        """Receive between one and ``max_messages`` messages, with one checkpoint."""
        await trio.lowlevel.checkpoint_if_cancelled()
        sock = self._sock
        out: list[Frames] = []
        waited = False
        while True:
            if self._closed:
                raise BusClosed("socket closed")
            # Asked, not tried: pyzmq's ``Again`` costs more than the receive itself (it
            # imports and formats its message), and it ended every batch.
            while len(out) < max_messages and _get(sock, _EVENTS) & _POLLIN:
                out.append(_recv_frames(sock))
            if out:
                self._wake()
                # Having waited, we already yielded; a second trip through the scheduler
                # would only add latency to every round trip.
                if not waited:
                    await trio.lowlevel.cancel_shielded_checkpoint()
                return out
            await self._wait(_POLLIN)
            waited = True

    # --- closing ---------------------------------------------------------------------------

    def close(self, linger_ms: int | None = None) -> None:
        """Close the socket; tasks waiting on it get :class:`~corral.BusClosed`."""
        if self._closed:
            return
        self._closed = True
        trio.lowlevel.notify_closing(self._fd)
        self._lot.unpark_all()
        self._sock.close(linger=linger_ms)

    async def aclose(self) -> None:
        """Close the socket (async form for ``async with`` users)."""
        self.close()
        await trio.lowlevel.checkpoint()

    async def __aenter__(self) -> Socket:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
