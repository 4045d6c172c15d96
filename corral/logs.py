"""Structured logging: one line per record, ``key=value`` pairs, to stderr.

Every process (host, actors, workers) calls :func:`setup` with its own name, so a combined
log shows who said what. Set ``CORRAL_LOG_LEVEL`` to change the level (default INFO).
"""

from __future__ import annotations

import logging
import os
import sys
import time


class _Formatter(logging.Formatter):
    def __init__(self, process_name: str) -> None:
        super().__init__()
        self.process_name = process_name

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line = (
            f"{ts}.{int(record.msecs):03d}Z level={record.levelname.lower()} "
            f"proc={self.process_name} pid={record.process} logger={record.name} "
            f"msg={record.getMessage()!r}"
        )
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup(process_name: str, level: str | None = None) -> None:
    """Send this process's logs to stderr in corral's line format."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter(process_name))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel((level or os.environ.get("CORRAL_LOG_LEVEL") or "INFO").upper())
