"""The read side every CLI's RPC client shares (codex's app-server, pi's RPC mode): the one
task that reads the CLI, the callers waiting on an answer by id, and the one listener of
what the CLI says unasked.

A client subclasses :class:`RpcReader` and routes each record in ``_dispatch``: an answer
to its waiter's box (then sets its event), anything else to ``_listener``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

import trio

from ._cli_process import CliError, CliProcess

#: Events held for a listener that is busy: a slow turn slows the CLI (its stdout fills), it
#: never grows the worker's memory.
LISTEN_BUFFER = 1024

Id = TypeVar("Id")
Answer = TypeVar("Answer")
Event = TypeVar("Event")


class RpcReader(Generic[Id, Answer, Event]):
    """A running CLI's output, read by :meth:`read` (the task that owns the CLI runs it
    until the CLI ends)."""

    def __init__(self, cli: CliProcess) -> None:
        self.cli = cli
        self._waiting: dict[Id, tuple[trio.Event, list[Answer]]] = {}
        self._listener: trio.MemorySendChannel[Event] | None = None
        #: Why the CLI can no longer be used (set once its output ended).
        self.ended: CliError | None = None

    @contextlib.contextmanager
    def listen(self) -> Iterator[trio.MemoryReceiveChannel[Event]]:
        """Receive what the CLI says unasked from now on, until the block ends; the channel
        ends when the CLI does."""
        send, receive = trio.open_memory_channel[Event](LISTEN_BUFFER)
        if self.ended is not None:
            send.close()
        else:
            self._listener = send
        try:
            yield receive
        finally:
            if self._listener is send:
                self._listener = None
            send.close()
            receive.close()

    async def read(self) -> None:
        """Read the CLI until its output ends (then :attr:`ended` says why, and every waiter
        is woken)."""
        try:
            while True:
                await self._dispatch(await self.cli.receive())
        except CliError as exc:
            self.ended = exc
            for done, _ in self._waiting.values():
                done.set()
            if self._listener is not None:
                self._listener.close()
            raise

    async def _dispatch(self, record: dict[str, Any]) -> None:
        raise NotImplementedError
