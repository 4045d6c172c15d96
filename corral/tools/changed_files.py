"""The changed-files signal: tell clients to refetch a session's file changes (T-20 to T-22).

After a tool that may change files (``sys_os_write``, ``sys_os_edit``, ``sys_os_shell``:
the tools whose :attr:`~corral.tools._api.ToolSpec.mutates_files` is set) the runner
publishes, on the session's stream::

    {"type": "session.changed_files.invalidated", "session_id": <sid>, "environment_id": "default"}

A turn that writes twenty files should make a client refetch once, not twenty times, so
the signal is throttled per session with a *leading edge*: the first mutation publishes
at once, later ones inside the window (0.75 s on a monotonic clock) publish nothing, and
the first one after the window publishes again. A trailing signal is not needed: the
client refetches after the first and sees everything written until then, and a write
after the window brings its own signal.

The last-signal times are kept for at most 4096 sessions; when a new session would go
past that, the map is cleared, which costs at most one extra signal per session.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final, Literal, TypedDict

from ._api import Publish

__all__ = [
    "ENVIRONMENT_ID",
    "EVENT_TYPE",
    "MAX_TRACKED_SESSIONS",
    "THROTTLE_WINDOW_S",
    "ChangedFilesSignal",
    "changed_files_event",
]

_log = logging.getLogger(__name__)

#: The event's ``type``.
EVENT_TYPE: Final = "session.changed_files.invalidated"
#: The event's ``environment_id``: the session's one OS environment.
ENVIRONMENT_ID = "default"
#: Seconds during which a session's later mutations publish nothing.
THROTTLE_WINDOW_S = 0.75
#: Sessions whose last signal time is remembered before the map is cleared.
MAX_TRACKED_SESSIONS = 4096


class FilesInvalidated(TypedDict):
    """The ``session.changed_files.invalidated`` event."""

    type: Literal["session.changed_files.invalidated"]
    session_id: str
    environment_id: str


def changed_files_event(session_id: str) -> FilesInvalidated:
    """The ``session.changed_files.invalidated`` event for ``session_id`` (T-20)."""
    return {"type": EVENT_TYPE, "session_id": session_id, "environment_id": ENVIRONMENT_ID}


class ChangedFilesSignal:
    """Per-session leading-edge throttle of the changed-files signal (T-21).

    One instance serves every session of a tools actor.

    Args:
        window_s: the throttle window.
        max_sessions: sessions tracked before the map is cleared.
        clock: a monotonic clock; injectable so tests need no sleeps.
    """

    def __init__(
        self,
        *,
        window_s: float = THROTTLE_WINDOW_S,
        max_sessions: int = MAX_TRACKED_SESSIONS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if window_s < 0:
            raise ValueError("window_s must be >= 0")
        if max_sessions < 1:
            raise ValueError("max_sessions must be >= 1")
        self.window_s = window_s
        self.max_sessions = max_sessions
        self._clock = clock
        self._last: dict[str, float] = {}

    def __len__(self) -> int:
        """How many sessions are tracked now."""
        return len(self._last)

    def due(self, session_id: str, *, now: float | None = None) -> bool:
        """Whether a mutation now should publish; if so, the window starts now.

        Args:
            session_id: the session that changed files.
            now: the time on the throttle's clock; the clock is read when None.
        """
        when = self._clock() if now is None else now
        last = self._last.get(session_id)
        if last is not None and when - last < self.window_s:
            return False
        if last is None and len(self._last) >= self.max_sessions:
            self._last.clear()
        self._last[session_id] = when
        return True

    async def maybe_signal(
        self,
        session_id: str | None,
        publish: Publish | None,
        *,
        now: float | None = None,
    ) -> bool:
        """Publish the signal for ``session_id`` unless the throttle holds it back.

        With no session id or no publisher this does nothing (T-22). It never raises: a
        failing publisher is logged and the window is given back, so the next mutation
        tries again. Cancellation is not a failure and propagates.

        Returns:
            Whether an event was published.
        """
        if not session_id or publish is None:
            return False
        previous = self._last.get(session_id)
        try:
            if not self.due(session_id, now=now):
                return False
            when = self._last[session_id]
            try:
                await publish(changed_files_event(session_id))
            except BaseException:
                # Give the window back so the next mutation signals again.
                if self._last.get(session_id) == when:
                    if previous is None:
                        self._last.pop(session_id, None)
                    else:
                        self._last[session_id] = previous
                raise
        except Exception:
            _log.warning(
                "changed-files signal for session %s not published", session_id, exc_info=True
            )
            return False
        return True
