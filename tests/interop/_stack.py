"""The interop stack: the real omnigent 0.19.1 server, a fake LLM, and corral as its runner.

Everything here is a real process on 127.0.0.1, driven from outside the way a user drives it:
the server is ``omnigent server`` from the cached venv that ``.ci/omnigent-venv`` builds, with
an isolated HOME and a sqlite database; corral is ``corral up`` bound to it through a
``[[runners]]`` table; sessions go through the server's public client API (REST and the
client SSE stream), never through corral directly. Only the model provider is faked
(``fake_llm.py``), since it is the one part outside the machine.

What counts as a failure here is what a user of the server would see, plus what the server
says about corral in its log:

* a client stream that ends while the test still reads it (the server cuts every viewer's
  stream when corral sends it an event it cannot validate),
* a ``WARN``/``ERROR`` record in the server's log (a rejected forward, an item it could not
  parse, a policy call it refused, an unhandled exception),
* a 4xx/5xx in the server's access log for a request that was not the test client's own.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import trio

from corral.bench import _omnigent

# Re-exported: the suite's modules take the whole stack from here.
from corral.bench._omnigent import free_port as free_port
from corral.bench._omnigent import runner_id_for as runner_id_for
from corral.bench._omnigent import runner_online as runner_online

HERE = Path(__file__).parent
REPO = HERE.parent.parent
#: The user agent of the test's own client: its 4xx answers are the test's business.
CLIENT_UA = "corral-interop-client/1"


class FakeLLM:
    """``fake_llm.py`` as a subprocess; its request log tells what each LLM call was given."""

    def __init__(self, root: Path) -> None:
        self.log_path = root / "llm_requests.jsonl"
        self.log_path.touch()
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "fake_llm.py"), "--log", str(self.log_path)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith("port="), line
        self.url = f"http://127.0.0.1:{int(line.split('=')[1])}"

    def requests(self, model: str | None = None) -> list[dict[str, Any]]:
        rows = [json.loads(line) for line in self.log_path.read_text().splitlines() if line]
        return [r["body"] for r in rows if model is None or r["body"].get("model") == model]

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


class OmnigentServer(_omnigent.OmnigentServer):
    """``omnigent server`` with every agent of ``agents/`` loaded, their ``${LLM}`` the fake
    LLM's URL, the policies of ``policies/`` importable."""

    def __init__(self, venv: Path, root: Path, llm: FakeLLM) -> None:
        self.agents_dir = root / "agents"
        shutil.copytree(HERE / "agents", self.agents_dir)
        for path in self.agents_dir.rglob("*.yaml"):
            path.write_text(path.read_text().replace("${LLM}", llm.url))
        agents = sorted(self.agents_dir.glob("*.yaml")) + [
            p for p in sorted(self.agents_dir.iterdir()) if p.is_dir()
        ]
        super().__init__(venv, root, agents, env={"PYTHONPATH": str(HERE / "policies")})


@dataclass
class LogWatch:
    """What the server logged since a mark, and which of it is a problem caused by corral."""

    server: OmnigentServer
    start: int = 0
    allowed: list[re.Pattern[str]] = field(default_factory=list)

    def mark(self) -> None:
        self.start = len(self.server.log_text())

    def allow(self, pattern: str) -> None:
        """A record the test provokes on purpose (say why at the call)."""
        self.allowed.append(re.compile(pattern))

    def text(self) -> str:
        return self.server.log_text()[self.start :]

    def problems(self) -> list[str]:
        found = []
        for record in _records(self.text()):
            head = record.split("\n", 1)[0]
            if any(p.search(record) for p in self.allowed):
                continue
            if head.startswith(("WARN", "ERROR", "CRITICAL")):
                found.append(record[:1500])
            elif "uvicorn.access" in head and CLIENT_UA not in head:
                status = re.search(r'HTTP/[\d.]+" (\d{3})', head)
                if status and int(status.group(1)) >= 400:
                    found.append(head)
        return found


def _records(text: str) -> list[str]:
    """Log records: a record starts with a level word; tracebacks continue it."""
    records: list[str] = []
    for line in text.splitlines():
        if re.match(r"^(DEBUG|INFO|WARN|WARNING|ERROR|CRITICAL)\s", line) or not records:
            records.append(line)
        else:
            records[-1] += "\n" + line
    return records


class Stream:
    """A client's view of a session: the server's client SSE stream, read in a task.

    ``broken`` is set when the stream ends while the test still reads it — which is how a
    viewer experiences an event the server could not validate.
    """

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.events: list[dict[str, Any]] = []
        self.broken: str | None = None
        self._changed = trio.Event()
        self._closing = False
        self.opened = trio.Event()

    async def run(self, http: httpx.AsyncClient) -> None:
        try:
            async with http.stream(
                "GET", f"/v1/sessions/{self.session_id}/stream", timeout=httpx.Timeout(None)
            ) as response:
                if response.status_code != 200:
                    self.broken = f"stream answered {response.status_code}"
                    return
                self.opened.set()
                async for line in response.aiter_lines():
                    if line.startswith("data:"):
                        payload = line[5:].strip()
                        if payload and payload != "[DONE]":
                            self.events.append(json.loads(payload))
                            self._changed.set()
                            self._changed = trio.Event()
            if not self._closing:
                self.broken = f"stream ended after {self._last_type()}"
        except httpx.HTTPError as exc:
            if not self._closing:
                self.broken = f"stream failed after {self._last_type()}: {exc!r}"
        finally:
            self.opened.set()
            self._changed.set()

    def _last_type(self) -> str:
        return self.events[-1].get("type", "?") if self.events else "nothing"

    def close(self) -> None:
        self._closing = True

    async def wait(
        self, predicate: Callable[[dict[str, Any]], bool], *, after: int = 0, timeout: float = 30
    ) -> tuple[int, dict[str, Any]]:
        """The first event at or after index ``after`` that matches, and its index."""
        with trio.fail_after(timeout):
            while True:
                for i in range(after, len(self.events)):
                    if predicate(self.events[i]):
                        return i, self.events[i]
                if self.broken:
                    raise AssertionError(f"client stream broke: {self.broken}")
                await self._changed.wait()

    def types(self, start: int = 0, end: int | None = None) -> list[str]:
        return [e.get("type", "") for e in self.events[start:end]]

    def statuses(self, start: int = 0) -> list[str]:
        return [e["status"] for e in self.events[start:] if e.get("type") == "session.status"]

    def text(self, start: int = 0, end: int | None = None) -> str:
        return "".join(
            e.get("delta", "")
            for e in self.events[start:end]
            if e.get("type") == "response.output_text.delta"
        )


