"""The chaos driver's client of the control plane: its HTTP API and its session streams.

The driver is a user who is never confused by a crash: it keeps every event each session's
stream delivers (with its arrival time), reopens a dropped stream from the last event id it
saw, answers every approval request with ``accept``, and never posts a message twice —
when a POST drops on its way (the control plane killed under it), it asks the session's
items whether the message was stored before it sends it again. It is the oracle of the
chaos checks, so it is deliberately not the CLI's client (``corral.cli._client``, which the
benchmarks may not import): it records what the control plane sends, it does not repair it.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import trio

from .._jsonlines import JsonObject

log = logging.getLogger("corral.bench.chaos")

#: Statuses that end a turn on the session stream.
TERMINAL = ("idle", "failed")


class PlaneGone(Exception):
    """The control plane did not answer for longer than the driver's patience."""


@dataclass(slots=True)
class Event:
    """One event of a session stream as it arrived."""

    #: ``time.perf_counter()`` when its line was read.
    at: float
    #: The stream id (``id:``), an int for this control plane.
    id: int
    type: str
    data: JsonObject


@dataclass
class SessionLog:
    """Everything one session's stream delivered, in arrival order."""

    session_id: str
    events: list[Event] = field(default_factory=list)
    #: Stream ids that arrived twice or out of order (the stream's own promise broken).
    repeated_ids: list[int] = field(default_factory=list)
    #: Times the stream was reopened after a drop.
    reopened: int = 0
    changed: trio.Event = field(default_factory=trio.Event)

    @property
    def last_id(self) -> int:
        return self.events[-1].id if self.events else 0

    def add(self, event: Event) -> None:
        if self.events and event.id <= self.events[-1].id:
            self.repeated_ids.append(event.id)
            return
        self.events.append(event)
        self.changed.set()
        self.changed = trio.Event()

    def terminal_count(self) -> int:
        return sum(1 for e in self.events if _is_terminal(e))


def _is_terminal(event: Event) -> bool:
    return event.type == "session.status" and event.data.get("status") in TERMINAL


