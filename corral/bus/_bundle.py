"""Packing a run of stream messages into :class:`~corral.bus.Bundle` frames.

A run of deltas to one recipient costs one routing decision and one socket operation per
bundle at each hop instead of one per message. A bundle holds at most :data:`BUNDLE_MAX`
messages and stays under the bus's message size limit; the receiving peer unpacks it (see
:mod:`corral.bus._receive`).
"""

from __future__ import annotations

#: Messages in one :class:`~corral.bus.Bundle` at most.
BUNDLE_MAX = 512
#: Bytes a bundle's envelope and each item's msgpack header add, at most.
BUNDLE_OVERHEAD = 512
_ITEM_OVERHEAD = 5


def runs(frames: list[bytes], max_message_bytes: int) -> list[list[bytes]]:
    """Split consecutive frames into runs that each fit one bundle, in order."""
    limit = max_message_bytes - BUNDLE_OVERHEAD
    out: list[list[bytes]] = []
    run: list[bytes] = []
    size = 0
    for frame in frames:
        if run and (size + len(frame) + _ITEM_OVERHEAD > limit or len(run) >= BUNDLE_MAX):
            out.append(run)
            run, size = [], 0
        run.append(frame)
        size += len(frame) + _ITEM_OVERHEAD
    if run:
        out.append(run)
    return out
