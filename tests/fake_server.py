"""A fake omnigent server for tests: the HTTP API a runner calls (PROTOCOL_FACTS §iii).

It runs inside the test's trio loop on 127.0.0.1 (``await server.start(nursery)``), or in a
thread of its own for synchronous tests (``with server.serve_in_thread():``), and answers in
the shapes the capture shows:

=======================================================  =====================================
route                                                     answer
=======================================================  =====================================
``POST /v1/runners/{id}/token``                           401/400 like the capture, or a token
``GET /api/version``                                      ``{"version": "0.11.0.dev0"}``
``GET /v1/sessions/{id}/agent/contents``                  the agent's tar.gz + ``x-agent-*``
``GET /v1/sessions/{id}``                                 the full snapshot (``cache-control``)
``PATCH /v1/sessions/{id}``                               merges ``labels``/fields; snapshot
``GET /v1/sessions/{id}/items?limit&order&after``         a list page (``has_more``, cursors)
``GET /v1/sessions/{id}/labels``                          ``{"id", "labels"}``
``POST /v1/sessions/{id}/policies/evaluate``              ``policy(session_id, body)``; a body
                                                          0.19.1 refuses is its 400 (§F.2)
``POST /v1/sessions/{id}/mcp``                            JSON-RPC ``tools/call``, with ask →
                                                          ``input_required`` → retry
``POST /v1/sessions/{id}/events``                         202; ``external_conversation_item``
                                                          becomes an item if 0.19.1 would
                                                          parse it (§E.1), else 400
``GET /v1/files/{id}/content``                            a file (placeholder route, not in §iii)
``GET /v1/sessions/{id}/resources/files/{fid}/content``   a file (the 0.19.1 route)
``GET /v1/agents``                                        list page of agent objects (0.19.1)
``GET /v1/sessions?agent_name``                           list page of session rows (0.19.1)
``GET /v1/sessions/{id}/agent``                           the session's agent object
``GET /v1/sessions/{id}/child_sessions``                  list page of its children
``GET /v1/runners/{id}/status``                           ``{"runner_id", "online"}``
                                                          (``online_runners``)
``POST /v1/sessions`` (JSON)                              a child of ``parent_session_id``
                                                          (``initial_items`` become items); 201
``POST /v1/sessions`` (multipart)                         a child from the ``bundle``'s agent;
                                                          201 ``{"session_id", "agent_id", ...}``
``PUT /v1/sessions/{id}/permissions``                     a grant (``grants``); ``__public__``
                                                          above read is 0.19.1's 400
=======================================================  =====================================

Every request is recorded (:class:`Recorded`: method, path, query, headers, raw body) before it
is answered. Faults are scripted per route with :meth:`FakeOmnigentServer.fail`: an error
status, a hang until the client gives up, a dropped connection, or a hold: the request waits
until the test releases it (``fault.released.set()``) and is then answered normally. When
``token`` is set, calls without that ``X-Omnigent-Runner-Tunnel-Token`` get the server's 401.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote

import trio

from corral.server._session_writes import parse_form
from corral.spec import load_bundle, make_bundle
from tests._http11 import read_request, until_eof

SERVER_VERSION = "0.11.0.dev0"
#: A fixed "now" for created_at fields, so recorded shapes are stable.
NOW = 1795966664

#: ``policy(session_id, body) -> answer``; the default allows everything.
Policy = Callable[[str, dict[str, Any]], dict[str, Any]]
#: ``tool(session_id, name, arguments) -> JSON-RPC result`` (``{"content": [...]}``).
Tool = Callable[[str, str, dict[str, Any]], dict[str, Any]]
#: ``ask(session_id, name, arguments) -> bool``: True makes the call need an approval first.
Ask = Callable[[str, str, dict[str, Any]], bool]


@dataclass
class Recorded:
    """One request as the server received it."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    raw_headers: list[tuple[str, str]]
    body: bytes
    received_at: float

    @property
    def json(self) -> Any:
        return json.loads(self.body) if self.body else None

    @property
    def params(self) -> dict[str, str]:
        return dict(parse_qsl(self.query, keep_blank_values=True))


