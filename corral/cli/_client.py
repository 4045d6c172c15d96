"""The client side of ``corral agents/send/chat``: call the control plane, follow turns.

The HTTP API is the plane's client API (``/v1/agents``, ``/v1/sessions``,
``/v1/sessions/{id}/stream`` as resumable Server-Sent Events). :class:`ControlPlane` finds
the plane and its client token through the state dir (:mod:`._locate`), and every call
re-reads ``server.json`` after a connection failure and retries until
:attr:`~ControlPlane.connect_wait_s`, so a control plane that the host is restarting costs a
pause, not an error.

Following one turn without races or repeats is the whole point of :func:`run_turn`:

* The session's ``last_event_id`` is read first, the stream is opened *after* it, and only
  then is the message posted — so no event of the turn can slip out before the client
  listens, whatever the timing.
* A dropped stream (the control plane restarted, a proxy cut it, it went silent past
  :data:`STREAM_READ_TIMEOUT_S`) is reopened with ``Last-Event-ID`` = the last event seen,
  and :class:`~._turn_follower.TurnFollower` drops any event it has already seen, so each
  event is shown exactly once, and says when the turn is over.

The event logic (:mod:`._sse`, :mod:`._turn_follower`) is plain code with no I/O, apart from
this module, so it is tested on recorded event lists.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

import httpx
import trio

from .._jsonlines import JsonObject
from ..actors._control import request
from ..instance import Instance
from ._locate import TOKEN_ENV, NoControlPlane, NoCredential, locate, read_client_token
from ._sse import SseParser, StreamEvent
from ._turn_follower import TurnFollower

log = logging.getLogger("corral.cli.client")

#: A stream that sends nothing at all (not even a keepalive comment) for this long is
#: treated as dropped and reopened.
STREAM_READ_TIMEOUT_S = 60.0
#: How long a call waits for an unreachable control plane (e.g. one being restarted).
CONNECT_WAIT_S = 30.0
#: How long one call waits for its answer.
REQUEST_TIMEOUT_S = 30.0


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
                # A sub-agent's prompt, mirrored onto this stream, is answered where it lives.
                params = event.data.get("params")
                target = params.get("target_session_id") if isinstance(params, dict) else None
                owner = target if isinstance(target, str) and target else session_id
                if action is not None:
                    try:
                        await api.resolve(owner, elicitation_id, action)
                    except ApiError as exc:
                        if exc.status not in (404, 409, 410):
                            raise
                        # Already answered or gone (an interrupt cancelled it): the turn
                        # still ends with its own edge, so keep following.
                        log.warning(
                            "the verdict on %s was not taken: it was already answered (%s)",
                            elicitation_id,
                            exc.detail or exc.error,
                        )

    await api.follow(session_id, after, handle, on_open=post)
    return turn