def is_status(*values: str) -> Callable[[dict[str, Any]], bool]:
    return lambda e: e.get("type") == "session.status" and e.get("status") in values


class Client:
    """The server's public client API, as a user's client calls it (PROTOCOL_0_19.md,
    "Client flow")."""

    def __init__(self, http: httpx.AsyncClient, nursery: trio.Nursery, runner_id: str) -> None:
        self.http = http
        self.nursery = nursery
        self.runner_id = runner_id
        self._agents: dict[str, str] = {}
        self.streams: list[Stream] = []

    async def agent_id(self, name: str) -> str:
        if not self._agents:
            r = await self.http.get("/v1/agents", params={"limit": 100})
            r.raise_for_status()
            self._agents = {a["name"]: a["id"] for a in r.json()["data"]}
        return self._agents[name]

    async def session(self, agent: str, *, bind: bool = True) -> str:
        r = await self.http.post("/v1/sessions", json={"agent_id": await self.agent_id(agent)})
        assert r.status_code == 201, r.text
        session_id = r.json()["id"]
        if bind:
            r = await self.http.patch(
                f"/v1/sessions/{session_id}", json={"runner_id": self.runner_id}, timeout=60
            )
            assert r.status_code == 200, r.text
        return session_id

    async def open_stream(self, session_id: str) -> Stream:
        stream = Stream(session_id)
        self.streams.append(stream)
        self.nursery.start_soon(stream.run, self.http)
        await stream.opened.wait()
        if stream.broken:
            raise AssertionError(stream.broken)
        # The server starts relaying once it has subscribed this viewer: its first frame.
        await stream.wait(lambda e: True, timeout=30)
        return stream

    async def post(self, session_id: str, event: dict[str, Any]) -> httpx.Response:
        return await self.http.post(f"/v1/sessions/{session_id}/events", json=event, timeout=60)

    async def say(self, session_id: str, text: str) -> dict[str, Any]:
        r = await self.post(
            session_id,
            {
                "type": "message",
                "data": {"role": "user", "content": [{"type": "input_text", "text": text}]},
            },
        )
        assert r.status_code == 202, r.text
        return r.json()

    async def turn(self, stream: Stream, text: str, *, timeout: float = 60) -> tuple[int, int]:
        """Send ``text`` and wait until the session is ``idle`` or ``failed`` again; the
        indexes of the turn's first and terminal events in ``stream.events``."""
        start = len(stream.events)
        await self.say(stream.session_id, text)
        first, _ = await stream.wait(is_status("running"), after=start, timeout=timeout)
        end, _ = await stream.wait(is_status("idle", "failed"), after=first, timeout=timeout)
        return start, end

    async def items(self, session_id: str) -> list[dict[str, Any]]:
        r = await self.http.get(
            f"/v1/sessions/{session_id}/items", params={"limit": 100, "order": "asc"}
        )
        r.raise_for_status()
        return r.json()["data"]

    async def wait_items(
        self, session_id: str, n: int, timeout: float = 20
    ) -> list[dict[str, Any]]:
        """The session's items once there are at least ``n`` (the server saves some of them
        after the turn's last event, from its own relay task)."""
        with trio.fail_after(timeout):
            while len(items := await self.items(session_id)) < n:
                await trio.sleep(0.05)  # polling the server: nothing to wait on
        return items

    async def resolve(self, session_id: str, elicitation_id: str, action: str) -> httpx.Response:
        return await self.http.post(
            f"/v1/sessions/{session_id}/elicitations/{elicitation_id}/resolve",
            json={"action": action},
            timeout=60,
        )


@contextlib.asynccontextmanager
async def open_client(server_url: str, runner_id: str) -> AsyncIterator[Client]:
    async with (
        httpx.AsyncClient(
            base_url=server_url, headers={"user-agent": CLIENT_UA}, timeout=30
        ) as http,
        trio.open_nursery() as nursery,
    ):
        client = Client(http, nursery, runner_id)
        try:
            yield client
        finally:
            for stream in client.streams:
                stream.close()
            nursery.cancel_scope.cancel()


def corral_config(server_url: str, token: str, workspace: Path, extra: str = "") -> str:
    return (
        f'workspace = "{workspace}"\n'
        "[server]\nenabled = false\n"
        f'[[runners]]\nserver = "{server_url}"\ntoken = "{token}"\n' + extra
    )


def new_token() -> str:
    return f"interop-{uuid.uuid4().hex}"
