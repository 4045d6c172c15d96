"""The runner → server client: the plain HTTP calls a runner makes to its omnigent server.

A runner is driven through its tunnel, but it also calls the server directly (PROTOCOL_FACTS
§iii): it fetches the agent bundle of a session, its snapshot and its items (history), reads
and sets labels, asks for policy verdicts, executes tools through the server's MCP endpoint
and posts conversation items. Every call carries the runner's credential, the binding token,
as ``X-Omnigent-Runner-Tunnel-Token`` together with ``Origin: omnigent://internal``, and
``User-Agent: corral-runner/<version>``, which tells corral's calls apart in a server's
access log.

The client is built on :class:`httpx.AsyncClient`, which runs on trio (through anyio): one
pooled keep-alive connection serves the many small calls of a turn, and timeouts are split
into connect and read phases.

Failures are typed (see :mod:`corral._exceptions`): a connection that fails or an answer of
502/503/504 is :class:`ServerUnavailable` (:class:`ServerTimeout` when a deadline passed),
any other error status is :class:`ServerRejected` with the ``status`` and ``body``, and a 2xx
whose body is not the shape of §iii is :class:`ServerProtocolError`.

Retries are bounded and only where they cannot do harm. Idempotent calls (the GETs, and the
label ``PATCH``, which sets values) are retried with exponential backoff after connection
errors, timeouts and 502/503/504. The others (tool calls, events, policy evaluations, token
minting) are retried only when the connection could not even be opened, because then the
server never saw the request; a 503 or a read timeout on them is raised at once, since the
server may already have acted.

A caller that can wait out a restarting server (the embedded control plane is back 2 to 4 s
after a ``kill -9``) asks through :func:`while_unavailable`: the call again, with backoff, while
its answer is *unavailable*, for a bound counted from the first failure. The real omnigent
server means a 4xx, a 500 or a malformed body, so those are never asked again.

The binding token is never logged and never part of an error message or ``repr()``. Ids are
checked against ``^[A-Za-z0-9_.-]+$`` before they become part of a URL.

This module is a floor module: it imports nothing from ``corral.actors``, ``corral.server``
or ``corral.cli``.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import random
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec
import trio

from . import __version__
from ._exceptions import (
    ServerProtocolError,
    ServerRejected,
    ServerTimeout,
    ServerUnavailable,
)
from ._jsonlines import JsonObject
from ._server_answers import clip, detail, read_capped, rejected, retry_after_s
from ._tls import default_context
from .spec import MAX_BUNDLE_BYTES, AgentSpec, load_bundle

__all__ = [
    "ORIGIN",
    "AgentBundle",
    "ClientStatistics",
    "InputRequired",
    "ServerClient",
    "runner_id_for_token",
    "safe_id",
]

log = logging.getLogger(__name__)

#: The ``Origin`` header every runner call carries (§iii).
ORIGIN = "omnigent://internal"
TOKEN_HEADER = "X-Omnigent-Runner-Tunnel-Token"
#: The ``User-Agent`` of every runner call.
USER_AGENT = f"corral-runner/{__version__}"
#: Statuses that mean "try again later" rather than "no".
UNAVAILABLE_STATUS = frozenset({502, 503, 504})
#: Largest JSON answer read (items pages, snapshots); protects the runner from a broken server.
MAX_JSON_BYTES = 32 * 1024 * 1024
#: Largest file read by :meth:`ServerClient.file_content`.
MAX_FILE_BYTES = 64 * 1024 * 1024

_SAFE_ID = re.compile(r"^[A-Za-z0-9_.-]{1,256}$")

#: What an ``on_input_required`` callback gets and returns: the JSON-RPC ``result`` whose
#: ``resultType`` is ``input_required``, and the ``inputResponses`` mapping
#: (``{elicitation_id: {"action": "accept" | "decline" | "cancel", ...}}``), or ``None`` to
#: give up and return the ``input_required`` result as is.
InputRequired = Callable[[JsonObject], Awaitable[JsonObject | None]]


def runner_id_for_token(token: str) -> str:
    """The runner id the server derives from a binding token (§i.1).

    ``"runner_token_" + sha256("omnigent-runner:" + token).hexdigest()[:32]``.
    """
    digest = hashlib.sha256(f"omnigent-runner:{token}".encode()).hexdigest()
    return f"runner_token_{digest[:32]}"


class AgentBundle(msgspec.Struct, frozen=True, kw_only=True):
    """An agent bundle and what its response headers said (§iii.3).

    ``version`` (``x-agent-version``) changes when the agent is edited, so a caller may cache
    the parsed spec by it.
    """

    spec: AgentSpec
    name: str | None = None
    version: str | None = None
    session_scoped: bool | None = None
    size: int = 0


class ClientStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """Counters since the client was created."""

    requests: int
    retries: int
    failures: int


@dataclass
class _Counters:
    requests: int = 0
    retries: int = 0
    failures: int = 0


class ServerClient:
    """An async client for the runner → server calls of PROTOCOL_FACTS §iii.

    Use it as ``async with ServerClient(url, token=...) as client:`` (or call :meth:`aclose`).

    Args:
        base_url: the server's URL; a path prefix is kept (``http://h/prefix`` →
            ``http://h/prefix/v1/...``).
        token: the runner's binding token, sent as ``X-Omnigent-Runner-Tunnel-Token``.
        bearer: sent as ``Authorization: Bearer …`` when the server wants one as well.
        connect_timeout_s: to open a connection.
        read_timeout_s: between bytes of an answer (also the write and pool timeout).
        tool_timeout_s: the read timeout of :meth:`mcp_call`, which lasts as long as the tool.
        policy_timeout_s: the read timeout of a :meth:`evaluate_policy` the server may hold
            until a person answers an ASK (PROTOCOL_0_19 §F.3); a day, as the server's own
            default ``ask_timeout``.
        retries: extra attempts of a retryable call (0 disables retrying).
        backoff_base_s, backoff_max_s: the first retry waits ``backoff_base_s``, doubling up
            to ``backoff_max_s``, each ±50% jitter; a ``Retry-After`` on a 503 is honoured up to
            ``backoff_max_s``.
        transport: an httpx transport (tests); the default opens TCP connections.
    """

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        bearer: str | None = None,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 30.0,
        tool_timeout_s: float = 600.0,
        policy_timeout_s: float = 86400.0,
        retries: int = 3,
        backoff_base_s: float = 0.25,
        backoff_max_s: float = 5.0,
        max_bundle_bytes: int = MAX_BUNDLE_BYTES,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if retries < 0:
            raise ValueError("retries must be >= 0")
        if min(connect_timeout_s, read_timeout_s, tool_timeout_s, policy_timeout_s) <= 0:
            raise ValueError("timeouts must be > 0")
        if backoff_base_s < 0 or backoff_max_s < backoff_base_s:
            raise ValueError("backoff must satisfy 0 <= backoff_base_s <= backoff_max_s")
        headers = {"Origin": ORIGIN, "User-Agent": USER_AGENT}
        if token:
            headers[TOKEN_HEADER] = token
        if bearer:
            headers["Authorization"] = f"Bearer {bearer}"
        self.base_url = base_url.rstrip("/")
        self.has_token = bool(token)
        self.retries = retries
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.max_bundle_bytes = max_bundle_bytes
        self._timeout = httpx.Timeout(read_timeout_s, connect=connect_timeout_s)
        self._tool_timeout = httpx.Timeout(tool_timeout_s, connect=connect_timeout_s)
        self._policy_timeout = httpx.Timeout(policy_timeout_s, connect=connect_timeout_s)
        self._http = httpx.AsyncClient(
            base_url=self.base_url + "/",
            headers=headers,
            timeout=self._timeout,
            transport=transport,
            follow_redirects=False,
            # The process's context, built by its zygote: not a CA bundle per client.
            verify=default_context(),
        )
        self._rpc_ids = itertools.count(1)
        self._counters = _Counters()

    def __repr__(self) -> str:
        token = "set" if self.has_token else "none"
        return f"<ServerClient {self.base_url} token={token}>"

    async def __aenter__(self) -> ServerClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the pooled connections."""
        await self._http.aclose()

    def statistics(self) -> ClientStatistics:
        """Requests sent (attempts included), retries made, calls that raised."""
        c = self._counters
        return ClientStatistics(requests=c.requests, retries=c.retries, failures=c.failures)

    # -- the calls of §iii -----------------------------------------------------------------

    async def version(self) -> str:
        """``GET /api/version`` (§iii.2): the server's version string."""
        body = await self._json("GET", "/api/version", idempotent=True)
        version = body.get("version") if isinstance(body, dict) else None
        if not isinstance(version, str):
            raise self._shape("GET", "/api/version", "no 'version' string")
        return version

    async def runner_token(self, runner_id: str) -> JsonObject:
        """``POST /v1/runners/{runner_id}/token`` (§iii.1): mint a runner JWT.

        Returns ``{"token", "expires_at"}``. A server without an auth provider answers 401
        (no session bound yet) or 400 (``invalid_input``); both raise :class:`ServerRejected`,
        and a runner may go on without the JWT, as the captured runner did.
        """
        path = f"/v1/runners/{_id(runner_id, 'runner_id')}/token"
        body = await self._json("POST", path, content=b"", idempotent=False)
        if not isinstance(body, dict) or not isinstance(body.get("token"), str):
            raise self._shape("POST", path, "no 'token' string")
        return body

    async def agent_bundle(self, session_id: str, *, sub_agent: str | None = None) -> AgentSpec:
        """``GET /v1/sessions/{id}/agent/contents`` (§iii.3), parsed; with ``sub_agent`` (a
        child session's ``sub_agent_name``), that sub-agent's spec from the parent's bundle.

        Raises:
            SpecError: the bundle or its YAML is invalid (naming the field).
        """
        return (await self.agent_bundle_info(session_id, sub_agent=sub_agent)).spec

    async def agent_bundle_info(
        self, session_id: str, *, sub_agent: str | None = None
    ) -> AgentBundle:
        """Like :meth:`agent_bundle`, with the ``x-agent-*`` headers of the answer."""
        path = f"/v1/sessions/{_id(session_id, 'session_id')}/agent/contents"
        response, content = await self._request(
            "GET", path, idempotent=True, max_bytes=self.max_bundle_bytes
        )
        scoped = response.headers.get("x-agent-session-scoped")
        return AgentBundle(
            spec=load_bundle(content, max_bytes=self.max_bundle_bytes, sub_agent=sub_agent),
            name=response.headers.get("x-agent-name"),
            version=response.headers.get("x-agent-version"),
            session_scoped=None if scoped is None else scoped.lower() == "true",
            size=len(content),
        )

    async def session_snapshot(self, session_id: str) -> JsonObject:
        """``GET /v1/sessions/{id}`` (§iii.4): the server's full view of the session.

        Fields the runner uses: ``agent_id``, ``agent_name``, ``status``, ``labels``,
        ``runner_id``, ``harness``, ``llm_model``, ``model_override``, ``pending_elicitations``,
        ``pending_inputs``, ``active_response_id``, ``parent_session_id``.
        """
        path = f"/v1/sessions/{_id(session_id, 'session_id')}"
        return await self._object("GET", path, idempotent=True)

    async def patch_session(self, session_id: str, body: Mapping[str, Any]) -> JsonObject:
        """``PATCH /v1/sessions/{id}`` (§iii.5), e.g. ``{"labels": {"omnigent.ui":
        "terminal"}}``; returns the updated snapshot.

        Retried like a GET: it sets values, so sending it twice leaves the same state.
        """
        path = f"/v1/sessions/{_id(session_id, 'session_id')}"
        return await self._object("PATCH", path, json=body, idempotent=True)

    async def items(
        self, session_id: str, *, page_size: int = 100, max_items: int = 100_000
    ) -> list[JsonObject]:
        """``GET /v1/sessions/{id}/items?limit=100&order=asc`` (§iii.6): the whole history.

        Pages are followed while ``has_more`` is true, asking for the items ``after`` the
        previous page's ``last_id`` (the server's list cursor; the captured histories fit in one
        page). Items keep the server's shape: ``id, response_id, type, status, created_at``
        plus the type's fields flattened.

        Raises:
            ServerProtocolError: a page that is not a list object, a cursor that does not
                move, or more than ``max_items`` items.
        """
        path = f"/v1/sessions/{_id(session_id, 'session_id')}/items"
        items: list[JsonObject] = []
        after: str | None = None
        while True:
            params = {"limit": str(page_size), "order": "asc"}
            if after is not None:
                params["after"] = after
            page = await self._object("GET", path, params=params, idempotent=True)
            data = page.get("data")
            if not isinstance(data, list) or not all(isinstance(i, dict) for i in data):
                raise self._shape("GET", path, "'data' is not a list of objects")
            items.extend(data)
            if len(items) > max_items:
                raise self._shape("GET", path, f"more than {max_items} items")
            if not page.get("has_more"):
                return items
            last = page.get("last_id") or (data[-1].get("id") if data else None)
            if not isinstance(last, str) or not data or last == after:
                raise self._shape("GET", path, "has_more is true but the cursor did not move")
            after = last

    async def labels(self, session_id: str) -> dict[str, str]:
        """``GET /v1/sessions/{id}/labels`` (§iii.7): the session's labels."""
        path = f"/v1/sessions/{_id(session_id, 'session_id')}/labels"
        body = await self._object("GET", path, idempotent=True)
        labels = body.get("labels")
        if not isinstance(labels, dict):
            raise self._shape("GET", path, "no 'labels' object")
        return labels

    async def evaluate_policy(
        self, session_id: str, body: Mapping[str, Any], *, held: bool = False
    ) -> JsonObject:
        """``POST /v1/sessions/{id}/policies/evaluate`` (PROTOCOL_0_19 §F).

        ``body`` is ``{"event": {"type": <phase>, "data": {...}, ...}}`` as §F.2 says per
        phase; the answer is e.g. ``{"result": "POLICY_ACTION_ALLOW"}``. ``held``: the phase
        is one the server holds until a person answers an ASK (TOOL_CALL, LLM_REQUEST), so
        the read deadline is ``policy_timeout_s``.
        """
        path = f"/v1/sessions/{_id(session_id, 'session_id')}/policies/evaluate"
        timeout = self._policy_timeout if held else None
        return await self._object("POST", path, json=body, idempotent=False, timeout=timeout)

    async def mcp_call(
        self,
        session_id: str,
        name: str,
        arguments: Mapping[str, Any],
        *,
        on_input_required: InputRequired | None = None,
        max_rounds: int = 8,
    ) -> JsonObject:
        """Execute a tool through the server: JSON-RPC 2.0 ``tools/call`` on ``POST
        /v1/sessions/{id}/mcp`` (§iii.9). Returns the JSON-RPC ``result``
        (``{"content": [...]}``).

        When policy asks a human, the result is ``{"resultType": "input_required",
        "inputRequests": {eid: {...}}, "requestState": "..."}``. Then ``on_input_required``
        is awaited with that result; it waits for the verdict (an ``approval`` event reaches the
        runner through the tunnel) and returns ``inputResponses`` (``{eid: {"action":
        "accept"}}``). The call is sent again with the same ``name`` and ``arguments`` plus
        ``requestState`` and ``inputResponses``, under a new JSON-RPC id. Without a callback,
        or when it returns ``None``, the ``input_required`` result is returned as is.

        The read timeout is ``tool_timeout_s``; the call is never retried once sent.

        Raises:
            ServerRejected: a JSON-RPC ``error`` (``code`` is its code, as a string).
            ServerProtocolError: not a JSON-RPC answer, or more than ``max_rounds`` rounds.
        """
        path = f"/v1/sessions/{_id(session_id, 'session_id')}/mcp"
        params: JsonObject = {"name": name, "arguments": dict(arguments)}
        for _ in range(max_rounds):
            rpc_id = next(self._rpc_ids)
            request = {"jsonrpc": "2.0", "id": rpc_id, "method": "tools/call", "params": params}
            answer = await self._object(
                "POST", path, json=request, idempotent=False, timeout=self._tool_timeout
            )
            if isinstance(answer.get("error"), dict):
                error = answer["error"]
                raise ServerRejected(
                    f"POST {path}: tools/call {name!r} failed: {clip(str(error.get('message')))}",
                    status=200,
                    body=msgspec.json.encode(answer),
                    method="POST",
                    path=path,
                    code=str(error.get("code")),
                )
            result = answer.get("result")
            if not isinstance(result, dict):
                raise self._shape("POST", path, "a JSON-RPC answer with neither result nor error")
            if result.get("resultType") != "input_required" or on_input_required is None:
                return result
            responses = await on_input_required(result)
            if responses is None:
                return result
            params = {
                "name": name,
                "arguments": dict(arguments),
                "requestState": result.get("requestState"),
                "inputResponses": responses,
            }
        raise self._shape("POST", path, f"still input_required after {max_rounds} rounds")

    async def post_event(
        self, session_id: str, body: Mapping[str, Any], *, idempotency_key: str | None = None
    ) -> JsonObject:
        """``POST /v1/sessions/{id}/events`` (§iii.10), e.g. an ``external_conversation_item``
        or a ``message`` (a sub-agent's first message, a parent's wake, §J); returns the
        answer (202 ``{"queued": false, "item_id": ...}``), ``{}`` when empty.

        ``idempotency_key`` goes as ``Idempotency-Key``: a server that keeps it (the embedded
        control plane) stores a message posted again with it once."""
        path = f"/v1/sessions/{_id(session_id, 'session_id')}/events"
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return await self._object(
            "POST", path, json=body, idempotent=False, empty_ok=True, headers=headers
        )

    async def create_session(self, body: Mapping[str, Any]) -> JsonObject:
        """``POST /v1/sessions`` as a runner creates a child session (PROTOCOL_0_19.md §J:
        ``agent_id``, ``parent_session_id``, ``title``, ``sub_agent_name``, ``labels``);
        returns the created session (201 ``{"id": ...}``). Never retried once sent."""
        return await self._object("POST", "/v1/sessions", json=body, idempotent=False)

    async def file_content(
        self, file_id: str, *, session_id: str | None = None
    ) -> tuple[bytes, str]:
        """The bytes and content type of an uploaded file, for ``file_id`` media blocks.

        The 0.19.1 server keeps uploads per session: ``GET /v1/sessions/{session_id}/
        resources/files/{file_id}/content`` answers the raw bytes with their type (a forwarded
        message already carries its files inline, PROTOCOL_0_19 §C.1, but a stored history
        item keeps the ``file_id``). Without ``session_id`` this calls ``GET /v1/files/
        {file_id}/content``, which no captured server has.
        """
        fid = _id(file_id, "file_id")
        path = f"/v1/files/{fid}/content"
        if session_id is not None:
            path = f"/v1/sessions/{_id(session_id, 'session_id')}/resources/files/{fid}/content"
        response, content = await self._request(
            "GET", path, idempotent=True, max_bytes=MAX_FILE_BYTES
        )
        kind = response.headers.get("content-type", "application/octet-stream")
        return content, kind.split(";")[0].strip()

    async def read(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        """``GET path`` (an idempotent read, retried as the others): the decoded JSON answer.

        For the reads a runner-local tool makes for its caller (``GET /v1/agents``,
        ``/v1/sessions/{id}/child_sessions`` ...); the caller checks the shape. ``path`` must be
        built from ids that passed :func:`safe_id`.
        """
        return await self._json("GET", path, params=params, idempotent=True)

    async def read_bytes(
        self, path: str, *, max_bytes: int = MAX_FILE_BYTES
    ) -> tuple[bytes, httpx.Headers]:
        """``GET path``: the raw body of the answer and its headers (a bundle download)."""
        response, content = await self._request("GET", path, idempotent=True, max_bytes=max_bytes)
        return content, response.headers

    async def write(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any],
        *,
        files: Mapping[str, tuple[str, bytes, str]] | None = None,
    ) -> Any:
        """``method path`` with a JSON body, or with ``files`` a ``multipart/form-data`` one
        whose text fields are ``body``'s values: the decoded answer (``{}`` when empty).

        For the writes a runner-local tool makes for its caller (``PUT .../permissions``,
        ``POST /v1/sessions`` ...). Sent again only when the connection could not be opened:
        the server may have acted on a request it answered late. ``path`` must be built from
        ids that passed :func:`safe_id`.
        """
        if files is None:
            return await self._json(method, path, json=body, idempotent=False, empty_ok=True)
        return await self._json(
            method, path, data=dict(body), files=files, idempotent=False, empty_ok=True
        )

    # -- plumbing --------------------------------------------------------------------------

    async def _object(
        self,
        method: str,
        path: str,
        *,
        empty_ok: bool = False,
        **kwargs: Any,
    ) -> JsonObject:
        body = await self._json(method, path, empty_ok=empty_ok, **kwargs)
        if not isinstance(body, dict):
            raise self._shape(method, path, f"expected a JSON object, got {type(body).__name__}")
        return body

    async def _json(self, method: str, path: str, *, empty_ok: bool = False, **kwargs: Any) -> Any:
        _, content = await self._request(method, path, max_bytes=MAX_JSON_BYTES, **kwargs)
        if not content.strip() and empty_ok:
            return {}
        try:
            return msgspec.json.decode(content)
        except msgspec.DecodeError as exc:
            raise self._shape(method, path, f"the answer is not JSON ({exc})") from exc

    async def _request(
        self,
        method: str,
        path: str,
        *,
        idempotent: bool,
        max_bytes: int,
        params: Mapping[str, str] | None = None,
        json: Any = None,
        content: bytes | None = None,
        data: Mapping[str, str] | None = None,
        files: Mapping[str, tuple[str, bytes, str]] | None = None,
        timeout: httpx.Timeout | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[httpx.Response, bytes]:
        """Send with bounded retries; the 2xx response and its body (at most ``max_bytes``)."""
        headers = dict(headers or {})
        if json is not None:
            content = msgspec.json.encode(json)
            headers["Content-Type"] = "application/json"
        attempt = 0
        while True:
            attempt += 1
            self._counters.requests += 1
            retry_after: float | None = None
            try:
                request = self._http.build_request(
                    method,
                    path.lstrip("/"),
                    params=params,
                    content=content,
                    data=data,
                    files=files,
                    headers=headers,
                    timeout=timeout or self._timeout,
                )
                response = await self._http.send(request, stream=True)
                try:
                    body = await read_capped(response, max_bytes, method, path)
                finally:
                    await response.aclose()
            except httpx.TimeoutException as exc:
                sent = not isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout)
                error: Exception = ServerTimeout(
                    f"{method} {path}: no answer in time ({type(exc).__name__})",
                    method=method,
                    path=path,
                )
                cause: BaseException | None = exc
            except httpx.TransportError as exc:
                sent = not isinstance(exc, httpx.ConnectError)
                error = ServerUnavailable(
                    f"{method} {path}: {type(exc).__name__}: {clip(str(exc))}",
                    method=method,
                    path=path,
                )
                cause = exc
            except httpx.RequestError as exc:  # e.g. a body that fails to decode: not transient
                self._counters.failures += 1
                raise ServerProtocolError(
                    f"{method} {path}: {type(exc).__name__}: {clip(str(exc))}",
                    method=method,
                    path=path,
                ) from exc
            else:
                status = response.status_code
                log.debug("%s %s -> %d (%d bytes)", method, path, status, len(body))
                if 200 <= status < 300:
                    return response, body
                if status not in UNAVAILABLE_STATUS:
                    self._counters.failures += 1
                    raise rejected(method, path, status, body)
                sent = True
                retry_after = retry_after_s(response.headers.get("retry-after"))
                error = ServerUnavailable(
                    f"{method} {path} -> {status}: {detail(body)}",
                    method=method,
                    path=path,
                    status=status,
                    body=body,
                )
                cause = None
            if attempt > self.retries or (sent and not idempotent):
                self._counters.failures += 1
                raise error from cause
            delay = self._backoff(attempt, retry_after)
            self._counters.retries += 1
            log.warning("%s; retry %d/%d in %.2fs", str(error), attempt, self.retries, delay)
            await trio.sleep(delay)

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self.backoff_max_s)
        delay = min(self.backoff_base_s * 2 ** (attempt - 1), self.backoff_max_s)
        return delay * random.uniform(0.5, 1.5)

    def _shape(self, method: str, path: str, what: str) -> ServerProtocolError:
        self._counters.failures += 1
        return ServerProtocolError(
            f"{method} {path}: unexpected answer: {what}", method=method, path=path
        )


def safe_id(value: str, what: str) -> str:
    """``value`` if it is safe as one URL path segment; else ``ValueError`` (value not echoed)."""
    return _id(value, what)


def _id(value: str, what: str) -> str:
    """``value`` if it is safe as one URL path segment; else ``ValueError`` (value not echoed)."""
    if not isinstance(value, str) or not _SAFE_ID.match(value) or set(value) == {"."}:
        raise ValueError(f"{what} must match ^[A-Za-z0-9_.-]+$ (1-256 characters, not only dots)")
    return value


def pick_server(
    explicit: ServerClient | None, by_runner: Mapping[str, ServerClient], runner_id: str | None
) -> ServerClient | None:
    """The client a session talks to: an explicitly configured server first (one server for
    every runner), else its runner's server, else the only runner's; None when there is none.
    """
    if explicit is not None:
        return explicit
    if runner_id is not None and runner_id in by_runner:
        return by_runner[runner_id]
    if len(by_runner) == 1:
        return next(iter(by_runner.values()))
    return None
