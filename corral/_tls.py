"""The verifying TLS context of every HTTP client corral makes, built once per process.

httpx builds a verifying context for every client it makes, loading the whole CA bundle:
~17 ms of CPU, which a cold session's first model call would wait for, and ~1 MB of memory
each. Both zygotes look :data:`DEFAULT_CONTEXT` up among their preloads (``MODULE:NAME``,
:func:`corral._zygote._template.preload`, through
:data:`corral._zygote.HTTP_CLIENT_MODULES`): every worker and every actor they fork starts
with the context built, its CA store in pages it shares with the zygote, and hands it to its
clients (an ``openai`` worker's model client, the :class:`~corral.server_client.ServerClient`
of dispatch, policy and tools). A context is built for the CA settings httpx reads from the
environment (``SSL_CERT_FILE``, ``SSL_CERT_DIR``): a process whose environment names others
builds its own.
"""

from __future__ import annotations

import os
import ssl

import httpx

_CA_ENV = ("SSL_CERT_FILE", "SSL_CERT_DIR")
_contexts: dict[tuple[str | None, ...], ssl.SSLContext] = {}


def default_context() -> ssl.SSLContext:
    """httpx's default verifying context for this environment's CA settings, built once."""
    key = tuple(os.environ.get(name) for name in _CA_ENV)
    context = _contexts.get(key)
    if context is None:
        context = _contexts[key] = httpx.create_ssl_context()
    return context


def __getattr__(name: str) -> ssl.SSLContext:
    # The zygote's preload item: looking DEFAULT_CONTEXT up builds it.
    if name == "DEFAULT_CONTEXT":
        return default_context()
    raise AttributeError(name)
