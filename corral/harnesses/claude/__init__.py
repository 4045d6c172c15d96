"""The ``claude-sdk`` harness kind: Claude Code (the ``claude`` CLI) as a session's agent.

``_settings`` resolves a turn's :class:`Settings` and the CLI's command line and
environment; ``_session`` keeps the worker's one Claude Code across turns and the CLI
session it resumes; ``_relay`` turns one turn's output into the turn's events and answers
the CLI's requests (permissions, ``_mcp``: corral's tools over MCP); ``_harness`` is the
worker kind itself (docs/harnesses.md, *claude-sdk*).
"""

from ._harness import ClaudeHarness
from ._settings import Settings

__all__ = ["ClaudeHarness", "Settings"]
