"""The client side of ``corral agents/send/chat``: find the control plane, call it, follow turns.

The embedded control plane writes ``<state dir>/server/server.json`` once it listens; that
file is how every client command finds it, as ``corral status`` finds the host through
``host.json``. The HTTP API is the plane's client API (``/v1/agents``, ``/v1/sessions``,
``/v1/sessions/{id}/stream`` as resumable Server-Sent Events). Every call carries the
plane's client token as ``Authorization: Bearer``: ``CORRAL_TOKEN`` if set, else
``<state dir>/server/client_token`` (0600, the plane's owner only). A user or machine that
cannot read the state dir gives both the URL (``--url``/``CORRAL_URL``) and ``CORRAL_TOKEN``
(docs/security.md).

Following one turn without races or repeats is the whole point of this module:

* The session's ``last_event_id`` is read first, the stream is opened *after* it, and only
  then is the message posted — so no event of the turn can slip out before the client
  listens, whatever the timing.
* A dropped stream (the control plane restarted, a proxy cut it, it went silent past
  :data:`STREAM_READ_TIMEOUT_S`) is reopened with ``Last-Event-ID`` = the last event seen,
  and :class:`TurnFollower` drops any event it has already seen, so each event is shown
  exactly once.
* The turn is over at its terminal ``session.status`` (``idle`` or ``failed``) after its
  ``running`` — the runner publishes exactly one per turn (a buffered follow-up message runs
  on with no ``idle`` in between, and is covered by the same edge) — or when the control plane
  says the runner refused the message (``session.delivery_failed`` for its item): the message
  POST is answered ``queued`` at once, before the runner has seen it.

The event logic (:class:`SseParser`, :class:`TurnFollower`) is plain code with no I/O, so it
is tested on recorded event lists. :class:`ControlPlane` does the I/O: every call re-reads
``server.json`` after a connection failure and retries until :attr:`connect_wait_s`, so a
control plane that the host is restarting costs a pause, not an error.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

import httpx
import trio

from .._jsonlines import JsonObject
from ..actors._control import request
from ..actors._process import alive
from ..instance import Instance

log = logging.getLogger("corral.cli.client")

#: A stream that sends nothing at all (not even a keepalive comment) for this long is
#: treated as dropped and reopened.
STREAM_READ_TIMEOUT_S = 60.0
#: How long a call waits for an unreachable control plane (e.g. one being restarted).
CONNECT_WAIT_S = 30.0
#: How long one call waits for its answer.
REQUEST_TIMEOUT_S = 30.0
#: The turn edges that end a turn.
TERMINAL_STATUSES = ("idle", "failed")
#: The client token, for a caller that cannot read the state dir (another user, host).
TOKEN_ENV = "CORRAL_TOKEN"
#: Where to send help about the credential.
SECURITY_DOC = "docs/security.md"


class NoControlPlane(Exception):
    """No control plane is found or reachable through the state dir (exit code 3)."""


class NoCredential(Exception):
    """The client token (or the control plane's address) cannot be read (exit code 1)."""


class ApiError(Exception):
    """The control plane answered with an error status; ``error`` is its slug."""

    def __init__(self, message: str, *, status: int, error: str, detail: str) -> None:
        super().__init__(message)
        self.status = status
        self.error = error
        self.detail = detail

    @classmethod
    def from_response(cls, method: str, path: str, response: httpx.Response) -> ApiError:
        """Build one from an error response: ``{"error": slug, "detail": text}``, or the
        omnigent 0.19 server's ``{"error": {"code", "message"}}``, if it is one."""
        try:
            body = response.json()
        except ValueError:
            body = None
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            error = str(body["error"].get("code") or "error")
            detail = str(body["error"].get("message") or "")
        elif isinstance(body, dict):
            error = str(body.get("error") or "error")
            detail = str(body.get("detail") or "")
        else:
            error, detail = "error", response.text[:200]
        what = f"{detail} ({error})" if detail else error
        return cls(
            f"{method} {path} failed with HTTP {response.status_code}: {what}",
            status=response.status_code,
            error=error,
            detail=detail,
        )


# --- events ----------------------------------------------------------------------------------


def _event_number(event_id: str | None) -> int | None:
    if event_id is None:
        return None
    try:
        return int(event_id)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One event of a session stream: its id, type and JSON payload."""

    id: str | None
    type: str
    data: JsonObject

    def record(self) -> JsonObject:
        """The event as ``corral send --json`` lists it: the payload, its ``type`` and its
        stream id as ``event_id`` (a number when the id is one)."""
        number = _event_number(self.id)
        return {
            "event_id": number if number is not None else self.id,
            **self.data,
            "type": self.type,
        }


class SseParser:
    """Turns the lines of a ``text/event-stream`` body into :class:`StreamEvent` s.

    Comments (``: keepalive``) and events without data are skipped; ``data`` that is not a
    JSON object becomes ``{"data": <text>}`` rather than an error, so one odd frame cannot
    end a turn the user is watching.
    """

    def __init__(self) -> None:
        self._id: str | None = None
        self._event: str | None = None
        self._data: list[str] = []

    def feed(self, line: str) -> StreamEvent | None:
        """Take one line (without its line ending); return an event when one is complete."""
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._id = value
        return None

    def _dispatch(self) -> StreamEvent | None:
        data, event, self._data, self._event = self._data, self._event, [], None
        if not data:
            return None
        text = "\n".join(data)
        try:
            payload = json.loads(text)
        except ValueError:
            payload = {"data": text}
        if not isinstance(payload, dict):
            payload = {"data": payload}
        kind = event or str(payload.get("type") or "message")
        # The id persists across events (SSE rules); the last one seen is the resume point.
        return StreamEvent(id=self._id, type=kind, data=payload)


class SendResult(TypedDict):
    """The document ``corral send --json`` prints."""

    session_id: str
    #: ``idle`` or ``failed``; None: the turn did not end.
    status: str | None
    text: str
    #: The server's error object of a failed turn.
    error: JsonObject | None
    #: What the stream delivered of the turn, as :meth:`StreamEvent.record` lists them.
    events: list[JsonObject]


@dataclass
class TurnFollower:
    """Collects the events of one turn and says when it is over.

    Feed it every event the stream delivers after the cursor the turn started from; it
    drops events it has already seen (a reconnect replays from the last id), and is
    :attr:`done` at the first ``session.status`` ``idle``/``failed`` after a ``running``, or
    at a ``session.delivery_failed`` for :attr:`item_id` (the turn's message, once posted).

    With :attr:`item_id` known, the turn is the one of that message. A message to a busy
    session runs as its own turn after the running one (PROTOCOL_0_19.md §E.3), so with
    :attr:`busy` the running turn's events are dropped up to its end (its terminal edge, or
    the ``running`` of the next turn); the control plane's ``session.input.consumed`` of the
    message says ``buffered`` when the runner queued it, which also catches a turn another
    client started after the cursor was read. The turn ends at its own edge, or at the
    ``running`` of a turn after it (messages buffered behind it run on, no ``idle`` between).
    """

    session_id: str
    #: The id of the user message that starts the turn (from the POST's answer).
    item_id: str | None = None
    #: The session ran a turn when the cursor was read: the message waits behind it.
    busy: bool = False
    events: list[JsonObject] = field(default_factory=list)
    status: str | None = None
    error: JsonObject | None = None
    running: bool = False
    done: bool = False
    #: The id of the newest event seen: the resume point of the next turn.
    last_id: str | None = None
    _text: list[str] = field(default_factory=list)
    _seen: set[str] = field(default_factory=set)
    _newest: int | None = None
    _failure: JsonObject | None = None

    @property
    def text(self) -> str:
        """The assistant text streamed so far."""
        return "".join(self._text)

    def feed(self, event: StreamEvent) -> bool:
        """Record ``event``; False if it is a repeat, came after the end or belongs to
        another turn, and was dropped."""
        if self.done or not self._new(event):
            return False
        if self.item_id is None:
            return self._record(event)
        if event.type == "session.input.consumed":
            data = v if isinstance(v := event.data.get("data"), dict) else {}
            if data.get("item_id") == self.item_id and data.get("runner_status") == "buffered":
                if self.running:
                    # Another client's turn began between the cursor and this message,
                    # which waits behind it: that turn is not this one.
                    self._forget()
                else:
                    self.busy = True
                return False
        if self.busy and not self.running:
            if _is_running(event):
                self.busy = False  # the turn of the message, straight after the running one
            elif event.type == "session.status" and event.data.get("status") in TERMINAL_STATUSES:
                self.busy = False  # the running turn is over; the next to start is this one
                return False
            elif event.type != "session.delivery_failed":
                return False
        return self._record(event)

    def _forget(self) -> None:
        """Drop what was collected of a turn that turned out to be another's."""
        self.events.clear()
        self._text.clear()
        self.running, self._failure, self.busy = False, None, True

    def _new(self, event: StreamEvent) -> bool:
        """Whether ``event`` was not seen before (and note it as seen)."""
        if event.id is not None:
            number = _event_number(event.id)
            if event.id in self._seen or (
                number is not None and self._newest is not None and number <= self._newest
            ):
                return False
            self._seen.add(event.id)
            self.last_id = event.id
            if number is not None:
                self._newest = number
        return True

    def _record(self, event: StreamEvent) -> bool:
        """Add ``event`` to the turn; False if it is the start of the turn after it."""
        if self.item_id is not None and self.running and _is_running(event):
            # The next turn (messages buffered behind this one) began: this one is over.
            self.done = True
            self.status = "failed" if self._failure is not None else "idle"
            self.error = self._failure
            return False
        self.events.append(event.record())
        data = event.data
        if event.type == "response.output_text.delta":
            self._text.append(str(data.get("delta") or ""))
        elif event.type == "response.failed":
            response = data.get("response")
            error = data.get("error") or (response or {}).get("error")
            if isinstance(error, dict):
                self._failure = error
        elif event.type == "session.delivery_failed" and (
            self.item_id is not None and data.get("item_id") == self.item_id
        ):
            # The runner refused the message (or never took it): no turn will start.
            self.status = "failed"
            self.done = True
            self.error = {
                "code": "delivery_failed",
                "message": str(data.get("detail") or "the runner did not take the message"),
            }
        elif event.type == "session.status":
            status = data.get("status")
            if status == "running":
                self.running = True
            elif status in TERMINAL_STATUSES and self.running:
                self.status = str(status)
                self.done = True
                if status == "failed":
                    error = data.get("error")
                    self.error = (
                        error
                        if isinstance(error, dict)
                        else self._failure or {"code": "failed", "message": "the turn failed"}
                    )
        return True

    def result(self) -> SendResult:
        """The document ``corral send --json`` prints."""
        return {
            "session_id": self.session_id,
            "status": self.status,
            "text": self.text,
            "error": self.error,
            "events": self.events,
        }


def _is_running(event: StreamEvent) -> bool:
    return event.type == "session.status" and event.data.get("status") == "running"


# --- finding and calling the control plane ---------------------------------------------------


def server_file(state_dir: Path) -> Path:
    """Where the control plane of a state dir writes its address."""
    return state_dir / "server" / "server.json"


def client_token_file(state_dir: Path) -> Path:
    """Where the control plane of a state dir keeps its client token."""
    return state_dir / "server" / "client_token"


def _unreadable(path: Path) -> NoCredential:
    return NoCredential(
        f"cannot read {path}: permission denied. The host runs as another user: ask its "
        f"operator for the token (`corral token`) and set {TOKEN_ENV} and --url/CORRAL_URL "
        f"({SECURITY_DOC})"
    )


def read_client_token(state_dir: Path) -> str:
    """The client token kept in ``state_dir``.

    Raises:
        NoCredential: the file is missing, unreadable or empty.
    """
    path = client_token_file(state_dir)
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        raise NoCredential(
            f"no client token at {path}: no control plane has run on {state_dir} yet "
            f"(`corral up` makes one), or set {TOKEN_ENV}"
        ) from None
    except PermissionError:
        raise _unreadable(path) from None
    except OSError as exc:
        raise NoCredential(f"cannot read {path}: {exc.strerror}") from None
    if not token:
        raise NoCredential(f"{path} holds no client token; make one with `corral token rotate`")
    return token


def locate(state_dir: Path) -> str | None:
    """The control plane's base URL, or None while the host is (re)starting it.

    Raises:
        NoControlPlane: neither a live control plane nor a live host is on ``state_dir``.
        NoCredential: the state dir is another user's.
    """
    path = server_file(state_dir)
    try:
        info = json.loads(path.read_text())
    except PermissionError:
        raise _unreadable(path) from None
    except (OSError, ValueError):
        info = None
    if isinstance(info, dict) and info.get("url"):
        pid = info.get("pid")
        if not isinstance(pid, int) or alive(pid, None):
            return str(info["url"]).rstrip("/")
    try:
        host = Instance(state_dir).read_host()
    except PermissionError:
        raise _unreadable(Instance(state_dir).host_file) from None
    if host and isinstance(host.get("pid"), int) and alive(host["pid"], host.get("start_time")):
        return None
    raise NoControlPlane(
        f"no running host found on {state_dir}: no corral control plane answers there "
        "(start one with `corral up`)"
    )


class ControlPlane:
    """An HTTP client of one state dir's control plane (use ``async with``).

    Args:
        state_dir: the host's state dir.
        url: the control plane's base URL, instead of the one ``server.json`` names.
        token: the client token; default ``CORRAL_TOKEN``, else the state dir's file.
        connect_wait_s: how long a call keeps retrying a control plane it cannot reach.
        stream_read_timeout_s: silence after which a stream is reopened.
        request_timeout_s: how long one call waits for its answer.
        transport: an httpx transport (tests); the default opens TCP connections.
    """

    def __init__(
        self,
        state_dir: Path,
        *,
        url: str | None = None,
        token: str | None = None,
        connect_wait_s: float = CONNECT_WAIT_S,
        stream_read_timeout_s: float = STREAM_READ_TIMEOUT_S,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.connect_wait_s = connect_wait_s
        self.stream_read_timeout_s = stream_read_timeout_s
        self._fixed_url = url.rstrip("/") if url else None
        self._url: str | None = self._fixed_url
        #: Given (argument or environment) tokens are used as they are; one read from the
        #: state dir is read again when the plane refuses it (``corral token rotate``).
        self._given_token = token or os.environ.get(TOKEN_ENV) or None
        self._token: str | None = self._given_token
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(request_timeout_s, connect=5.0), transport=transport
        )

    async def __aenter__(self) -> ControlPlane:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._http.aclose()

    def _auth(self) -> dict[str, str]:
        """The credential header (the token is read on first use, after the plane is found,
        so that a state dir with no host says so first).

        Raises:
            NoCredential: no token is given and the state dir's cannot be read.
        """
        if self._token is None:
            self._token = read_client_token(self.state_dir)
        return {"authorization": f"Bearer {self._token}"}

    def _token_changed(self) -> bool:
        """After a 401: whether the state dir's token is a new one (rotated since it was
        read), now in use. A given token is never replaced."""
        if self._given_token is not None:
            return False
        try:
            token = read_client_token(self.state_dir)
        except NoCredential:
            return False
        changed, self._token = token != self._token, token
        return changed

    async def url(self, *, until: float | None = None) -> str:
        """The base URL, waiting for a restarting control plane until ``until`` (trio
        time; by default :attr:`connect_wait_s` from now).

        Raises:
            NoControlPlane: there is none, or it did not come back in time.
        """
        if self._url is not None:
            return self._url
        assert self._fixed_url is None
        asked = False
        with trio.move_on_at(trio.current_time() + self.connect_wait_s if until is None else until):
            while True:
                url = locate(self.state_dir)
                if url is not None:
                    self._url = url
                    return url
                if not asked:
                    # A host that serves another server never starts one: say so at once
                    # rather than after the whole wait.
                    asked = True
                    if await trio.to_thread.run_sync(self._host_has_no_control_plane):
                        break
                await trio.sleep(0.1)
        raise NoControlPlane(
            f"no running host found on {self.state_dir}: the host there runs no embedded "
            "control plane (it serves [[runners]] or --server), or it did not come up within "
            f"{self.connect_wait_s:g}s"
        )

    def _host_has_no_control_plane(self) -> bool:
        """Whether the running host says it runs no control plane (False if it cannot say)."""
        inst = Instance(self.state_dir)
        host = inst.read_host() or {}
        try:
            status = request(Path(host.get("control") or inst.control_path), "status", timeout=5)
        except (OSError, RuntimeError, ValueError):
            return False
        return isinstance(status, dict) and "server" in status and status["server"] is None

    async def call(
        self,
        method: str,
        path: str,
        body: Mapping[str, object] | None = None,
        *,
        idempotent: bool,
        headers: dict[str, str] | None = None,
    ) -> JsonObject:
        """One API call; its JSON answer.

        Connection failures are retried (after re-reading ``server.json``) for
        :attr:`connect_wait_s` from the first one: a request that never reached the server is
        always safe to send again. Failures after it may have arrived, and 502/504 answers,
        are retried only when ``idempotent`` (a POST is, when it carries an idempotency key
        the server keeps); 503 (nothing done) always is.

        The wait counts from the first failure, not from the call: a request that hung on a
        stopped control plane until its read timeout has not used up the wait for the one
        the host starts in its place (the host kills a plane that stops answering its probe).

        Raises:
            NoControlPlane: the control plane cannot be reached.
            NoCredential: no client token can be read.
            ApiError: it answered with an error status.
        """
        lost_at: float | None = None
        delay = 0.1
        while True:
            url = await self.url(until=None if lost_at is None else lost_at + self.connect_wait_s)
            sent = {**(headers or {}), **self._auth()}
            try:
                response = await self._http.request(method, url + path, json=body, headers=sent)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                problem: str = f"cannot connect to {url}: {exc}"
            except httpx.TransportError as exc:
                if not idempotent:
                    raise NoControlPlane(
                        f"the control plane at {url} dropped {method} {path}: {exc}; it may or "
                        "may not have been done"
                    ) from exc
                problem = f"{method} {path} at {url} failed: {exc}"
            else:
                retry = response.status_code == 503 or (
                    idempotent and response.status_code in (502, 504)
                )
                if response.status_code == 401 and self._token_changed():
                    continue  # refused nothing of it: it is sent again with the new token
                if not retry:
                    if response.status_code >= 400:
                        raise ApiError.from_response(method, path, response)
                    return response.json() if response.content else {}
                problem = f"{method} {path} answered {response.status_code}"
            now = trio.current_time()
            lost_at = now if lost_at is None else lost_at
            if now + delay > lost_at + self.connect_wait_s:
                raise NoControlPlane(
                    f"no running host found on {self.state_dir}: {problem} "
                    f"(for {self.connect_wait_s:g}s)"
                )
            log.debug("%s; retrying", problem)
            self._url = self._fixed_url  # it may have come back elsewhere
            await trio.sleep(delay)
            delay = min(delay * 2, 1.0)

    # --- the API ---------------------------------------------------------------------------

    async def agents(self) -> list[JsonObject]:
        """``GET /v1/agents``: the agents this control plane offers."""
        return list((await self.call("GET", "/v1/agents", idempotent=True)).get("agents", []))

    async def create_session(self, agent: str, title: str | None = None) -> JsonObject:
        """``POST /v1/sessions``: a new session of ``agent``."""
        body: JsonObject = {"agent": agent}
        if title:
            body["title"] = title
        # A key of its own, as a message's (:meth:`post_message`): sent again, it is the
        # session made the first time.
        key = {"idempotency-key": uuid.uuid4().hex}
        return await self.call("POST", "/v1/sessions", body, idempotent=True, headers=key)

    async def session(self, session_id: str) -> JsonObject:
        """``GET /v1/sessions/{id}``: the session, with its ``last_event_id``."""
        return await self.call("GET", f"/v1/sessions/{session_id}", idempotent=True)

    async def post_message(self, session_id: str, text: str) -> JsonObject:
        """Post one user message (``202 {"queued", "item_id"}``).

        The POST carries an idempotency key of its own (``Idempotency-Key``, new for each
        message), and the control plane stores a message once per key: so a POST whose answer
        was lost — the control plane died while it was in flight — is sent again, with the
        same key, until it is answered (:meth:`call`).
        """
        key = uuid.uuid4().hex
        body = {"type": "message", "data": {"content": text}}
        return await self.call(
            "POST",
            f"/v1/sessions/{session_id}/events",
            body,
            idempotent=True,
            headers={"idempotency-key": key},
        )

    async def interrupt(self, session_id: str) -> JsonObject:
        """Ask the session's running turn to stop (repeating it is harmless)."""
        body = {"type": "interrupt", "data": {}}
        return await self.call("POST", f"/v1/sessions/{session_id}/events", body, idempotent=True)

    async def resolve(self, session_id: str, elicitation_id: str, action: str) -> JsonObject:
        """Answer an approval request: ``accept``, ``decline`` or ``cancel``."""
        path = f"/v1/sessions/{session_id}/elicitations/{elicitation_id}/resolve"
        return await self.call("POST", path, {"action": action}, idempotent=True)

    async def follow(
        self,
        session_id: str,
        after: str | None,
        on_event: Callable[[StreamEvent], Awaitable[bool]],
        *,
        on_open: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """Stream the session's events after ``after`` until ``on_event`` returns True.

        ``on_open`` runs once, as soon as the first stream is open (its response head has
        arrived): the moment to post the message the stream is meant to follow. A stream
        that drops, ends or goes silent is reopened from the last event id seen.

        Raises:
            NoControlPlane: the stream could not be reopened within :attr:`connect_wait_s`.
            NoCredential: no client token can be read.
            ApiError: the control plane refused the stream (e.g. an unknown session).
        """
        cursor = after
        opened = False
        lost_at: float | None = None
        delay = 0.1
        path = f"/v1/sessions/{session_id}/stream"
        timeout = httpx.Timeout(10.0, read=self.stream_read_timeout_s)
        while True:
            url = await self.url(until=None if lost_at is None else lost_at + self.connect_wait_s)
            headers = {"accept": "text/event-stream", **self._auth()}
            if cursor is not None:
                headers["last-event-id"] = str(cursor)
            try:
                async with self._http.stream(
                    "GET", url + path, headers=headers, timeout=timeout
                ) as response:
                    if response.status_code == 401 and self._token_changed():
                        continue  # reopened at once with the new token
                    if response.status_code >= 400 and response.status_code not in (502, 503, 504):
                        await response.aread()
                        raise ApiError.from_response("GET", path, response)
                    if response.status_code < 400:
                        lost_at, delay = None, 0.1
                        if not opened:
                            opened = True
                            if on_open is not None:
                                await on_open()
                        parser = SseParser()
                        async for line in response.aiter_lines():
                            event = parser.feed(line.rstrip("\r"))
                            if event is None:
                                continue
                            if event.id is not None:
                                cursor = event.id
                            if await on_event(event):
                                return
            except httpx.TransportError as exc:
                log.debug("stream of %s dropped: %s", session_id, exc)
            # Dropped, ended or refused for now: reopen from the cursor.
            now = trio.current_time()
            lost_at = now if lost_at is None else lost_at
            if now - lost_at > self.connect_wait_s:
                raise NoControlPlane(
                    f"lost the control plane's stream of session {session_id} for "
                    f"{self.connect_wait_s:g}s"
                )
            self._url = self._fixed_url
            await trio.sleep(delay)
            delay = min(delay * 2, 1.0)


# --- one turn --------------------------------------------------------------------------------

#: Decides an approval request: returns ``accept``/``decline``/``cancel``, or None to leave
#: it unanswered (the user interrupted instead).
Decide = Callable[[StreamEvent], Awaitable[str | None]]


async def run_turn(
    api: ControlPlane,
    session_id: str,
    after: str | None,
    text: str,
    *,
    on_event: Callable[[StreamEvent], None],
    decide: Decide,
    follower: TurnFollower | None = None,
) -> TurnFollower:
    """Post ``text`` to the session and follow the turn it starts to its end.

    ``after`` is the session's ``last_event_id`` read *before* this call: the stream opens
    after it, and the message is posted only once the stream is open. ``on_event`` sees each
    new event once, in order; approval requests go to ``decide`` and its verdict is sent at
    once (each request answered at most once). Bound it with a trio deadline.
    """
    turn = follower if follower is not None else TurnFollower(session_id)
    answered: set[str] = set()

    async def post() -> None:
        answer = await api.post_message(session_id, text)
        if isinstance(answer.get("item_id"), str):
            turn.item_id = answer["item_id"]

    async def handle(event: StreamEvent) -> bool:
        if turn.feed(event):
            await show(event)
        return turn.done

    async def show(event: StreamEvent) -> None:
        on_event(event)
        if event.type == "response.elicitation_resolved":
            answered.add(str(event.data.get("elicitation_id")))
        elif event.type == "response.elicitation_request" and not turn.done:
            elicitation_id = str(event.data.get("elicitation_id") or "")
            if elicitation_id and elicitation_id not in answered:
                answered.add(elicitation_id)
                action = await decide(event)
                if action is not None:
                    try:
                        await api.resolve(session_id, elicitation_id, action)
                    except ApiError as exc:
                        if exc.status not in (404, 409, 410):
                            raise
                        # Already answered or gone (an interrupt cancelled it): the turn
                        # still ends with its own edge, so keep following.
                        log.warning("approval %s was not taken: %s", elicitation_id, exc)

    await api.follow(session_id, after, handle, on_open=post)
    return turn
