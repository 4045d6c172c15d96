"""The control plane's logic: sessions, the runner binding, relays and forwards.

:class:`ControlPlane` is what the HTTP layer (``_http.py``) calls; it holds no HTTP types.
It owns the store, the agent catalog and the connected runner (at most one: the runner id is
derived from this server's one token). Tool calls through ``/mcp`` are ``_mcp.py``.

The runner binding follows PROTOCOL_FACTS §v.6 as the 0.19 server does it (PROTOCOL_0_19 §B).
When the runner connects it gets ``event.ready`` if it asked for event ingest (§A.3); then every
session bound to it is initialised one after the other (``POST /v1/sessions`` with the
``session_init`` v2 envelope), and each then keeps one ``GET .../stream`` open, whose events are
stored (and so fanned out to clients) as they arrive. A session created while the runner is
connected is bound at once; one created while it is away is bound when it connects. Deleting a
session stops its binding and tells the runner (``DELETE /v1/sessions/{id}``, §I.1).

Forwards to the runner (user messages and verdicts) go through the durable *outbox*: the
request handler stores the forward in the same transaction as the item or verdict it belongs
to. A message is answered at once (``queued: true``, as the real server does, §C.1); a verdict
waits a short while for the session's deliverer to hand it to the runner. A forward
that could not be delivered (runner offline, tunnel dropped mid-request, a 5xx answer) stays
in the outbox and is sent again, in order, when the session's stream is next open, so nothing
a client was told is stored is lost, even across a restart of this server. Delivery is
at-least-once: a tunnel that drops after the runner acted but before its answer arrived makes
the forward go again.

Modules: ``_control_plane`` (:class:`ControlPlane`: state, lifecycle, agents, sessions,
client events and streams), and its parts: ``_binding`` (the runner link and the session
streams), ``_runner_calls`` (what the runner asks: policies, ``/mcp``, items, event batches),
``_outbox`` (forwards to the runner), ``_parts`` (what the parts share, declared);
``_options`` (the protocol version, timings and limits) and ``_refusals`` (error answers).
"""

from ._control_plane import ControlPlane as ControlPlane
from ._options import SERVER_VERSION as SERVER_VERSION
from ._options import PlaneOptions as PlaneOptions
from ._refusals import Offline as Offline
from ._refusals import Refused as Refused

__all__ = [
    "SERVER_VERSION",
    "ControlPlane",
    "Offline",
    "PlaneOptions",
    "Refused",
]
