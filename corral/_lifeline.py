"""A child process's tie to its parent: it dies when the parent does.

Every process a host starts (actors, harness workers, the embedded control plane) calls
:func:`die_with_parent` first, so a ``kill -9`` of the host or of a harness actor leaves no
orphan behind. It lives on the floor because the actors and the harness workers both use it.
"""

from __future__ import annotations

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to SIGKILL us when the parent dies; exit now if it already has."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(70)
