"""A stand-in for the gateway in dispatch tests: sends HttpRequests, collects session events
(``SessionEvents`` batches, or a lone ``SessionEvent``)."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

from corral.actors.gateway.messages import Inbound, events_of
from corral.bus import Peer, open_peer
from corral.config import LivenessSettings
from corral.routes import HttpChunk, HttpRequest, HttpResponse

FAST = LivenessSettings(interval_s=0.2, liveness=3)


class FakeGateway:
    def __init__(self, peer: Peer) -> None:
        self.peer = peer
        self.events: dict[str, list[dict[str, Any]]] = {}
        #: Every event's bytes by session and seq, and how many came again (dropped).
        self.sent: dict[str, dict[int, bytes]] = {}
        self.replayed = 0
        self.chunks: dict[str, list[bytes]] = {}
        self.ended: set[str] = set()
        self._changed = trio.Event()

    async def _collect(self) -> None:
        async for incoming in self.peer.inbox:
            self.peer.ack(incoming)
            msg = incoming.msg
            for event in events_of(msg):
                got = self.events.setdefault(event.session_id, [])
                sent = self.sent.setdefault(event.session_id, {})
                if event.seq in sent:
                    # Sent again after a restart (dispatch replays what it saved and may not
                    # have sent, with its own seq; the gateway drops a seq it has seen): the
                    # same event, byte for byte.
                    assert sent[event.seq] == event.event, ("a seq replayed as another event",)
                    self.replayed += 1
                    continue
                ordered = not got or got[-1]["_seq"] < event.seq
                assert ordered, (
                    "events in order, no duplicates",
                    [(e["_seq"], e["type"]) for e in got],
                    (event.seq, event.event[:80]),
                )
                sent[event.seq] = event.event
                got.append({**json.loads(event.event), "_seq": event.seq})
            if isinstance(msg, HttpChunk):
                self.chunks.setdefault(msg.request_id, []).append(msg.data)
                if msg.end:
                    self.ended.add(msg.request_id)
            self._changed.set()
            self._changed = trio.Event()

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: str = "",
        raw: bytes | None = None,
        request_id: str | None = None,
        timeout: float = 20,
    ) -> HttpResponse:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else b"")
        reply = await self.peer.call(
            "dispatch",
            HttpRequest(
                request_id=request_id or uuid.uuid4().hex,
                method=method,
                path=path,
                query=query,
                body=data,
                reply_to=self.peer.name,
            ),
            durable=method == "POST",
            timeout=timeout,
        )
        return reply

    async def init(self, session_id: str, agent_id: str | None = None) -> HttpResponse:
        return await self.request(
            "POST", "/v1/sessions", {"session_id": session_id, "agent_id": agent_id}
        )

    async def message(
        self, session_id: str, text: str, timeout: float = 20, **fields: Any
    ) -> HttpResponse:
        body = {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": text}],
            **fields,
        }
        path = f"/v1/sessions/{session_id}/events"
        return await self.request("POST", path, body, timeout=timeout)

    def statuses(self, session_id: str) -> list[str]:
        return [
            e["status"] for e in self.events.get(session_id, []) if e["type"] == "session.status"
        ]

    def texts(self, session_id: str) -> str:
        return "".join(
            e["delta"]
            for e in self.events.get(session_id, [])
            if e["type"] == "response.output_text.delta"
        )

    async def wait(self, predicate: Any, timeout: float = 15) -> None:
        with trio.move_on_after(timeout):
            while not predicate():
                await self._changed.wait()
            return
        raise AssertionError(f"timed out; events so far: {self.events}")

    async def until_status(
        self, session_id: str, *terminal: str, count: int = 1, timeout: float = 15
    ) -> list[str]:
        terminal = terminal or ("idle", "failed")
        await self.wait(
            lambda: sum(s in terminal for s in self.statuses(session_id)) >= count, timeout
        )
        return self.statuses(session_id)


@asynccontextmanager
async def fake_gateway(endpoint: str, name: str = "test-gateway") -> AsyncIterator[FakeGateway]:
    async with (
        open_peer(name, endpoint, liveness=FAST, accepts=Inbound) as peer,
        trio.open_nursery() as nursery,
    ):
        gw = FakeGateway(peer)
        nursery.start_soon(gw._collect)
        yield gw
        nursery.cancel_scope.cancel()


def scripted_yaml(name: str, *steps: str) -> str:
    """An agent YAML on the scripted harness; each step is a YAML flow mapping."""
    lines = [
        f"name: {name}",
        "executor:",
        "  harness: scripted",
        "  model: scripted-model",
        "  script:",
        "    turns:",
        "      -",
    ]
    lines += [f"        - {step}" for step in steps]
    return "\n".join(lines) + "\n"
