"""The ``pi`` harness kind: the pi coding agent, driven through its RPC mode.

``_harness.py`` is the worker kind (the CLI's life, a turn, its interrupt); ``_relay.py``
what a run relays and how the gate's questions are decided; ``_rpc.py`` pi's RPC mode as
types and its client; ``_home.py`` the session's pi directory (``models.json``, the gate
extension, the CLI's command line and environment); ``_input.py`` what pi is given of the
turn's message; ``_settings.py`` where a turn's settings come from.
"""

from ._harness import PiHarness as PiHarness

__all__ = ["PiHarness"]