@dataclass
class Fault:
    """A scripted misbehaviour for requests matching ``method`` and ``path`` (a regex)."""

    method: str
    path: str
    status: int = 503
    body: bytes = b'{"error":{"code":"unavailable","message":"try again"}}'
    headers: dict[str, str] = field(default_factory=dict)
    mode: str = "status"  # "status" | "hang" | "drop" | "hold"
    times: int = 1
    #: Matching requests let through untouched before the fault applies.
    after: int = 0
    #: mode "hold": set when a held request arrives; the test sets ``released`` to answer it.
    arrived: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)

    def matches(self, method: str, path: str) -> bool:
        """Whether the fault applies to this request (counting the ones let through)."""
        if self.times <= 0 or self.method != method or re.fullmatch(self.path, path) is None:
            return False
        if self.after > 0:
            self.after -= 1
            return False
        return True


@dataclass
class Agent:
    agent_id: str
    name: str
    yaml_text: str
    version: int = 1
    session_scoped: bool = True
    filename: str | None = None
    description: str | None = None
    harness: str | None = None
    mcp_servers: list[dict[str, Any]] = field(default_factory=list)
    policies: list[dict[str, Any]] = field(default_factory=list)

    def bundle(self) -> bytes:
        return make_bundle(self.yaml_text, filename=self.filename or f"{self.name}.yaml")


def default_tool(session_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """Echo the call as the text content the real server wraps tool output in."""
    return {
        "content": [{"type": "text", "text": json.dumps({"tool": name, "arguments": arguments})}]
    }


def allow_all(session_id: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"result": "POLICY_ACTION_ALLOW"}


# -- item builders (the flattened item shape of §iii.6) --------------------------------------


def user_message(text: str, **fields: Any) -> dict[str, Any]:
    content = [{"type": "input_text", "text": text}]
    return {"type": "message", "role": "user", "content": content, **fields}


def assistant_message(text: str, model: str = "fake-model", **fields: Any) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text}]
    return {"type": "message", "role": "assistant", "content": content, "model": model, **fields}


def function_call(name: str, arguments: str, call_id: str, **fields: Any) -> dict[str, Any]:
    return {
        "type": "function_call",
        "model": "fake-model",
        "name": name,
        "arguments": arguments,
        "call_id": call_id,
        **fields,
    }


def function_call_output(call_id: str, output: str, **fields: Any) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": output, **fields}


# -- what the 0.19.1 server accepts (PROTOCOL_0_19 §F.2, §E.1) --------------------------------

#: ``event.type`` → (``data`` must be an object, where the tool name may be: (container,
#: path as the server's message names it), in precedence order).
EVALUATE_PHASES: dict[str, tuple[bool, tuple[tuple[str, str], ...]]] = {
    "PHASE_TOOL_CALL": (True, (("data", "event.data.name"),)),
    "PHASE_TOOL_RESULT": (
        True,
        (("request_data", "event.request_data.name"), ("target", "event.target")),
    ),
    "PHASE_LLM_REQUEST": (True, ()),
    "PHASE_LLM_RESPONSE": (True, ()),
    "PHASE_REQUEST": (False, ()),
}
_EVALUATE_ELICITATION_ID = re.compile(r"^elicit_evaluate_[0-9a-f]{32}$")


def evaluate_problem(body: Any) -> str | None:
    """Why the real server answers 400 ``invalid_input`` to a ``/policies/evaluate`` body, in
    its own words; None for a body it evaluates. Checked in the server's order."""
    if not isinstance(body, dict):
        return "Policy evaluate body must be a JSON object."
    event = body.get("event")
    if not isinstance(event, dict):
        return "Policy evaluate body must include an 'event' object."
    kind = event.get("type")
    if kind is not None and not isinstance(kind, str):
        return f"Policy evaluate 'event.type' must be a string; got {_py_type(kind)}."
    if kind not in EVALUATE_PHASES:
        return f"Unknown event type: {kind!r}. Expected one of {list(EVALUATE_PHASES)}."
    eid = body.get("_omnigent_elicitation_id")
    if eid is not None and not (isinstance(eid, str) and _EVALUATE_ELICITATION_ID.match(eid)):
        return (
            "Policy evaluate '_omnigent_elicitation_id' must match "
            "'elicit_evaluate_' + 32 hex chars."
        )
    must_be_object, name_sources = EVALUATE_PHASES[kind]
    data = event.get("data")
    if must_be_object and not isinstance(data, dict):
        return f"Policy evaluate 'event.data' must be an object for {kind!r}; got {_py_type(data)}."
    if not must_be_object and not isinstance(data, dict | str):
        return (
            f"Policy evaluate 'event.data' must be an object or string for {kind!r}; "
            f"got {_py_type(data)}."
        )
    if name_sources:
        names = []
        for container, _path in name_sources:
            if container == "target":
                names.append(event.get("target"))
            else:
                holder = data if container == "data" else event.get(container)
                names.append(holder.get("name") if isinstance(holder, dict) else None)
        if not any(isinstance(n, str) and n for n in names):
            paths = " or ".join(repr(path) for _c, path in name_sources)
            return f"Policy evaluate requires a non-empty tool name in {paths} for {kind!r}."
    context = event.get("context")
    if context is not None and not isinstance(context, dict):
        return f"Policy evaluate 'event.context' must be an object; got {_py_type(context)}."
    return None


