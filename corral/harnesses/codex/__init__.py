"""The ``codex`` harness kind: the Codex CLI, driven through ``codex app-server``.

``_harness.py`` is the worker kind (the app-server's life, a thread's open, a turn, its
interrupt); ``_relay.py`` what a turn relays and how its approvals are decided; ``_rpc.py``
the app-server's JSON-RPC as types and its client; ``_home.py`` the session's
``CODEX_HOME`` (config, saved thread, the CLI's environment); ``_input.py`` what Codex is
given of the turn's message; ``_settings.py`` where a turn's settings come from.
"""

from ._harness import CodexHarness as CodexHarness

__all__ = ["CodexHarness"]
