"""The part of the host's environment a child program may see.

Harness workers, tool shells and terminals start with this short allow-list and nothing else
of the host's environment, so the host's secrets (API keys, tunnel tokens) never reach them.
It lives on the floor because both the harnesses and the tools build on it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

_ALLOWED = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TMPDIR",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "USER",
    "LOGNAME",
    "SHELL",
    "TERM",
)


def base_env(host_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The allow-listed part of the host's environment."""
    source = os.environ if host_env is None else host_env
    return {k: source[k] for k in _ALLOWED if k in source}