def _py_type(value: Any) -> str:
    """The type name the server (Python) prints for a JSON value."""
    return type(value).__name__


#: Item types an ``external_conversation_item`` may carry, with their required fields and
#: those fields' JSON types (the server's conversation item models, §E.1).
ITEM_FIELDS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "message": {"role": str, "content": list},
    "function_call": {"agent": str, "name": str, "arguments": str, "call_id": str},
    "function_call_output": {"call_id": str, "output": str},
}


def item_problem(kind: Any, data: Any) -> str | None:
    """Why the real server refuses an item of type ``kind`` with fields ``data`` (§E.1), or
    None. An assistant message needs ``agent`` too; ``agent`` is stored and read back as
    ``model``."""
    if not isinstance(kind, str) or kind not in ITEM_FIELDS:
        return "external_conversation_item requires known data.item_type"
    if not isinstance(data, dict):
        return "external_conversation_item requires object data.item_data"
    required = dict(ITEM_FIELDS[kind])
    if kind == "message" and data.get("role") == "assistant":
        required["agent"] = str
    for name, expected in required.items():
        if not isinstance(data.get(name), expected):
            return f"Invalid data payload for external item type {kind!r}: {name} is missing"
    if kind == "message" and data["role"] not in ("user", "assistant"):
        return f"Invalid data payload for external item type {kind!r}: role is not user/assistant"
    return None


def _hex() -> str:
    return uuid.uuid4().hex


