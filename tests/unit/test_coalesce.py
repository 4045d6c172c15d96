"""Loads concurrent callers share (corral/server/_plane/_coalesce.py)."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from corral.server._plane._coalesce import Coalesced


class Files:
    """A loader of "files" whose content the test changes; counts its runs, and each run
    waits for the test to let it finish."""

    def __init__(self) -> None:
        self.content = "v1"
        self.runs = 0
        self.gate = trio.Event()
        self.fail = False

    async def load(self) -> str:
        self.runs += 1
        seen = self.content  # read when the run begins
        await self.gate.wait()
        if self.fail:
            self.fail = False
            raise OSError("unreadable")
        return seen


async def test_a_burst_of_callers_costs_at_most_two_loads_and_none_sees_older_than_its_call():
    files = Files()
    load = Coalesced(files.load)
    got: list[str] = []

    async def call() -> None:
        got.append(await load())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(call)
        await trio.testing.wait_all_tasks_blocked()
        assert files.runs == 1  # the first caller's run has begun
        files.content = "v2"  # an edit while it runs: later callers must see it
        for _ in range(49):
            nursery.start_soon(call)
        await trio.testing.wait_all_tasks_blocked()
        files.gate.set()
    assert files.runs == 2
    assert got == ["v1"] + ["v2"] * 49


async def test_a_failed_load_fails_the_caller_that_ran_it_and_the_next_call_loads_again():
    files = Files()
    files.fail = True
    files.gate.set()
    load = Coalesced(files.load)
    with pytest.raises(OSError):
        await load()
    assert await load() == "v1"
    files.content = "v3"
    assert await load() == "v3"  # a call after an edit never gets the kept result
    assert files.runs == 3
