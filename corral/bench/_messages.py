"""The benchmarks' own messages: the raw bus baselines' traffic.

No actor handles them, and none needs to: the broker forwards bodies without decoding
them, and the benchmark's own peers declare these types (``accepts=Count``).
"""

from __future__ import annotations

from ..bus import Message, Request


class Count(Message, tag="bench.count"):
    """One unit of benchmark traffic."""

    n: int = 0


class Ping(Request["Ping"], tag="bench.ping"):
    """A request the bus benchmark's responder answers with itself."""

    text: str = ""
