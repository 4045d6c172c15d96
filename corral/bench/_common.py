"""Helpers shared by the benchmarks: result shapes, percentiles, child processes."""

from __future__ import annotations

import subprocess
import sys
from typing import Any


def figure(name: str, value: float, unit: str, baseline: float | None = None) -> dict[str, Any]:
    """One result row; ``ratio_to_baseline`` is value / baseline when one is given."""
    return {
        "name": name,
        "value": round(value, 4),
        "unit": unit,
        "ratio_to_baseline": round(value / baseline, 4) if baseline else None,
    }


def percentile(sorted_values: list[float], q: float) -> float:
    """The q-quantile (0..1) of already sorted values."""
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, round(q * (len(sorted_values) - 1)))
    return sorted_values[index]


def start_role(module: str, *args: str) -> subprocess.Popen:
    """Start a benchmark role in its own process (by exec, with its own zmq context)."""
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