class FakeOmnigentServer:
    """The server. ``await server.start(nursery)``, then point a client at ``base_url``."""

    def __init__(self, *, token: str | None = None) -> None:
        self.token = token
        self.agents: dict[str, Agent] = {}
        self.sessions: dict[str, dict[str, Any]] = {}
        self.items: dict[str, list[dict[str, Any]]] = {}
        self.events: dict[str, list[dict[str, Any]]] = {}
        #: (session id, ``source_id``) → the item an ``external_conversation_item`` made.
        self._sourced: dict[tuple[str, str], str] = {}
        self.files: dict[str, tuple[bytes, str]] = {}
        self.requests: list[Recorded] = []
        self.faults: list[Fault] = []
        self.policy: Policy = allow_all
        self.tool: Tool = default_tool
        self.ask: Ask = lambda session_id, name, arguments: False
        #: elicitation id -> (session_id, name, arguments) of calls waiting for an approval
        self.elicitations: dict[str, tuple[str, str, dict[str, Any]]] = {}
        #: "unauthenticated" (401, fresh server) | "unsupported" (400) | "ok" (a token)
        self.token_mode = "unauthenticated"
        #: Runner ids ``GET /v1/runners/{id}/status`` calls online.
        self.online_runners: set[str] = set()
        #: session id -> user id -> level, from ``PUT .../permissions``.
        self.grants: dict[str, dict[str, int]] = {}
        self.port = 0
        self._listeners: list[trio.SocketListener] = []
        self._request_ids = itertools.count(1)

    # -- setup -------------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, nursery: trio.Nursery) -> None:
        serve = functools.partial(trio.serve_tcp, host="127.0.0.1")
        self._listeners = await nursery.start(serve, self._connection, 0)
        self.port = self._listeners[0].socket.getsockname()[1]

    @contextlib.contextmanager
    def serve_in_thread(self) -> Iterator[FakeOmnigentServer]:
        """Serve from a background thread's trio loop (for synchronous tests).

        Setup methods may be called from the test thread while it runs; they only add to dicts
        and lists, which the GIL keeps consistent.
        """
        started = threading.Event()
        token: list[trio.lowlevel.TrioToken] = []
        stop: list[trio.CancelScope] = []

        async def main() -> None:
            with trio.CancelScope() as scope:
                stop.append(scope)
                async with trio.open_nursery() as nursery:
                    await self.start(nursery)
                    token.append(trio.lowlevel.current_trio_token())
                    started.set()
                    await trio.sleep_forever()

        thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
        thread.start()
        if not started.wait(10):
            raise RuntimeError("fake server did not start")
        try:
            yield self
        finally:
            trio.from_thread.run_sync(stop[0].cancel, trio_token=token[0])
            thread.join(10)

    def add_agent(
        self,
        yaml_text: str,
        *,
        name: str | None = None,
        agent_id: str | None = None,
        version: int = 1,
        filename: str | None = None,
    ) -> str:
        """Register an agent; its YAML is served as a tar.gz bundle. Returns the agent id."""
        if name is None:
            match = re.search(r"^name:\s*(\S+)", yaml_text, re.MULTILINE)
            name = match.group(1) if match else "agent"
        agent_id = agent_id or _hex()
        self.agents[agent_id] = Agent(agent_id, name, yaml_text, version, filename=filename)
        return agent_id

    def add_session(
        self, agent_id: str, *, session_id: str | None = None, **fields: Any
    ) -> dict[str, Any]:
        """Create a session of ``agent_id``; ``fields`` override snapshot fields (§iii.4)."""
        session_id = session_id or _hex()
        agent = self.agents.get(agent_id)
        snapshot: dict[str, Any] = {
            "id": session_id,
            "agent_id": agent_id,
            "agent_name": agent.name if agent else None,
            "status": "idle",
            "background_task_count": None,
            "created_at": NOW,
            "updated_at": NOW,
            "title": None,
            "labels": {},
            "runner_id": None,
            "host_id": None,
            "runner_online": True,
            "host_online": None,
            "host_resumable": False,
            "reasoning_effort": None,
            "items": [],
            "permission_level": 4,
            "sub_agent_name": None,
            "kind": "default",
            "parent_session_id": None,
            "root_conversation_id": session_id,
            "llm_model": None,
            "harness": None,
            "model_override": None,
            "cost_control_mode_override": None,
            "subagent_routing_override": None,
            "context_window": 128000,
            "last_total_tokens": None,
            "total_cost_usd": None,
            "usage_by_model": None,
            "last_task_error": None,
            "external_session_id": None,
            "terminal_launch_args": None,
            "pending_elicitations": [],
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
        snapshot.update(fields)
        self.sessions[session_id] = snapshot
        self.items.setdefault(session_id, [])
        self.events.setdefault(session_id, [])
        return snapshot

    def add_item(self, session_id: str, item: dict[str, Any]) -> dict[str, Any]:
        """Append an item (e.g. :func:`user_message`), filling ``id, response_id, status,
        created_at`` the way the server does."""
        full = {
            "id": item.get("id") or _hex(),
            "response_id": item.get("response_id") or f"turn_{_hex()}",
            "type": item["type"],
            "status": item.get("status", "completed"),
            "created_at": item.get("created_at", NOW),
        }
        full.update({k: v for k, v in item.items() if k not in full})
        self.items.setdefault(session_id, []).append(full)
        return full

    def add_file(self, file_id: str, content: bytes, content_type: str) -> None:
        self.files[file_id] = (content, content_type)

    def fail(
        self,
        method: str,
        path: str,
        *,
        status: int = 503,
        times: int = 1,
        after: int = 0,
        mode: str = "status",
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Fault:
        """Misbehave on ``times`` requests matching ``method`` and ``path`` (regex), after
        letting the next ``after`` of them through."""
        fault = Fault(
            method, path, status=status, mode=mode, times=times, after=after, headers=headers or {}
        )
        if body is not None:
            fault.body = body
        self.faults.append(fault)
        return fault

    def received(self, method: str | None = None, path: str | None = None) -> list[Recorded]:
        """Recorded requests, optionally only those with ``method`` and a ``path`` regex."""
        return [
            r
            for r in self.requests
            if (method is None or r.method == method)
            and (path is None or re.fullmatch(path, r.path))
        ]

    # -- HTTP/1.1 ----------------------------------------------------------------------------

    async def _connection(self, stream: trio.SocketStream) -> None:
        buffer = bytearray()
        try:
            while True:
                request = await self._read_request(stream, buffer)
                if request is None:
                    return
                self.requests.append(request)
                fault = next(
                    (f for f in self.faults if f.matches(request.method, request.path)), None
                )
                if fault is not None:
                    fault.times -= 1
                    if fault.mode == "hang":
                        await until_eof(stream)
                        return
                    if fault.mode == "drop":
                        return
                    if fault.mode == "hold":
                        fault.arrived.set()
                        await trio.to_thread.run_sync(fault.released.wait, abandon_on_cancel=True)
                        reply = self._route(request)
                    else:
                        reply = Reply(fault.status, fault.body, headers=fault.headers)
                else:
                    reply = self._route(request)
                await stream.send_all(self._encode(reply))
                if request.headers.get("connection", "").lower() == "close":
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        finally:
            await trio.aclose_forcefully(stream)

    async def _read_request(self, stream: trio.SocketStream, buffer: bytearray) -> Recorded | None:
        raw = await read_request(stream, buffer)
        if raw is None:
            return None
        path, _, query = raw.target.partition("?")
        return Recorded(
            raw.method,
            unquote(path),
            query,
            dict(raw.headers),
            raw.headers,
            raw.body,
            trio.current_time(),
        )

    def _encode(self, reply: Reply) -> bytes:
        headers = {
            "date": "Sun, 29 Nov 2026 15:37:44 GMT",
            "server": "uvicorn",
            "content-length": str(len(reply.body)),
        }
        if reply.body:
            headers["content-type"] = reply.content_type
        headers.update(reply.headers)
        headers["x-request-id"] = f"{next(self._request_ids):032x}"
        lines = [f"HTTP/1.1 {reply.status} {_REASONS.get(reply.status, 'Status')}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + reply.body

    # -- routes ------------------------------------------------------------------------------

    def _route(self, request: Recorded) -> Reply:
        if self.token is not None and request.headers.get("x-omnigent-runner-tunnel-token") != (
            self.token
        ):
            return _error(401, "unauthorized", "unauthenticated")
        method, path = request.method, request.path
        if method == "GET" and path == "/api/version":
            return _json({"version": SERVER_VERSION})
        if match := re.fullmatch(r"/v1/runners/([^/]+)/token", path):
            if method != "POST":
                return _method_not_allowed()
            return self._runner_token(match.group(1))
        if match := re.fullmatch(r"/v1/files/([^/]+)/content", path):
            if match.group(1) not in self.files:
                return _error(404, "not_found", f"file {match.group(1)!r} not found")
            content, kind = self.files[match.group(1)]
            return Reply(200, content, content_type=kind)
        if (listing := self._listing(method, path, request)) is not None:
            return listing
        if method == "POST" and path == "/v1/sessions":
            return self._create(request)
        match = re.fullmatch(r"/v1/sessions/([^/]+)(/.*)?", path)
        if match is None:
            return Reply(404, b'{"detail":"Not Found"}')
        session_id, rest = match.group(1), match.group(2) or ""
        session = self.sessions.get(session_id)
        if session is None:
            return _error(404, "not_found", f"Session '{session_id}' not found")
        if method == "GET" and (found := re.fullmatch(r"/resources/files/([^/]+)/content", rest)):
            # The 0.19.1 route: uploads belong to a session (the fake keeps one store).
            if found.group(1) not in self.files:
                return _error(404, "not_found", "File not found")
            content, kind = self.files[found.group(1)]
            return Reply(200, content, content_type=kind)
        handler = _ROUTES.get((method, rest))
        if handler is None:
            known = {m for (m, r) in _ROUTES if r == rest}
            return _method_not_allowed() if known else Reply(404, b'{"detail":"Not Found"}')
        return handler(self, session, request)

    def _listing(self, method: str, path: str, request: Recorded) -> Reply | None:
        """The 0.19.1 list and status routes a runner's session tools read; None: not one."""
        if method != "GET":
            return None
        if path == "/v1/agents":
            return _json(_page([self.agent_object(a) for a in self.agents.values()]))
        if path == "/v1/sessions":
            wanted = request.params.get("agent_name")
            rows = [
                _session_row(s)
                for s in reversed(self.sessions.values())
                if not wanted or s.get("agent_name") == wanted
            ]
            return _json(_page(rows))
        if match := re.fullmatch(r"/v1/runners/([^/]+)/status", path):
            runner_id = match.group(1)
            return _json({"runner_id": runner_id, "online": runner_id in self.online_runners})
        return None

    def _create(self, request: Recorded) -> Reply:
        """A child session, as 0.19.1 makes one for a runner's ``sys_session_create``."""
        kind = request.headers.get("content-type", "")
        if kind.startswith("multipart/form-data"):
            parts = parse_form(kind, request.body)
            metadata = json.loads(parts["metadata"][1])
            spec = load_bundle(parts["bundle"][1])
            agent_id = self.add_agent(f"name: {spec.name}\n")
            child = self._child(agent_id, metadata["parent_session_id"], metadata.get("title"))
            if child is None:
                return _error(404, "not_found", "Parent session not found")
            answer = {"session_id": child["id"], "agent_id": agent_id, "agent_name": spec.name}
            return _json(answer, status=201)
        body = _body(request)
        if not isinstance(body, dict) or body.get("agent_id") not in self.agents:
            return _error(404, "not_found", "Agent not found")
        child = self._child(body["agent_id"], body.get("parent_session_id"), body.get("title"))
        if child is None:
            return _error(404, "not_found", "Parent session not found")
        if body.get("model_override"):
            child["model_override"] = body["model_override"]
        for item in body.get("initial_items") or []:
            self.add_item(child["id"], {"type": item["type"], **item["data"]})
        return _json(child, status=201)

    def _child(self, agent_id: str, parent_id: Any, title: Any) -> dict[str, Any] | None:
        parent = self.sessions.get(parent_id) if isinstance(parent_id, str) else None
        if parent is None:
            return None
        return self.add_session(
            agent_id,
            title=title,
            parent_session_id=parent["id"],
            root_conversation_id=parent["root_conversation_id"],
        )

    def _permissions(self, session: dict[str, Any], request: Recorded) -> Reply:
        body = _body(request)
        level = body.get("level") if isinstance(body, dict) else None
        if not isinstance(level, int) or not 1 <= level <= 3 or not body.get("user_id"):
            return _error(422, "invalid_input", "user_id and a level of 1..3 are required")
        if body["user_id"] == "__public__" and level > 1:
            return _error(400, "invalid_input", "Public access is limited to read (level 1)")
        self.grants.setdefault(session["id"], {})[body["user_id"]] = level
        return _json({"user_id": body["user_id"], "conversation_id": session["id"], "level": level})

    def agent_object(self, agent: Agent) -> dict[str, Any]:
        """An agent as 0.19.1's ``GET /v1/agents`` and ``.../agent`` show it."""
        return {
            "id": agent.agent_id,
            "object": "agent",
            "name": agent.name,
            "version": agent.version,
            "description": agent.description,
            "created_at": NOW,
            "updated_at": None,
            "harness": agent.harness,
            "mcp_servers": list(agent.mcp_servers),
            "mcp_servers_editable": False,
            "mcp_registry_editable": False,
            "policies": list(agent.policies),
            "skills": [],
            "terminals": [],
            "builtin": False,
        }

    def _session_agent(self, session: dict[str, Any], request: Recorded) -> Reply:
        agent = self.agents.get(session["agent_id"])
        if agent is None:
            return _error(404, "not_found", "Not found.")
        return _json(self.agent_object(agent))

    def _child_sessions(self, session: dict[str, Any], request: Recorded) -> Reply:
        parent = session["id"]
        children = [
            _child_row(s) for s in self.sessions.values() if s.get("parent_session_id") == parent
        ]
        return _json(_page(children))

    def _runner_token(self, runner_id: str) -> Reply:
        if self.token_mode == "unauthenticated":
            return _error(401, "unauthorized", "unauthenticated")
        if self.token_mode == "unsupported":
            return _error(
                400, "invalid_input", "runner token minting is unsupported in this auth mode"
            )
        return _json({"token": f"jwt-for-{runner_id}", "expires_at": NOW + 3600})

    def _agent_contents(self, session: dict[str, Any], request: Recorded) -> Reply:
        agent = self.agents.get(session["agent_id"])
        if agent is None:
            return _error(404, "not_found", f"Agent '{session['agent_id']}' not found")
        headers = {
            "x-agent-version": str(agent.version),
            "x-agent-name": agent.name,
            "x-agent-session-scoped": "true" if agent.session_scoped else "false",
        }
        return Reply(200, agent.bundle(), content_type="application/gzip", headers=headers)

    def _snapshot(self, session: dict[str, Any], request: Recorded) -> Reply:
        return _json(session, headers={"cache-control": "no-store"})

    def _patch(self, session: dict[str, Any], request: Recorded) -> Reply:
        body = _body(request)
        if not isinstance(body, dict):
            return _error(422, "invalid_input", "body must be an object")
        for key, value in body.items():
            if key == "labels" and isinstance(value, dict):
                session["labels"] = {**session["labels"], **value}
            else:
                session[key] = value
        session["updated_at"] = NOW
        return _json(session)

    def _items(self, session: dict[str, Any], request: Recorded) -> Reply:
        params = request.params
        try:
            limit = max(1, min(int(params.get("limit", "20")), 100))
        except ValueError:
            return _error(422, "invalid_input", "limit must be an integer")
        items = list(self.items.get(session["id"], []))
        if params.get("order", "desc") == "desc":
            items.reverse()
        after = params.get("after")
        if after is not None:
            ids = [i["id"] for i in items]
            if after not in ids:
                return _error(400, "invalid_input", f"unknown cursor {after!r}")
            items = items[ids.index(after) + 1 :]
        page = items[:limit]
        return _json(
            {
                "object": "list",
                "data": page,
                "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None,
                "has_more": len(items) > limit,
            }
        )

    def _labels(self, session: dict[str, Any], request: Recorded) -> Reply:
        return _json(
            {"id": session["id"], "labels": session["labels"]},
            headers={"cache-control": "no-store"},
        )

    def _policies(self, session: dict[str, Any], request: Recorded) -> Reply:
        problem = evaluate_problem(_body(request))
        if problem is not None:
            return _error(400, "invalid_input", problem)
        return _json(self.policy(session["id"], _body(request)), spaced=True)

    def _mcp(self, session: dict[str, Any], request: Recorded) -> Reply:
        rpc = _body(request)
        if not isinstance(rpc, dict) or rpc.get("jsonrpc") != "2.0":
            return _json({"jsonrpc": "2.0", "id": None, "error": _rpc_error(-32600)}, spaced=True)
        rpc_id = rpc.get("id")
        if rpc.get("method") != "tools/call":
            return _json({"jsonrpc": "2.0", "id": rpc_id, "error": _rpc_error(-32601)}, spaced=True)
        params = rpc.get("params") or {}
        name, arguments = params.get("name"), params.get("arguments") or {}
        if not isinstance(name, str) or not isinstance(arguments, dict):
            return _json({"jsonrpc": "2.0", "id": rpc_id, "error": _rpc_error(-32602)}, spaced=True)
        sid = session["id"]
        responses = params.get("inputResponses")
        if responses is not None:
            state = json.loads(params.get("requestState") or "{}")
            eid = state.get("elicitation_id")
            if eid not in self.elicitations or eid not in responses:
                return _json(
                    {
                        "jsonrpc": "2.0",
                        "id": rpc_id,
                        "error": _rpc_error(-32602, "unknown elicitation"),
                    },
                    spaced=True,
                )
            del self.elicitations[eid]
            session["pending_elicitations"] = [
                e for e in session["pending_elicitations"] if e.get("elicitation_id") != eid
            ]
            if responses[eid].get("action") != "accept":
                # Not captured: what the real server answers on a decline. This is a guess.
                result = {
                    "content": [{"type": "text", "text": "Tool call declined by the user."}],
                    "isError": True,
                }
                return _json({"jsonrpc": "2.0", "id": rpc_id, "result": result}, spaced=True)
        elif self.ask(sid, name, arguments):
            eid = f"elicit_{uuid.uuid4().hex}"
            self.elicitations[eid] = (sid, name, arguments)
            message = f"ask_os: Agent wants to call {name}({json.dumps(arguments)}). Approve?"
            session["pending_elicitations"].append({"elicitation_id": eid, "message": message})
            result = {
                "resultType": "input_required",
                "inputRequests": {
                    eid: {
                        "method": "elicitation/create",
                        "params": {
                            "message": message,
                            "requestedSchema": {
                                "type": "object",
                                "properties": {"approved": {"type": "boolean"}},
                                "required": ["approved"],
                            },
                            "mode": "url",
                            "url": f"/approve/{sid}/{eid}",
                        },
                    }
                },
                "requestState": json.dumps({"elicitation_id": eid, "session_id": sid}),
            }
            return _json({"jsonrpc": "2.0", "id": rpc_id, "result": result}, spaced=True)
        result = self.tool(sid, name, arguments)
        return _json({"jsonrpc": "2.0", "id": rpc_id, "result": result}, spaced=True)

    def _events(self, session: dict[str, Any], request: Recorded) -> Reply:
        body = _body(request)
        if not isinstance(body, dict) or not isinstance(body.get("type"), str):
            return _error(422, "invalid_input", "body must be an event object with a type")
        self.events[session["id"]].append(body)
        if body["type"] == "external_conversation_item":
            data = body.get("data") or {}
            problem = item_problem(data.get("item_type"), data.get("item_data"))
            if problem is not None:
                self.events[session["id"]].pop()
                return _error(400, "invalid_input", problem)
            fields = dict(data["item_data"])
            if "agent" in fields:  # written as agent, read back as model (§E.1)
                fields["model"] = fields.pop("agent")
            item = {"type": data["item_type"], **fields}
            if data.get("response_id"):
                item["response_id"] = data["response_id"]
            # A ``source_id`` makes the append idempotent: the server derives the item's id
            # from it, so a retried post saves one item (what a runner's crash-retry relies on).
            source = data.get("source_id")
            key = (session["id"], source)
            if isinstance(source, str) and key in self._sourced:
                return _json({"queued": False, "item_id": self._sourced[key]}, status=202)
            added = self.add_item(session["id"], item)
            if isinstance(source, str):
                self._sourced[key] = added["id"]
            return _json({"queued": False, "item_id": added["id"]}, status=202)
        return _json({"queued": False}, status=202)


@dataclass
class Reply:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


_ROUTES: dict[tuple[str, str], Callable[[FakeOmnigentServer, dict[str, Any], Recorded], Reply]] = {
    ("GET", "/agent/contents"): FakeOmnigentServer._agent_contents,
    ("GET", ""): FakeOmnigentServer._snapshot,
    ("PATCH", ""): FakeOmnigentServer._patch,
    ("GET", "/items"): FakeOmnigentServer._items,
    ("GET", "/labels"): FakeOmnigentServer._labels,
    ("POST", "/policies/evaluate"): FakeOmnigentServer._policies,
    ("POST", "/mcp"): FakeOmnigentServer._mcp,
    ("POST", "/events"): FakeOmnigentServer._events,
    ("GET", "/agent"): FakeOmnigentServer._session_agent,
    ("GET", "/child_sessions"): FakeOmnigentServer._child_sessions,
    ("PUT", "/permissions"): FakeOmnigentServer._permissions,
}

_REASONS = {
    200: "OK",
    201: "Created",
    202: "Accepted",
    204: "No Content",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    422: "Unprocessable Entity",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


def _json(
    value: Any, *, status: int = 200, spaced: bool = False, headers: dict[str, str] | None = None
) -> Reply:
    # Most answers are compact JSON; the policy and MCP answers use ", " and ": " (§iii.8-9).
    text = json.dumps(value) if spaced else json.dumps(value, separators=(",", ":"))
    return Reply(status, text.encode(), headers=headers or {})


def _page(data: list[dict[str, Any]]) -> dict[str, Any]:
    """A 0.19.1 list page holding every row."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": False,
    }


def _session_row(snapshot: dict[str, Any]) -> dict[str, Any]:
    """A row of 0.19.1's ``GET /v1/sessions``: a few snapshot fields; ``title``,
    ``runner_id`` and ``parent_session_id`` only when set."""
    row = {
        key: snapshot.get(key)
        for key in ("id", "agent_id", "agent_name", "status", "created_at", "updated_at")
    }
    row.update(labels=snapshot.get("labels", {}), permission_level=4, owner="local")
    row.update(pending_elicitations_count=len(snapshot.get("pending_elicitations") or []))
    row.update(archived=False, comments_count=0, viewer_unread=False)
    for key in ("title", "runner_id", "parent_session_id"):
        if snapshot.get(key) is not None:
            row[key] = snapshot[key]
    return row


def _child_row(snapshot: dict[str, Any]) -> dict[str, Any]:
    """A row of ``GET .../child_sessions`` (PROTOCOL_0_19 §J.8); ``tool`` and
    ``session_name`` parsed from an ``<agent>:<name>`` title."""
    title = snapshot.get("title")
    tool, _, name = (title or "").partition(":")
    if tool == "ui" and ":" in name:  # the web UI's "ui:<agent>:<label>"
        tool, _, name = name.partition(":")
    return {
        "id": snapshot["id"],
        "object": "child_session",
        "parent_session_id": snapshot.get("parent_session_id"),
        "title": title,
        "task_summary": None,
        "tool": tool if name else None,
        "session_name": name or None,
        "kind": "sub_agent",
        "created_at": snapshot.get("created_at"),
        "updated_at": snapshot.get("updated_at"),
        "agent_id": snapshot.get("agent_id"),
        "agent_name": snapshot.get("agent_name"),
        "current_task_id": None,
        "current_task_status": None,
        "busy": False,
        "labels": snapshot.get("labels", {}),
    }


def _error(status: int, code: str, message: str) -> Reply:
    return _json({"error": {"code": code, "message": message}}, status=status)


def _method_not_allowed() -> Reply:
    return Reply(405, b'{"detail":"Method Not Allowed"}')


def _rpc_error(code: int, message: str | None = None) -> dict[str, Any]:
    default = {-32600: "Invalid Request", -32601: "Method not found", -32602: "Invalid params"}
    return {"code": code, "message": message or default.get(code, "error")}


def _body(request: Recorded) -> Any:
    try:
        return request.json
    except ValueError:
        return None
