"""``corral bench memory``: a real host's process tree measured as sessions are added."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from corral.bench.memory import cpu_s, cpu_s_by_role, memory_mb, process_tree, role_of


@contextlib.contextmanager
def parent_of(child: str) -> Iterator[int]:
    """A Python process whose one child runs ``child`` then waits; its pid once the child
    printed ``ready``, both ended after the block."""
    code = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}])"
    parent = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None and parent.stdout.readline() == "ready\n"
        yield parent.pid
    finally:
        assert parent.stdin is not None
        parent.stdin.close()
        parent.wait(10)


def test_a_tree_is_its_root_and_every_process_below_it() -> None:
    """A child's own child is in the tree; the summed memory counts each process once."""
    with parent_of("print('ready', flush=True); input()") as pid:
        tree = process_tree(pid)
        assert tree[0] == pid and len(tree) == 2
        pss, rss = memory_mb(tree)
        alone_pss, alone_rss = memory_mb(tree[:1])
        assert 0 < alone_pss < pss and 0 < alone_rss < rss
        # PSS moves with what else maps the same pages (another process of the machine
        # starting or ending between two reads); RSS does not.
        twice_pss, twice_rss = memory_mb([*tree, *tree])
        assert twice_pss == pytest.approx(2 * pss, rel=0.02) and twice_rss == 2 * rss
        assert memory_mb([os.getpid() + 10_000_000]) == (0, 0), "a gone pid counts nothing"


def test_a_trees_cpu_keeps_the_time_of_the_children_it_reaped() -> None:
    """A busy child that exited and was waited for still counts, in its parent's time: a
    tree's CPU does not drop when a worker is reaped."""
    before = cpu_s([os.getpid()])
    busy = subprocess.run([sys.executable, "-c", "sum(range(30_000_000))"], check=True)
    assert busy.returncode == 0
    assert cpu_s([os.getpid()]) - before >= 0.1
    assert cpu_s([os.getpid() + 10_000_000]) == 0, "a gone pid counts nothing"


def test_a_process_role_is_its_title_without_what_names_one_of_its_kind() -> None:
    assert role_of("corral: worker 3f2a9c", root=False) == "corral: worker"
    assert role_of("corral: host /tmp/x/state", root=True) == "corral: host"
    assert role_of("corral: dispatch", root=False) == "corral: dispatch"
    assert role_of("/venv/bin/python", root=True) == "runner"
    assert role_of("/venv/bin/python", root=False) == "runner's children"


def test_a_trees_cpu_by_role_sums_to_the_trees() -> None:
    """Where a tree's CPU goes: its root and its children apart, each counted once."""
    with parent_of("sum(range(20_000_000)); print('ready', flush=True); input()") as pid:
        tree = process_tree(pid)
        by_role = cpu_s_by_role(tree)
        assert set(by_role) == {"runner", "runner's children"}
        assert by_role["runner's children"] >= 0.05, "the busy child's time is its own"
        assert sum(by_role.values()) == pytest.approx(cpu_s(tree), abs=0.02)


@pytest.mark.chaos
@pytest.mark.timeout(300)
def test_bench_memory_measures_forked_and_execd_sessions_against_the_interpreter_floor() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "corral", "bench", "memory", "--quick", "--json"],
        capture_output=True,
        text=True,
        timeout=280,
        check=True,
    )
    doc = json.loads(done.stdout)
    assert doc["benchmark"] == "memory"
    assert doc["params"]["sessions"] == [1, 10]
    floor = doc["baseline"]
    assert floor["unit"] == "MB" and 5 < floor["value"] < 200
    assert doc["params"]["modes"] == ["zygote", "exec"]
    rows = {r["name"]: r for r in doc["results"]}
    for mode in ("zygote", "exec"):
        base = rows[f"host tree PSS, no session [{mode}]"]
        assert base["ratio_to_baseline"] > 1, "a host is more than one bare interpreter"
        assert rows[f"host tree processes, no session [{mode}]"]["value"] >= 2
        for count in (1, 10):
            tree = rows[f"host tree PSS, +{count} sessions [{mode}]"]
            per = rows[f"PSS per added session, +{count} [{mode}]"]
            assert tree["value"] > base["value"]
            # What a session adds is a worker: more than nothing, less than a whole host.
            assert 0 < per["value"] < base["value"]
            assert per["ratio_to_baseline"] == pytest.approx(
                per["value"] / floor["value"], rel=1e-2
            )
            assert rows[f"RSS per added session, +{count} [{mode}]"]["value"] >= per["value"] * 0.9
        for kind in ("cold", "warm", "resumed"):
            named = (n for n in rows if n.startswith(f"{kind} turn (") and n.endswith(f"[{mode}]"))
            (p50,) = [rows[n] for n in named]
            assert p50["unit"] == "ms" and p50["value"] > 0
            assert rows[f"host tree CPU per {kind} turn [{mode}]"]["value"] >= 0
    # The zygote's point: a forked worker shares the interpreter and its imports.
    forked = rows["PSS per added session, +10 [zygote]"]["value"]
    assert forked < 0.75 * rows["PSS per added session, +10 [exec]"]["value"]
