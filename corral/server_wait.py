"""Asking an unavailable server again, bounded and cancellable.

A server that does not answer for a few seconds is usually restarting: the embedded control
plane is back 2 to 4 s after a ``kill -9`` (its host restarts it), a real server behind a
proxy answers 502/503/504 meanwhile. Dispatch's turn setup and the policy actor's evaluations
wait that out with :func:`while_unavailable` instead of failing the turn or the tool call at
the first dropped connection; an answer that refuses (4xx, a 500, a malformed body) is not
asked again. A floor module, beside :mod:`corral.server_client`, whose calls it repeats.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio

from ._exceptions import ServerTimeout, ServerUnavailable

log = logging.getLogger(__name__)

#: How long a caller keeps asking an unavailable server, from its first failure: the embedded
#: control plane's restart window (2 to 4 s, longer under load) with room to spare.
SERVER_WAIT_S = 10.0
#: The backoff of :func:`while_unavailable`: the first wait, doubling up to the last.
WAIT_FIRST_S = 0.25
WAIT_MAX_S = 2.0

T = TypeVar("T")


async def while_unavailable(
    ask: Callable[[], Awaitable[T]],
    *,
    what: str,
    wait_s: float,
    wanted: Callable[[], bool] = lambda: True,
    timeouts: bool = True,
) -> T:
    """``ask()``, asked again while the server is unavailable, up to ``wait_s`` from the first
    failure, waiting :data:`WAIT_FIRST_S` doubling to :data:`WAIT_MAX_S` in between.

    Each ask is itself a :class:`~corral.server_client.ServerClient` call with its own bounded
    retries. The wait is cancellable (a trio sleep), and stops early, with the last error, once
    ``wanted()`` is false: nobody waits for the answer any more. ``what`` names the call in
    the log line of each retry. ``timeouts=False`` raises a :class:`ServerTimeout` at once: a
    call whose server may hold it (a policy evaluation waiting for a person) timed out on its own
    deadline, which asking again would only extend.

    Raises:
        ServerUnavailable: still unavailable after the wait.
        ServerError: any other failure of ``ask``, at once (and anything else it raises).
    """
    deadline: float | None = None
    delay = WAIT_FIRST_S
    while True:
        try:
            return await ask()
        except ServerUnavailable as exc:
            if not timeouts and isinstance(exc, ServerTimeout):
                raise
            now = trio.current_time()
            deadline = now + wait_s if deadline is None else deadline
            if not wanted() or now + delay > deadline:
                raise
            log.info("%s: the server is unavailable (%s); asking again in %.2fs", what, exc, delay)
        await trio.sleep(delay)
        delay = min(delay * 2, WAIT_MAX_S)