class PlaneClient:
    """HTTP calls to one control plane whose URL ``locate()`` gives (it may move on restart).

    Every call retries for up to ``patience_s`` while the control plane is unreachable or
    answers 5xx; a 4xx is returned to the caller, who decides. Each sends the plane's
    client ``token``, as the CLI does.
    """

    def __init__(
        self, locate: Callable[[], str | None], *, token: str, patience_s: float = 90.0
    ) -> None:
        self._locate = locate
        self.patience_s = patience_s
        # No pool limit: every session holds a stream open, and a POST must never queue
        # behind them for a connection (httpx's default pool is 100).
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(30.0, connect=5.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
            headers={"authorization": f"Bearer {token}"},
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _url(self, deadline: float) -> str:
        while True:
            url = await trio.to_thread.run_sync(self._locate)
            if url:
                return url
            if trio.current_time() > deadline:
                raise PlaneGone("no control plane address for the driver's whole patience")
            await trio.sleep(0.1)

    async def call(self, method: str, path: str, body: JsonObject | None = None) -> tuple[int, Any]:
        """One request, retried while nothing answers; ``(status, JSON body)``.

        Only for requests that are safe to repeat (reads, verdicts, session creation whose
        duplicates the driver ignores): :meth:`post_message` handles the one that is not.
        """
        deadline = trio.current_time() + self.patience_s
        delay = 0.05
        while True:
            url = await self._url(deadline)
            try:
                response = await self._http.request(method, url + path, json=body)
            except httpx.TransportError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code < 500:
                    return response.status_code, _json(response)
                problem = f"{response.status_code} {response.text[:200]}"
            if trio.current_time() > deadline:
                raise PlaneGone(f"{method} {path}: {problem}")
            await trio.sleep(delay)
            delay = min(delay * 2, 0.5)

    async def create_session(self, agent: str) -> str:
        status, body = await self.call("POST", "/v1/sessions", {"agent": agent})
        if status != 201:
            raise PlaneGone(f"POST /v1/sessions: {status} {body}")
        return str(body["id"])

    async def user_messages(self, session_id: str) -> int:
        """How many user messages the control plane has stored for the session."""
        status, body = await self.call("GET", f"/v1/sessions/{session_id}/items?limit=1000")
        if status != 200:
            raise PlaneGone(f"GET items of {session_id}: {status} {body}")
        return sum(1 for item in body.get("data", []) if item.get("role") == "user")

    async def post_message(self, session_id: str, text: str, stored_before: int) -> int:
        """Post one user message exactly once; returns how many POSTs it took.

        A POST that gets no answer may or may not have been stored: the session's items say,
        and only a message that is not there is posted again.
        """
        body = {"type": "message", "data": {"content": text}}
        path = f"/v1/sessions/{session_id}/events"
        deadline = trio.current_time() + self.patience_s
        posts = 0
        while True:
            url = await self._url(deadline)
            posts += 1
            try:
                response = await self._http.request("POST", url + path, json=body)
            except httpx.TransportError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code == 202:
                    return posts
                if response.status_code < 500:
                    raise PlaneGone(f"POST {path}: {response.status_code} {response.text[:200]}")
                problem = f"{response.status_code} {response.text[:200]}"
            if await self.user_messages(session_id) > stored_before:
                return posts  # it was stored; its answer was lost
            if trio.current_time() > deadline:
                raise PlaneGone(f"POST {path}: {problem}")
            await trio.sleep(0.05)

    async def accept(self, session_id: str, elicitation_id: str) -> int:
        """Answer an approval request ``accept``; the final status (202, or 404/409 when it
        was already answered or cancelled — the turn ends with its own edge then)."""
        path = f"/v1/sessions/{session_id}/elicitations/{elicitation_id}/resolve"
        status, _ = await self.call("POST", path, {"action": "accept"})
        return status

    async def follow(self, log_: SessionLog, on_event: Callable[[Event], None]) -> None:
        """Read the session's stream for ever (cancel to stop), reopening it from the last id
        after every drop; each new event goes to ``log_`` and then to ``on_event``."""
        path = f"/v1/sessions/{log_.session_id}/stream"
        timeout = httpx.Timeout(10.0, read=30.0)
        first = True
        while True:
            deadline = trio.current_time() + self.patience_s
            url = await self._url(deadline)
            headers = {"accept": "text/event-stream", "last-event-id": str(log_.last_id)}
            try:
                async with self._http.stream(
                    "GET", url + path, headers=headers, timeout=timeout
                ) as response:
                    if response.status_code == 200:
                        if not first:
                            log_.reopened += 1
                        first = False
                        await _read_sse(response, log_, on_event)
            except httpx.TransportError as exc:
                log.debug("stream of %s dropped: %s", log_.session_id, exc)
            await trio.sleep(0.05)


async def _read_sse(
    response: httpx.Response, log_: SessionLog, on_event: Callable[[Event], None]
) -> None:
    event_id: int | None = None
    kind: str | None = None
    data: list[str] = []
    async for raw in response.aiter_lines():
        line = raw.rstrip("\r")
        if line == "":
            if data and event_id is not None:
                payload = _loads("\n".join(data))
                event = Event(
                    time.perf_counter(), event_id, kind or str(payload.get("type")), payload
                )
                before = len(log_.events)
                log_.add(event)
                if len(log_.events) > before:
                    on_event(event)
            kind, data = None, []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            data.append(value)
        elif name == "event":
            kind = value
        elif name == "id":
            try:
                event_id = int(value)
            except ValueError:
                event_id = None


def _loads(text: str) -> JsonObject:
    try:
        value = json.loads(text)
    except ValueError:
        return {"data": text}
    return value if isinstance(value, dict) else {"data": value}


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return {"text": response.text[:200]}
