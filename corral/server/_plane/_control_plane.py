"""The :class:`ControlPlane`: its state, its lifecycle, agents, sessions and client events.

The runner side lives in its parts: :class:`RunnerBinding` (the link and the session
streams), :class:`RunnerCalls` (what the runner asks) and :class:`OutboxDelivery` (forwards
to the runner); :class:`ControlPlane` is all three over one state.
"""

from __future__ import annotations

import collections
import logging
import os
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

import msgspec
import trio

from ... import __version__
from ..._jsonlines import JsonObject
from ...config import ServerSettings
from ...spec import AgentSpec, load_spec_yaml, make_bundle
from .._agents import PACKAGED_AGENTS, Agent, AgentCatalog, spec_policies, yaml_version
from .._conversation import new_id
from .._mcp import ToolCalls
from .._policy import AgentPolicy
from .._state import ServerInfo, ensure_runner_token, lock_server_dir, server_dir
from .._store import NotPending, SessionRow, Store
from .._tunnel import RunnerGone, RunnerLink
from ._answers import (
    ControlForwarded,
    Health,
    MessagePosted,
    Resolved,
    SessionDeleted,
    SessionObject,
    SessionSnapshot,
)
from ._binding import RunnerBinding, _Binding
from ._coalesce import Coalesced
from ._credential import ClientToken
from ._options import PlaneOptions
from ._outbox import OutboxDelivery, _Delivery
from ._refusals import Offline, Refused
from ._runner_calls import RunnerCalls

log = logging.getLogger("corral.server")
_encode = msgspec.json.Encoder().encode


