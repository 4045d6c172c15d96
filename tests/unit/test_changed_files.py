"""The changed-files signal and its per-session leading-edge throttle (T-20 to T-22)."""

from __future__ import annotations

from typing import Any

import pytest

from corral.tools.changed_files import (
    MAX_TRACKED_SESSIONS,
    THROTTLE_WINDOW_S,
    ChangedFilesSignal,
    changed_files_event,
)

SID = "conv_changed_files_throttle"


class Recorder:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    async def __call__(self, event: dict[str, Any]) -> None:
        self.events.append(event)


def test_t20_event_shape() -> None:
    assert changed_files_event("s1") == {
        "type": "session.changed_files.invalidated",
        "session_id": "s1",
        "environment_id": "default",
    }


def test_t21_window_and_bound_defaults() -> None:
    assert THROTTLE_WINDOW_S == 0.75
    assert MAX_TRACKED_SESSIONS == 4096
    signal = ChangedFilesSignal()
    assert (signal.window_s, signal.max_sessions) == (0.75, 4096)


async def test_t21_leading_edge_throttle_within_window() -> None:
    signal, publish = ChangedFilesSignal(), Recorder()
    assert await signal.maybe_signal(SID, publish, now=100.0) is True
    assert await signal.maybe_signal(SID, publish, now=100.0 + THROTTLE_WINDOW_S / 2) is False
    assert await signal.maybe_signal(SID, publish, now=100.0 + THROTTLE_WINDOW_S + 0.01) is True
    assert publish.events == [changed_files_event(SID)] * 2


async def test_t21_window_counts_from_the_last_signal_not_the_last_call() -> None:
    signal, publish = ChangedFilesSignal(), Recorder()
    for t in (0.0, 0.5, 0.7, 0.75, 1.0, 1.49, 1.5):
        await signal.maybe_signal(SID, publish, now=t)
    # 0.0 signals; 0.75 is a full window later; 1.5 a full window after that.
    assert len(publish.events) == 3


async def test_t21_sessions_are_throttled_separately() -> None:
    signal, publish = ChangedFilesSignal(), Recorder()
    await signal.maybe_signal("a", publish, now=1.0)
    await signal.maybe_signal("b", publish, now=1.1)
    await signal.maybe_signal("a", publish, now=1.2)
    assert [e["session_id"] for e in publish.events] == ["a", "b"]


async def test_t21_clock_is_injectable() -> None:
    now = [10.0]
    signal, publish = ChangedFilesSignal(clock=lambda: now[0]), Recorder()
    await signal.maybe_signal(SID, publish)
    now[0] = 10.5
    await signal.maybe_signal(SID, publish)
    now[0] = 10.8
    await signal.maybe_signal(SID, publish)
    assert len(publish.events) == 2


async def test_t21_tracking_map_is_bounded_and_cleared_on_overflow() -> None:
    signal, publish = ChangedFilesSignal(max_sessions=3), Recorder()
    for sid in ("a", "b", "c"):
        await signal.maybe_signal(sid, publish, now=1.0)
    assert len(signal) == 3
    await signal.maybe_signal("a", publish, now=1.1)  # a known session does not overflow
    assert len(signal) == 3 and len(publish.events) == 3
    await signal.maybe_signal("d", publish, now=1.2)
    assert len(signal) == 1
    # "a" was forgotten with the rest, so it signals again inside its old window.
    await signal.maybe_signal("a", publish, now=1.3)
    assert [e["session_id"] for e in publish.events] == ["a", "b", "c", "d", "a"]


async def test_t21_default_map_bound_is_4096() -> None:
    signal, publish = ChangedFilesSignal(), Recorder()
    for i in range(4096):
        signal.due(f"s{i}", now=0.0)
    assert len(signal) == 4096
    await signal.maybe_signal("one-more", publish, now=0.0)
    assert len(signal) == 1


@pytest.mark.parametrize("sid", [None, ""])
async def test_t22_no_session_id_is_a_no_op(sid: str | None) -> None:
    signal, publish = ChangedFilesSignal(), Recorder()
    assert await signal.maybe_signal(sid, publish, now=200.0) is False
    assert publish.events == [] and len(signal) == 0


async def test_t22_no_publisher_is_a_no_op_and_keeps_the_window_open() -> None:
    signal, publish = ChangedFilesSignal(), Recorder()
    assert await signal.maybe_signal(SID, None, now=200.0) is False
    assert await signal.maybe_signal(SID, publish, now=200.1) is True
    assert len(publish.events) == 1


async def test_t22_failing_publisher_never_raises_and_gives_the_window_back() -> None:
    signal, publish = ChangedFilesSignal(), Recorder()

    async def broken(event: dict[str, Any]) -> None:
        raise RuntimeError("stream gone")

    assert await signal.maybe_signal(SID, broken, now=1.0) is False
    assert await signal.maybe_signal(SID, publish, now=1.1) is True
    assert len(publish.events) == 1


async def test_t22_failing_clock_never_raises() -> None:
    def clock() -> float:
        raise OSError("no clock")

    signal, publish = ChangedFilesSignal(clock=clock), Recorder()
    assert await signal.maybe_signal(SID, publish) is False
    assert publish.events == []


def test_t21_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match=r"^window_s must be >= 0$"):
        ChangedFilesSignal(window_s=-1)
    with pytest.raises(ValueError, match=r"^max_sessions must be >= 1$"):
        ChangedFilesSignal(max_sessions=0)
