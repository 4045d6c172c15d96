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
"""

from __future__ import annotations

import codecs
import collections
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import trio

from .. import __version__
from ..config import ServerSettings
from ..spec import AgentSpec, load_spec_yaml, make_bundle
from ._agents import PACKAGED_AGENTS, Agent, AgentCatalog, spec_policies, yaml_version
from ._conversation import UnknownSession, fence, new_id
from ._mcp import ToolCalls, error_detail
from ._policy import TOOL_RESULT, AgentPolicy, Decision, combine, decide, tool_name_of
from ._state import ServerInfo, ensure_runner_token, is_loopback, lock_server_dir, server_dir
from ._store import NotPending, SessionRow, Store
from ._tunnel import RunnerGone, RunnerLink, SseParser, event_ack

__all__ = [
    "SERVER_VERSION",
    "ControlPlane",
    "Offline",
    "PlaneOptions",
    "Refused",
]

log = logging.getLogger("corral.server")

#: The protocol version this server speaks, as ``/api/version`` and ``session_init`` say it
#: (the omnigent release the protocol was traced against, PROTOCOL_0_19.md).
SERVER_VERSION = "0.19.1"
_encode = msgspec.json.Encoder().encode
#: Delivery outcomes kept for request handlers that have not looked yet.
_KEPT_DELIVERIES = 1024
#: ``event.batch`` limits of the real server (§A.3).
_MAX_BATCH_EVENTS = 32
_MAX_BATCH_BYTES = 256 * 1024
#: The event types the real server takes on the tunnel; this server stores only the first.
_TUNNEL_EVENT_TYPES = frozenset(
    {
        "external_conversation_item",
        "external_output_text_delta",
        "external_session_status",
        "external_session_usage",
    }
)


class PlaneOptions(msgspec.Struct, frozen=True, kw_only=True):
    """Timings and limits that are not user settings (tests shorten them)."""

    #: App-level ping to the runner; a tunnel silent for ``ping_timeout_s`` is closed (4003).
    ping_interval_s: float = 30.0
    ping_timeout_s: float = 90.0
    #: Time a new tunnel has to send ``hello``.
    hello_timeout_s: float = 30.0
    #: A client stream sends ``: keepalive`` after this much silence.
    keepalive_s: float = 15.0
    #: A runner stream silent this long is dead (its heartbeats come every 15 s).
    stream_dead_s: float = 45.0
    #: Answer time of tunnelled requests (init, events, delete).
    request_timeout_s: float = 60.0
    #: Answer time of a tool run through ``/mcp/execute``.
    tool_timeout_s: float = 600.0
    #: How long a client's message or verdict waits for the runner's answer before the
    #: request returns ``queued: true`` (the forward stays in the outbox either way).
    deliver_wait_s: float = 15.0
    #: How long ``/mcp`` waits for a runner tunnel to run an approved tool.
    runner_wait_s: float = 30.0
    #: Delivery attempts of one forward that the runner answers with a 5xx.
    max_delivery_attempts: int = 5
    retry_base_s: float = 0.5
    retry_cap_s: float = 10.0
    #: Largest body the runner's own calls may carry (tool outputs can be large).
    runner_max_body_bytes: int = 32 * 1024 * 1024
    #: Time in-flight requests get to finish on shutdown.
    graceful_timeout_s: float = 3.0


class Refused(Exception):
    """A request the plane refuses: answered with ``status`` and ``{"error": slug, ...}``."""

    def __init__(self, status: int, slug: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.slug = slug
        self.detail = detail


class Offline(Refused):
    """The runner is not connected and the request cannot wait for it."""

    def __init__(self, detail: str) -> None:
        super().__init__(503, "runner_offline", detail)


class _Binding:
    """A session's state on the current tunnel: whether its stream is open, and the cancel
    scopes of its tasks (a deleted session's tasks stop at once)."""

    def __init__(self) -> None:
        self.ready = False
        self.stopped = False
        self.scopes: list[trio.CancelScope] = []
        self._changed = trio.Event()

    def scope(self) -> trio.CancelScope:
        """A cancel scope for one of the session's tasks, cancelled by :meth:`stop`."""
        scope = trio.CancelScope()
        if self.stopped:
            scope.cancel()
        self.scopes.append(scope)
        return scope

    def stop(self) -> None:
        """Cancel every task of the session."""
        self.stopped = True
        for scope in self.scopes:
            scope.cancel()

    def set_ready(self, ready: bool) -> None:
        """Mark the stream open (or closed) and wake waiters."""
        if ready != self.ready:
            self.ready = ready
            self._changed.set()
            self._changed = trio.Event()

    async def wait_ready(self) -> None:
        """Return once the stream is open."""
        while not self.ready:
            await self._changed.wait()


class _Delivery:
    """The outcome of one outbox entry, for a request handler waiting on it."""

    def __init__(self) -> None:
        self.done = trio.Event()
        self.status: int | None = None
        self.body: Any = None


class _InitFailed(Exception):
    pass


class ControlPlane:
    """The embedded control plane. Use ``await open()``, serve, then ``await close()``.

    Args:
        state_dir: the host's state dir; everything lives in ``state_dir/server``.
        settings: ``[server]`` of ``corral.toml``.
        options: timings and limits (defaults for production).
    """

    def __init__(
        self, state_dir: Path, settings: ServerSettings, options: PlaneOptions | None = None
    ) -> None:
        self.settings = settings
        self.options = options or PlaneOptions()
        self.dir = server_dir(state_dir)
        self.store = Store(self.dir / "control.db")
        self.catalog = AgentCatalog(
            [PACKAGED_AGENTS, *(Path(d).expanduser() for d in settings.agents_dirs)]
        )
        self.runner_token = ""
        self.runner_id = ""
        #: Listening beyond loopback: then clients must present the token too.
        self.public = not is_loopback(settings.host)
        self._lock_fd: int | None = None
        self.info: ServerInfo | None = None
        self.link: RunnerLink | None = None
        self.closing = trio.Event()
        self._link_nursery: trio.Nursery | None = None
        self._bindings: dict[str, _Binding] = {}
        self._link_changed = trio.Event()
        self._changed: dict[str, trio.Event] = {}
        self._outbox_wake: dict[str, trio.Event] = {}
        self._deliveries: collections.OrderedDict[int, _Delivery] = collections.OrderedDict()
        self._agents_lock = trio.Lock()
        self._specs: dict[str, AgentSpec | None] = {}
        self._copy_policies: dict[str, list[AgentPolicy]] = {}
        self._tools = ToolCalls(self)
        #: Sessions deleted while this process runs: their client streams end.
        self.deleted: set[str] = set()
        #: Sessions whose turn was interrupted here: see ``_conversation.fence``.
        self._fenced: set[str] = set()

    # -- lifecycle -------------------------------------------------------------------------

    async def open(self) -> None:
        """Lock the state dir, create or read the token, open the database, load the agents.

        Raises:
            StateDirBusy: another control plane runs on this state dir.
        """
        self._lock_fd = await trio.to_thread.run_sync(lock_server_dir, self.dir)
        self.runner_token, self.runner_id = await trio.to_thread.run_sync(
            ensure_runner_token, self.dir
        )
        await self.store.open()
        agents = await self.agents()
        log.info(
            "control plane state in %s; %d agents (%s); runner id %s",
            self.dir,
            len(agents),
            ", ".join(sorted(agents)) or "none",
            self.runner_id,
        )

    async def close(self) -> None:
        """Close the database and release the state dir."""
        await self.store.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def begin_shutdown(self) -> None:
        """Start a clean stop: client streams end, the tunnel closes with 1012."""
        self.closing.set()
        for event in list(self._changed.values()):
            event.set()
        self._changed.clear()

    # -- agents ----------------------------------------------------------------------------

    async def agents(self) -> dict[str, Agent]:
        """Re-read the agent directories (cheap: a few small files) and return the agents."""
        async with self._agents_lock:
            return await trio.to_thread.run_sync(self.catalog.load)

    def _spec_of(self, session: SessionRow) -> AgentSpec | None:
        key = yaml_version(session.agent_yaml)
        if key not in self._specs:
            try:
                self._specs[key] = load_spec_yaml(session.agent_yaml)
            except ValueError:
                self._specs[key] = None
        return self._specs[key]

    async def agent_bundle(self, session: SessionRow) -> tuple[bytes, dict[str, str]]:
        """The session's agent as a tar.gz bundle and the ``x-agent-*`` headers (§iii.3).

        The agent as it is now, so an edit reaches the next turn; the YAML copy taken when
        the session was created if the agent is gone (a directory agent's sub-agents are
        not in that copy).
        """
        agent = (await self.agents()).get(session.agent)
        if agent is not None:
            bundle, version = agent.bundle(), agent.version
        else:
            bundle = make_bundle(session.agent_yaml, filename=f"{session.agent}.yaml")
            version = yaml_version(session.agent_yaml)
        headers = {
            "x-agent-version": version,
            "x-agent-name": session.agent,
            "x-agent-session-scoped": "true",
        }
        return bundle, headers

    async def _agent_policies(self, session: SessionRow) -> list[AgentPolicy]:
        """The policies of the session's agent as it is now (as its bundle is served), else
        of the copy taken when the session was created (it loaded then)."""
        agent = (await self.agents()).get(session.agent)
        if agent is not None:
            return agent.policies
        key = yaml_version(session.agent_yaml)
        if key not in self._copy_policies:
            self._copy_policies[key] = spec_policies(session.agent_yaml)
        return self._copy_policies[key]

    # -- sessions --------------------------------------------------------------------------

    async def create_session(self, agent_name: str, title: str | None) -> SessionRow:
        """Create a session of an agent and bind it to the runner.

        Raises:
            Refused: 404 ``unknown_agent``.
        """
        agents = await self.agents()
        agent = agents.get(agent_name)
        if agent is None:
            why = self.catalog.why_missing(agent_name)
            if why is not None:
                raise Refused(404, "unknown_agent", f"Agent {agent_name!r} was not loaded: {why}")
            known = ", ".join(sorted(agents)) or "none"
            raise Refused(404, "unknown_agent", f"No agent named {agent_name!r} (known: {known}).")
        now = time.time()
        row = SessionRow(
            id=new_id(),
            agent=agent.name,
            agent_id=agent.agent_id,
            agent_yaml=agent.yaml_text,
            runner_id=self.runner_id,
            title=title,
            created_at=now,
            updated_at=now,
        )
        await self.store.create_session(row)
        log.info("session %s created (agent %s)", row.id, row.agent)
        self._bind(row.id)
        return row

    async def session(self, session_id: str) -> SessionRow:
        """The session, or :class:`Refused` 404."""
        row = await self.store.get_session(session_id)
        if row is None:
            raise Refused(404, "not_found", f"No session {session_id!r}.")
        return row

    def session_object(self, row: SessionRow) -> dict[str, Any]:
        """A session as the client API shows it."""
        return {
            "id": row.id,
            "object": "session",
            "agent": row.agent,
            "agent_id": row.agent_id,
            "runner_id": row.runner_id,
            "status": row.status,
            "title": row.title,
            "created_at": int(row.created_at),
            "updated_at": int(row.updated_at),
            "last_event_id": row.last_event_id,
            "runner_online": self.link is not None,
        }

    async def snapshot(self, row: SessionRow) -> dict[str, Any]:
        """The session object plus the full snapshot of §iii.4."""
        pending, items = await self.store.snapshot_extras(row.id)
        spec = self._spec_of(row)
        return {
            **self.session_object(row),
            "agent_name": row.agent,
            "background_task_count": None,
            "labels": row.labels,
            "host_id": None,
            "host_online": None,
            "host_resumable": False,
            "reasoning_effort": None,
            "items": [],
            "items_count": items,
            "permission_level": None,
            "sub_agent_name": None,
            "kind": "default",
            "parent_session_id": None,
            "root_conversation_id": row.id,
            "llm_model": spec.model if spec else None,
            "harness": spec.harness if spec else None,
            "model_override": None,
            "cost_control_mode_override": None,
            "subagent_routing_override": None,
            "context_window": None,
            "last_total_tokens": None,
            "total_cost_usd": None,
            "usage_by_model": None,
            "last_task_error": None,
            "external_session_id": None,
            "terminal_launch_args": None,
            "pending_elicitations": pending,
            "pending_elicitation_count": len(pending),
            "pending_inputs": [],
            "workspace": None,
            "git_branch": None,
            "archived": False,
            "todos": [],
            "skills": [],
            "model_options": [],
            "terminal_pending": False,
            "sandbox_status": None,
            "mcp_startup": None,
            "active_response_id": None,
            "project_id": None,
        }

    # -- client events ---------------------------------------------------------------------

    async def post_message(self, row: SessionRow, content: list[dict[str, Any]]) -> dict[str, Any]:
        """Persist a user message, then forward it to the runner (§ii.7).

        The item and its forward are stored before anything is sent, so the message survives
        any failure after this returns; ``queued`` says whether the runner has answered yet.
        """
        forward = {
            "type": "message",
            "role": "user",
            "content": content,
            "agent_id": row.agent_id,
            "model": row.agent,
            "has_mcp_servers": False,
        }
        item, _ = await self.store.add_user_message(row.id, content, forward)
        self._wake_outbox(row.id)
        return {"queued": True, "item_id": item["id"]}

    async def delete_session(self, row: SessionRow) -> dict[str, Any]:
        """Delete a session, stop its binding and tell the runner (PROTOCOL_0_19 §I.1).

        The session is gone for clients whatever the runner answers, as on the real server.
        """
        await self.store.delete_session(row.id)
        self.deleted.add(row.id)
        binding = self._bindings.pop(row.id, None)
        if binding is not None:
            binding.stop()
        self.notify(row.id)
        log.info("session %s deleted", row.id)
        link, nursery = self.link, self._link_nursery
        if link is not None and nursery is not None:
            nursery.start_soon(self._tell_deleted, link, row.id)
        return {"id": row.id, "object": "conversation.deleted", "deleted": True}

    async def _tell_deleted(self, link: RunnerLink, session_id: str) -> None:
        try:
            answer = await link.request(
                "DELETE", f"/v1/sessions/{session_id}", timeout_s=self.options.request_timeout_s
            )
        except RunnerGone as exc:
            log.info("session %s: the runner did not answer the delete: %s", session_id, exc)
            return
        log.info("session %s: the runner answered the delete with %d", session_id, answer.status)

    async def resolve(
        self, row: SessionRow, elicitation_id: str, action: str, content: Any
    ) -> dict[str, Any]:
        """Store a verdict and forward it to the runner as an ``approval`` event.

        Raises:
            Refused: 404 for an elicitation this session does not have, 409 when it was
                already resolved.
        """
        data: dict[str, Any] = {"elicitation_id": elicitation_id, "action": action}
        if content is not None:
            data["content"] = content
        event = {
            "type": "response.elicitation_resolved",
            "elicitation_id": elicitation_id,
            "action": action,
            "session_id": row.id,
        }
        try:
            entry = await self.store.resolve_elicitation(
                row.id, elicitation_id, action, content, {"type": "approval", "data": data}, event
            )
        except KeyError:
            raise Refused(
                404,
                "unknown_elicitation",
                f"Session {row.id!r} has no elicitation {elicitation_id!r}.",
            ) from None
        except NotPending as exc:
            raise Refused(
                409, "already_resolved", f"Elicitation {elicitation_id!r} is already {exc.state}."
            ) from None
        self.notify(row.id)
        log.info("session %s: elicitation %s resolved (%s)", row.id, elicitation_id, action)
        delivery = await self._await_delivery(row.id, entry)
        answer: dict[str, Any] = {"queued": delivery is None, "elicitation_id": elicitation_id}
        if delivery is not None:
            answer["runner_status"] = delivery.status
        return answer

    async def control(self, row: SessionRow, kind: str) -> dict[str, Any]:
        """Forward a control event (``interrupt``, ``stop_session``, ``compact``) as ``{"type"}``.

        Not queued: an interrupt delivered long after it was asked for would stop a turn the
        user no longer meant.

        Raises:
            Offline: no runner, or it did not answer.
        """
        link = self.link
        if link is None:
            raise Offline(f"The runner is not connected; the {kind} was not delivered.")
        stopping = kind in ("interrupt", "stop_session")
        if stopping:
            # Fenced before the forward, as the real server: output the runner streams
            # after it took the interrupt belongs to a turn the user stopped.
            self._fenced.add(row.id)
        try:
            answer = await link.request(
                "POST",
                f"/v1/sessions/{row.id}/events",
                body=_encode({"type": kind}),
                timeout_s=self.options.request_timeout_s,
            )
        except RunnerGone as exc:
            self._fenced.discard(row.id)
            raise Offline(f"The runner did not take the {kind}: {exc}") from None
        if stopping and answer.status >= 400:
            self._fenced.discard(row.id)  # the turn runs on: keep its output
        return {"queued": False, "runner_status": answer.status}

    # -- runner calls ----------------------------------------------------------------------

    async def evaluate(
        self,
        row: SessionRow,
        phase: str,
        data: dict[str, Any],
        request_data: dict[str, Any] | None = None,
        target: str | None = None,
    ) -> Decision:
        """``/policies/evaluate`` (§iii.8): the decision on one phase of the session.

        A tool result names its call in ``request_data`` (or ``target``, PROTOCOL_0_19 §F.2);
        older runners put the name in ``data``, which is read too.
        """
        tool = tool_name_of(data, request_data, target)
        source = request_data if phase == TOOL_RESULT and request_data is not None else data
        return await self.decide(row, phase, tool, source.get("arguments"))

    async def decide(
        self, row: SessionRow, phase: str, tool: str | None, arguments: Any
    ) -> Decision:
        """The server rules and the session agent's policies on one call (see ``_policy``)."""
        server = decide(self.settings.policies, phase, tool)
        return combine(server, await self._agent_policies(row), phase, tool, arguments)

    async def mcp(self, row: SessionRow, rpc: Any) -> dict[str, Any]:
        """``POST /mcp`` (§iii.9): one JSON-RPC 2.0 request → its answer (see ``_mcp.py``)."""
        return await self._tools.handle(row, rpc)

    async def add_runner_item(self, row: SessionRow, data: Any) -> dict[str, Any]:
        """``external_conversation_item`` (§iii.10) → a stored item.

        Raises:
            Refused: 422 when ``data`` is not ``{item_type, item_data, response_id?}``.
        """
        if not isinstance(data, dict) or not isinstance(data.get("item_data", {}), dict):
            raise Refused(422, "invalid_event", "data must be {item_type, item_data, response_id?}")
        item_type = data.get("item_type", "message")
        if not isinstance(item_type, str) or not item_type:
            raise Refused(422, "invalid_event", "item_type must be a non-empty string")
        fields = {**(data.get("item_data") or {}), "type": item_type}
        if isinstance(data.get("response_id"), str):
            fields["response_id"] = data["response_id"]
        if isinstance(data.get("source_id"), str):
            # The runner's idempotency key: a replayed item is stored once.
            fields["source_id"] = data["source_id"]
        item = await self.store.add_item(row.id, fields)
        return {"queued": False, "item_id": item["id"]}

    async def ingest_batch(self, frame: dict[str, Any]) -> dict[str, Any]:
        """An ``event.batch`` from the runner (§A.3) → its ``event.ack``.

        Events are applied in order; the ack's ``applied`` counts those that were. Only
        ``external_conversation_item`` is stored here (with its ``source_id``, so a replayed
        batch is stored once); the other tunnel types of the real server feed native-harness
        transcripts this server has no use for, and are refused by name, not dropped.
        """
        events = frame.get("events")
        if (
            not isinstance(events, list)
            or not events
            or not all(isinstance(e, dict) and isinstance(e.get("type"), str) for e in events)
        ):
            return event_ack(frame, 0, "events must be a non-empty list of objects with a type")
        if len(events) > _MAX_BATCH_EVENTS or len(_encode(frame)) > _MAX_BATCH_BYTES:
            return event_ack(frame, 0, "event batch exceeds count or size limit")
        session_id = frame.get("session_id")
        row = await self.store.get_session(session_id) if isinstance(session_id, str) else None
        if row is None:
            return event_ack(frame, 0, f"no session {session_id!r}")
        for index, event in enumerate(events):
            kind = event["type"]
            if kind not in _TUNNEL_EVENT_TYPES:
                return event_ack(frame, index, "event type is not allowed on runner tunnel")
            if kind != "external_conversation_item":
                return event_ack(frame, index, f"{kind} is not supported by this server")
            data = event.get("data")
            if not isinstance(data, dict) or not isinstance(data.get("source_id"), str):
                return event_ack(frame, index, "source_id required for tunnel replay")
            try:
                await self.add_runner_item(row, data)
            except Refused as exc:
                return event_ack(frame, index, exc.detail)
            except UnknownSession:
                return event_ack(frame, index, f"no session {session_id!r}")
        self.notify(row.id)
        return event_ack(frame, len(events))

    # -- client streams --------------------------------------------------------------------

    def changed(self, session_id: str) -> trio.Event:
        """An event set when the session next gets an event (take it before reading)."""
        event = self._changed.get(session_id)
        if event is None:
            event = self._changed[session_id] = trio.Event()
        if self.closing.is_set():
            event.set()
        return event

    def notify(self, session_id: str) -> None:
        """Wake the session's client streams: it has new events."""
        event = self._changed.pop(session_id, None)
        if event is not None:
            event.set()

    # -- the runner link -------------------------------------------------------------------

    async def run_link(self, link: RunnerLink) -> None:
        """Serve a connected runner until its tunnel closes (replacing an older tunnel)."""
        old = self.link
        self.link = link
        # Until this link's nursery exists, new sessions wait for _bind_all to pick them up
        # (never a task in the old link's nursery, which is about to be cancelled).
        self._link_nursery = None
        self._bindings = {}
        self._link_changed.set()
        self._link_changed = trio.Event()
        if old is not None:
            log.info("runner %s: a new tunnel replaces the old one", link.runner_id)
            await old.close(4000, "tunnel replaced")
        log.info(
            "runner %s connected (version %s, harnesses %s, capabilities %s, connection %s)",
            link.runner_id,
            link.hello.get("runner_version"),
            link.hello.get("harnesses"),
            link.capabilities,
            link.connection_id,
        )
        try:
            await link.ready()  # before any request, as the real server (§A.3)
            async with trio.open_nursery() as nursery:
                self._link_nursery = nursery
                nursery.start_soon(self._bind_all, link, nursery)
                nursery.start_soon(self._close_on_shutdown, link)
                await link.serve()
                nursery.cancel_scope.cancel()
        finally:
            if self.link is link:
                self.link = None
                self._link_nursery = None
                self._bindings = {}
                self._link_changed.set()
                self._link_changed = trio.Event()
            log.info("runner %s disconnected (code %s)", link.runner_id, link.close_code or "none")

    async def _close_on_shutdown(self, link: RunnerLink) -> None:
        await self.closing.wait()
        # 1012 "service restart": the runner reconnects at once instead of backing off.
        await link.close(1012, "service restart")

    async def wait_link(self, timeout: float) -> RunnerLink | None:
        """The connected runner, waiting up to ``timeout`` for one (None if none came)."""
        with trio.move_on_after(timeout):
            while self.link is None and not self.closing.is_set():
                await self._link_changed.wait()
        return self.link

    def _bind(self, session_id: str) -> None:
        """Start binding a session on the current tunnel, unless it is bound already."""
        link, nursery = self.link, self._link_nursery
        if link is None or nursery is None or session_id in self._bindings:
            return
        binding = self._bindings[session_id] = _Binding()
        nursery.start_soon(self._session_task, link, session_id, binding, nursery)

    async def _bind_all(self, link: RunnerLink, nursery: trio.Nursery) -> None:
        # One session at a time, the next after the previous init answered (§ii.2).
        for session_id in await self.store.sessions_for_runner(link.runner_id):
            if session_id in self._bindings or self.link is not link:
                continue
            binding = self._bindings[session_id] = _Binding()
            await nursery.start(self._session_task, link, session_id, binding, nursery)

    async def _session_task(
        self,
        link: RunnerLink,
        session_id: str,
        binding: _Binding,
        nursery: trio.Nursery,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Init the session on the runner and relay its stream, again whenever it ends."""
        started = False

        def announce() -> None:
            # Once: after the first init answered, or when the task ends without one.
            nonlocal started
            if not started:
                started = True
                task_status.started()

        with binding.scope():
            await self._bind_session(link, session_id, binding, nursery, announce)
        announce()

    async def _bind_session(
        self,
        link: RunnerLink,
        session_id: str,
        binding: _Binding,
        nursery: trio.Nursery,
        announce: Callable[[], None],
    ) -> None:
        opts = self.options
        delivering = False
        delay = opts.retry_base_s
        while not link.closed.is_set():
            try:
                await self._init_session(link, session_id)
                announce()
                async with link.open(
                    "GET",
                    f"/v1/sessions/{session_id}/stream",
                    head_timeout_s=opts.request_timeout_s,
                ) as call:
                    if call.status != 200:
                        raise _InitFailed(f"GET .../stream answered {call.status}")
                    binding.set_ready(True)
                    if not delivering:
                        nursery.start_soon(self._deliver_loop, link, session_id, binding)
                        delivering = True
                    delay = opts.retry_base_s
                    why = await self._relay(session_id, call)
                log.info("session %s: the runner stream %s; opening it again", session_id, why)
            except UnknownSession:
                log.warning("session %s vanished from the store; not binding it", session_id)
                break
            except RunnerGone as exc:
                if link.closed.is_set():
                    break
                log.warning("session %s: %s", session_id, exc)
            except _InitFailed as exc:
                log.warning("session %s: binding to the runner failed: %s", session_id, exc)
            except Exception:
                # A bug here must not take the whole tunnel (and every other session) down.
                log.exception("session %s: relaying from the runner failed", session_id)
            finally:
                binding.set_ready(False)
            announce()
            await trio.sleep(delay)
            delay = min(delay * 2, opts.retry_cap_s)

    async def _init_session(self, link: RunnerLink, session_id: str) -> None:
        """``POST /v1/sessions`` with the ``session_init`` v2 envelope (§B.1)."""
        row = await self.store.get_session(session_id)
        if row is None:
            raise UnknownSession(session_id)
        pending = await self.store.has_pending_message(session_id)
        snapshot = {
            "created_at": int(row.created_at),
            "updated_at": int(row.updated_at),
            "workspace": None,
            "labels": row.labels,
            "reasoning_effort": None,
            "model_override": None,
            "harness_override": None,
            "cost_control_mode_override": None,
            "terminal_launch_args": None,
            "external_session_id": None,
            "parent_session_id": None,
            "root_session_id": row.id,
            "inference_config": None,
        }
        body = {
            "session_id": row.id,
            "agent_id": row.agent_id,
            "sub_agent_name": None,
            "session_init": {
                "protocol_version": 2,
                "server_version": SERVER_VERSION,
                "session_id": row.id,
                "agent_id": row.agent_id,
                "sub_agent_name": None,
                "snapshot": snapshot,
                # A message is about to be forwarded: the runner must not also start a
                # recovery turn from the history.
                "suppress_recovery_turn": pending,
                "resume_interrupted_turn": False,
                "recovery_id": None,
            },
        }
        timeout = self.options.request_timeout_s
        answer = await link.request("POST", "/v1/sessions", body=_encode(body), timeout_s=timeout)
        if not 200 <= answer.status < 300:
            detail = error_detail(answer.json(), answer.body)
            raise _InitFailed(f"POST /v1/sessions answered {answer.status}: {detail}")

    async def _relay(self, session_id: str, call: Any) -> str:
        """Store every event of an open runner stream; returns why the stream stopped."""
        parser = SseParser()
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        while True:
            with trio.move_on_after(self.options.stream_dead_s) as waited:
                chunk = await call.next_chunk()
            if waited.cancelled_caught:
                return f"was silent for {self.options.stream_dead_s:g}s"
            if chunk is None:
                return "ended"
            events = parser.feed(decoder.decode(chunk))
            if events and session_id in self._fenced:
                events, fenced = fence(events)
                if not fenced:
                    self._fenced.discard(session_id)
            if events:
                await self.store.append_runner_events(session_id, events)
                self.notify(session_id)
            if parser.done:
                return "said [DONE]"

    # -- the outbox ------------------------------------------------------------------------

    async def _await_delivery(self, session_id: str, entry_id: int) -> _Delivery | None:
        """Wake the session's deliverer and wait (bounded) for entry ``entry_id``'s answer."""
        delivery = self._deliveries.setdefault(entry_id, _Delivery())
        self._wake_outbox(session_id)
        try:
            if self.link is not None:
                with trio.move_on_after(self.options.deliver_wait_s):
                    await delivery.done.wait()
        finally:
            self._deliveries.pop(entry_id, None)
        return delivery if delivery.done.is_set() else None

    def _wake_outbox(self, session_id: str) -> None:
        event = self._outbox_wake.pop(session_id, None)
        if event is not None:
            event.set()

    async def _deliver_loop(self, link: RunnerLink, session_id: str, binding: _Binding) -> None:
        """Send the session's outbox to the runner, in order, while its stream is open."""
        with binding.scope():
            await self._deliver_outbox(link, session_id, binding)

    async def _deliver_outbox(self, link: RunnerLink, session_id: str, binding: _Binding) -> None:
        while not link.closed.is_set():
            await binding.wait_ready()
            wake = self._outbox_wake.setdefault(session_id, trio.Event())
            entry = await self.store.next_outbox(session_id)
            if entry is None:
                await wake.wait()
                continue
            try:
                await self._deliver(link, entry)
            except Exception:
                log.exception(
                    "session %s: forwarding %s %d failed", session_id, entry.kind, entry.id
                )
                await trio.sleep(self.options.retry_cap_s)

    async def _deliver(self, link: RunnerLink, entry: Any) -> None:
        opts = self.options
        path = f"/v1/sessions/{entry.session_id}/events"
        try:
            answer = await link.request(
                "POST", path, body=entry.body, timeout_s=opts.request_timeout_s
            )
        except RunnerGone as exc:
            if link.closed.is_set():
                return  # sent again when the runner is back
            status, detail, answer = None, str(exc), None
        else:
            status, detail = answer.status, error_detail(answer.json(), answer.body)
        if answer is None or status is None or status >= 500:
            attempts = await self.store.count_attempt(entry.id)
            if attempts < opts.max_delivery_attempts:
                delay = min(opts.retry_base_s * 2 ** (attempts - 1), opts.retry_cap_s)
                log.warning(
                    "session %s: forwarding %s %d failed (%s); attempt %d/%d again in %.1fs",
                    entry.session_id, entry.kind, entry.id, detail, attempts,
                    opts.max_delivery_attempts, delay,
                )  # fmt: skip
                await trio.sleep(delay)
                return
            log.error(
                "session %s: giving up on %s %d: %s", entry.session_id, entry.kind, entry.id, detail
            )
            await self._finish(entry, "failed", status, answer, detail)
            return
        await self._finish(entry, "delivered", status, answer, detail)

    async def _finish(
        self, entry: Any, state: str, status: int | None, answer: Any, detail: str
    ) -> None:
        body = msgspec.json.decode(entry.body)
        events: list[dict[str, Any]] = []
        refused = state == "failed" or (
            entry.kind == "message" and status is not None and status >= 400
        )
        if entry.kind == "message" and not refused:
            events.append(
                {
                    "sequence_number": None,
                    "type": "session.input.consumed",
                    "data": {
                        "item_id": body.get("persisted_item_id"),
                        "type": "message",
                        "data": {"role": "user", "content": body.get("content")},
                    },
                }
            )
        elif refused:
            # The runner will not act on this; say so on the stream, or the client waits for
            # a turn that never starts.
            events.append(
                {
                    "type": "session.delivery_failed",
                    "kind": entry.kind,
                    "item_id": body.get("persisted_item_id"),
                    "elicitation_id": (body.get("data") or {}).get("elicitation_id"),
                    "status": status,
                    "detail": detail,
                }
            )
        await self.store.finish_outbox(
            entry.id, state, status, answer.body if answer else None, events
        )
        if events:
            self.notify(entry.session_id)
        # Recorded even when nobody waits yet: the request that stored the entry may resume
        # only after its delivery finished. Old outcomes nobody asked for are dropped.
        delivery = self._deliveries.setdefault(entry.id, _Delivery())
        delivery.status = status
        delivery.body = answer.json() if answer is not None else None
        delivery.done.set()
        while len(self._deliveries) > _KEPT_DELIVERIES:
            self._deliveries.popitem(last=False)

    # -- status ----------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """A small status document (``GET /healthz``)."""
        link = self.link
        return {
            "ok": True,
            "version": __version__,
            "runner_id": self.runner_id,
            "runner_online": link is not None,
            "runner": None
            if link is None
            else {
                "connected_at": link.connected_at,
                "hello": link.hello,
                "bound_sessions": len(self._bindings),
                "open_streams": sum(1 for b in self._bindings.values() if b.ready),
                **link.stats,
            },
        }