class ControlPlane(RunnerBinding, RunnerCalls, OutboxDelivery):
    """The embedded control plane. Use ``await open()``, serve, then ``await close()``.

    Args:
        state_dir: the host's state dir; everything lives in ``state_dir/server``.
        settings: ``[server]`` of ``corral.toml``.
        options: timings and limits (defaults for production).
    """

    def __init__(
        self,
        state_dir: Path,
        settings: ServerSettings,
        options: PlaneOptions | None = None,
        *,
        harnesses: Collection[str] = (),
    ) -> None:
        self.settings = settings
        #: Harness kinds the host's config registers, which its runner runs besides those
        #: it announces (an agent file naming another is listed invalid once one connects).
        self.host_harnesses = frozenset(harnesses)
        self.options = options or PlaneOptions()
        self.dir = server_dir(state_dir)
        self.store = Store(self.dir / "control.db")
        self.catalog = AgentCatalog(
            [PACKAGED_AGENTS, *(Path(d).expanduser() for d in settings.agents_dirs)]
        )
        self.runner_token = ""
        self.runner_id = ""
        #: What clients present as ``Authorization: Bearer`` (``_credential.py``); a
        #: rotation wakes every client stream, so the ones opened with the old token end.
        self.client_token = ClientToken(self.dir, on_rotate=self.wake_streams)
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
        self._agents = Coalesced(
            lambda: trio.to_thread.run_sync(self.catalog.load, self.runner_harnesses())
        )
        self._specs: dict[str, AgentSpec | None] = {}
        self._copy_policies: dict[str, list[AgentPolicy]] = {}
        self._tools = ToolCalls(self)
        #: Sessions deleted while this process runs: their client streams end.
        self.deleted: set[str] = set()
        #: Sessions whose turn was interrupted here: see ``_conversation.fence``.
        self._fenced: set[str] = set()

    # -- lifecycle -------------------------------------------------------------------------

    async def open(self) -> None:
        """Lock the state dir, create or read the tokens, open the database, load the agents.

        Raises:
            StateDirBusy: another control plane runs on this state dir.
        """
        self._lock_fd = await trio.to_thread.run_sync(lock_server_dir, self.dir)
        self.runner_token, self.runner_id = await trio.to_thread.run_sync(
            ensure_runner_token, self.dir
        )
        await trio.to_thread.run_sync(self.client_token.load)
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

    def runner_harnesses(self) -> frozenset[str] | None:
        """The harness kinds the connected runner runs (its ``hello``'s and the config's);
        None while no runner is connected (nobody can say which it runs)."""
        announced = self.link.hello.get("harnesses") if self.link is not None else None
        if not isinstance(announced, list):
            return None
        return self.host_harnesses | {h for h in announced if isinstance(h, str)}

    async def agents(self) -> dict[str, Agent]:
        """Re-read the agent directories (a few small files, read once for all who ask at
        the same time) and return the agents."""
        return await self._agents()

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
        # A child made from an uploaded bundle has an agent of its own, whatever its name.
        if agent is not None and agent.agent_id == session.agent_id:
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
        if agent is not None and agent.agent_id == session.agent_id:
            return agent.policies
        key = yaml_version(session.agent_yaml)
        if key not in self._copy_policies:
            self._copy_policies[key] = spec_policies(session.agent_yaml)
        return self._copy_policies[key]

    # -- sessions --------------------------------------------------------------------------

    async def create_session(
        self, agent_name: str, title: str | None, key: str | None = None
    ) -> SessionRow:
        """Create a session of an agent and bind it to the runner.

        A create posted again with the same idempotency ``key`` (a client whose POST was cut
        off) is the session made the first time.

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
        stored = await self.store.create_session(row, key)
        if stored.id != row.id:
            log.info("session %s posted again (same idempotency key)", stored.id)
            return stored
        log.info("session %s created (agent %s)", row.id, row.agent)
        self._bind(row.id)
        return row

    async def session(self, session_id: str) -> SessionRow:
        """The session, or :class:`Refused` 404."""
        row = await self.store.get_session(session_id)
        if row is None:
            raise Refused(404, "not_found", f"No session {session_id!r}.")
        return row

    def session_object(self, row: SessionRow) -> SessionObject:
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

    async def snapshot(self, row: SessionRow) -> SessionSnapshot:
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
            "sub_agent_name": row.sub_agent_name,
            "kind": "default" if row.parent_session_id is None else "sub_agent",
            "parent_session_id": row.parent_session_id,
            "root_conversation_id": row.root_session_id or await self.root_of(row),
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

    async def post_message(
        self, row: SessionRow, content: list[JsonObject], key: str | None = None
    ) -> MessagePosted:
        """Persist a user message, then forward it to the runner (§ii.7).

        The item and its forward are stored before anything is sent, so the message survives
        any failure after this returns; ``queued`` says whether the runner has answered yet.
        A message posted again with the same idempotency ``key`` (a client whose POST was
        cut off retries it) is the message stored the first time: the same answer, nothing
        stored or forwarded again.
        """
        forward = {
            "type": "message",
            "role": "user",
            "content": content,
            "agent_id": row.agent_id,
            # A child names its sub-agent, as its init does.
            "model": row.sub_agent_name or row.agent,
            "has_mcp_servers": False,
        }
        item, entry = await self.store.add_user_message(row.id, content, forward, key)
        if entry is None:
            log.info(
                "session %s: message %s posted again (same idempotency key)", row.id, item["id"]
            )
        self._wake_outbox(row.id)
        return {"queued": True, "item_id": item["id"]}

    async def delete_session(self, row: SessionRow) -> SessionDeleted:
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
    ) -> Resolved:
        """Store a verdict and forward it to the runner as an ``approval`` event.

        Raises:
            Refused: 404 for an elicitation this session does not have, 409 when it was
                already resolved.
        """
        data: JsonObject = {"elicitation_id": elicitation_id, "action": action}
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
        await self.notify_tree(row.id)
        log.info("session %s: elicitation %s resolved (%s)", row.id, elicitation_id, action)
        delivery = await self._await_delivery(row.id, entry)
        answer: Resolved = {"queued": delivery is None, "elicitation_id": elicitation_id}
        if delivery is not None:
            answer["runner_status"] = delivery.status
        return answer

    async def control(self, row: SessionRow, kind: str) -> ControlForwarded:
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

    # -- client streams --------------------------------------------------------------------

    def changed(self, session_id: str) -> trio.Event:
        """An event set when the session next gets an event (take it before reading)."""
        event = self._changed.get(session_id)
        if event is None:
            event = self._changed[session_id] = trio.Event()
        if self.closing.is_set():
            event.set()
        return event

    def wake_streams(self) -> None:
        """Wake every client stream, to look again at whether it may go on."""
        for session_id in list(self._changed):
            self.notify(session_id)

    async def notify_tree(self, session_id: str) -> None:
        """Wake the streams of the session and of its ancestors (which see its elicitation
        events mirrored)."""
        for changed in [session_id, *await self.store.ancestors(session_id)]:
            self.notify(changed)

    def notify(self, session_id: str) -> None:
        """Wake the session's client streams: it has new events."""
        event = self._changed.pop(session_id, None)
        if event is not None:
            event.set()

    # -- status ----------------------------------------------------------------------------

    def health(self) -> Health:
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
