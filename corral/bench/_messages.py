"""The benchmarks' own messages, and the actor that makes a benchmark's host know them.

A broker accepts a body only if its process imported the body's type, and a host imports
the module of each actor it runs for that. So the hosts of ``corral bench turn`` and
``corral bench harness``, whose raw baseline streams :class:`Count` through the host's
broker, run :class:`BenchActor` too (:data:`BENCH_ACTOR`): a production host runs neither.
"""

from __future__ import annotations

from ..actors._actor import Actor
from ..bus import Message


class Count(Message, tag="bench.count"):
    """One unit of benchmark traffic."""

    n: int = 0


class Ping(Message, tag="bench.ping"):
    """A request the bus benchmark's responder answers with itself."""

    text: str = ""


class BenchActor(Actor):
    """Handles nothing: running it is what brings this module's messages into the host."""


#: The ``corral.toml`` lines that make a benchmark's host run :class:`BenchActor`.
BENCH_ACTOR = """
[actors.bench]
target = "corral.bench._messages:BenchActor"
"""
