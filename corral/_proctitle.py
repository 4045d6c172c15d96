"""Process titles: what ``ps`` shows for each process of a host.

``corral: host <state dir>``, ``corral: server <state dir>`` (the embedded control plane),
``corral: <actor>`` (``corral: dispatch``) and ``corral: worker <session id>``, instead of a
screen of ``python -m corral.actors._entry``.

Done with setproctitle (PyPI) rather than by hand: the title ``ps`` shows is read from the
memory that held the process's original command line, which Python does not expose (a
hand-made version needs ``Py_GetArgcArgv`` through ctypes and must know where that buffer
ends); setproctitle writes there and also names the thread (``prctl(PR_SET_NAME)``: what
``top`` and ``ps -o comm`` show, cut to 15 bytes). It is told ``SPT_NOENV``: it never moves
the environment block to make room, because the host blanks its secrets in that block
(:func:`corral._child_env.blank_environ_block`) and tests find a host's actors by it. So a
title longer than the original command line is cut to its length.
"""

from __future__ import annotations

import os

import setproctitle

#: How a harness worker's title begins: the harness actor tells its host's workers by it (or,
#: before a worker has set it, by the module it runs), since a title overwrites the command line.
WORKER_TITLE_PREFIX = "corral: worker "


def set_title(title: str) -> None:
    """Show ``title`` for this process in ``ps`` (see the module docstring)."""
    had = os.environ.get("SPT_NOENV")
    os.environ["SPT_NOENV"] = "1"
    try:
        setproctitle.setproctitle(title)
    finally:
        if had is None:
            del os.environ["SPT_NOENV"]
