"""When a process gives its freed heap back: once per burst, when the burst is over, and only
if the burst grew it (:mod:`corral._heap`)."""

from __future__ import annotations

import trio
import trio.testing

from corral import _heap as heap


class Process:
    """What ``release_when_quiet`` watches: a work count, CPU seconds and a resident set."""

    def __init__(self) -> None:
        self.work = 0
        self.cpu = 0.0
        self.resident = 100 << 20
        self.releases: list[float] = []

    def release(self) -> None:
        self.releases.append(trio.current_time())
        self.resident = 100 << 20


async def _watched(process: Process, body) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            lambda: heap.release_when_quiet(
                lambda: process.work,
                on_release=process.release,
                resident=lambda: process.resident,
                cpu=lambda: process.cpu,
            )
        )
        await body()
        nursery.cancel_scope.cancel()


async def test_a_burst_that_grew_the_heap_is_released_once_when_it_is_over(
    autojump_clock: trio.testing.MockClock,
) -> None:
    p = Process()

    async def burst() -> None:
        for _ in range(50):  # 5 s of work, 100 messages every 0.1 s
            p.work += 100
            p.resident += 1 << 20
            await trio.sleep(0.1)
        ended = trio.current_time()
        await trio.sleep(10)
        assert len(p.releases) == 1, "one release per burst"
        assert ended < p.releases[0] <= ended + heap.IDLE_S + 2 * heap.QUIET_S

    await _watched(p, burst)


async def test_a_busy_process_is_not_interrupted_and_an_idle_one_is_left_alone(
    autojump_clock: trio.testing.MockClock,
) -> None:
    p = Process()

    async def steady() -> None:
        for _ in range(300):  # 30 s of growing work with no pause as long as QUIET_S
            p.work += 50
            p.resident += 1 << 20
            await trio.sleep(heap.QUIET_S / 2)
        assert p.releases == [], "released in the middle of a burst"
        await trio.sleep(60)
        assert len(p.releases) == 1
        await trio.sleep(600)
        assert len(p.releases) == 1, "released again with nothing done since"

    await _watched(p, steady)


async def test_work_that_did_not_grow_the_resident_set_releases_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Heartbeats are work too, a trickle: the process counts as quiet, and is trimmed only
    once they (or anything else) grew it."""
    p = Process()

    async def heartbeats() -> None:
        for beat in range(600):
            p.work += 3
            p.resident = (100 << 20) + beat * (heap.MIN_GROWTH // 600)
            await trio.sleep(0.5)
        assert p.releases == []
        p.resident = (100 << 20) + heap.MIN_GROWTH
        p.work += 3
        await trio.sleep(5)
        assert len(p.releases) == 1, "past MIN_GROWTH in all, the next quiet releases"

    await _watched(p, heartbeats)


async def test_a_burst_of_few_large_messages_is_known_by_the_cpu_it_takes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The journal takes a flood in a few appends a second, a count that passes for quiet:
    the core it keeps busy says it is in a burst, and it is trimmed once that is over."""
    p = Process()

    async def appends() -> None:
        for _ in range(100):  # 10 s: two large appends every 0.1 s, each 80 ms of CPU
            p.work += 2
            p.cpu += 0.08
            p.resident += 1 << 20
            await trio.sleep(0.1)
        ended = trio.current_time()
        assert p.releases == [], "released in the middle of a burst"
        await trio.sleep(10)
        assert len(p.releases) == 1
        assert ended < p.releases[0] <= ended + heap.IDLE_S + 2 * heap.QUIET_S

    await _watched(p, appends)
