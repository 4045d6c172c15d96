"""Dispatch's parts without a host: the route table, the session store, event batches, the
``Handles`` table against the handlers, and the history's media fetched per session."""

from __future__ import annotations

import base64
import functools
import inspect
import itertools
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import msgspec
import pytest
import trio
import trio.testing

from corral._exceptions import CallTimeout, Unreachable
from corral.actors.dispatch import DispatchActor
from corral.actors.dispatch import messages as messages_module
from corral.actors.dispatch._fanout import Fanout, event_batches
from corral.actors.dispatch._journal_feed import batch_budget
from corral.actors.dispatch._options import DispatchOptions
from corral.actors.dispatch._routes import ROUTES, match
from corral.actors.dispatch._session import Session, SessionRecord
from corral.actors.dispatch._start import TurnSetup
from corral.actors.dispatch._store import SessionStore
from corral.actors.dispatch._stream import StreamOrder
from corral.actors.dispatch._turn import Turn
from corral.actors.dispatch._turns import TurnFlow
from corral.actors.gateway.messages import SessionEvent
from corral.bus import Envelope, Incoming, members
from corral.config import BusSettings
from corral.harnesses.protocol import Deltas, OutputTextDelta
from corral.server_client import ServerClient
from tests.fake_server import FakeOmnigentServer


@pytest.mark.parametrize(
    ("method", "path", "handler", "params"),
    [
        ("POST", "/v1/sessions", "create_session", {}),
        ("POST", "/v1/sessions/", "create_session", {}),
        ("GET", "/v1/sessions/s1", "get_session", {"session_id": "s1"}),
        ("DELETE", "/v1/sessions/s1", "delete_session", {"session_id": "s1"}),
        ("POST", "/v1/sessions/s1/events", "post_event", {"session_id": "s1"}),
        ("POST", "/v1/sessions/s1/mcp/execute", "mcp_execute", {"session_id": "s1"}),
    ],
)
def test_d01_the_route_table(method: str, path: str, handler: str, params: dict) -> None:
    found = match(ROUTES, method, path)
    assert found is not None
    assert (found[0].handler, found[1]) == (handler, params)
    assert callable(getattr(DispatchActor, handler))


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/sessions"),
        ("PUT", "/v1/sessions/s1"),
        ("GET", "/v1/sessions/s1/events"),
        ("POST", "/v1/sessions/s1/mcp"),
        ("POST", "/v2/sessions/s1/events"),
        ("POST", "/v1/agents"),
    ],
)
def test_no_route_is_none(method: str, path: str) -> None:
    assert match(ROUTES, method, path) is None


async def test_the_store_keeps_the_last_line_and_forgets_tombstoned_sessions(
    tmp_path: Path,
) -> None:
    store = SessionStore(tmp_path)
    assert await store.load() == []
    assert (await store.next_epoch(), await store.next_epoch()) == (1, 2)
    await store.append(SessionRecord(id="a", seq=1))
    await store.append(SessionRecord(id="b", seq=1))
    await store.append(SessionRecord(id="a", seq=5))
    await store.tombstone("b")
    with store.path.open("ab") as f:
        f.write(b'{"id":"c","se')  # a torn last line
    assert [(r.id, r.seq) for r in await store.load()] == [("a", 5)]
    assert len(store.path.read_bytes().splitlines()) == 5, "small logs are not rewritten"


async def test_a_large_log_is_rewritten_to_its_live_records(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    big = SessionRecord(id="a", buffer=[{"content": "x" * 1024 * 1024}])
    for _ in range(5):
        await store.append(big)
    await store.append(SessionRecord(id="a"))
    await store.append(SessionRecord(id="gone"))
    await store.tombstone("gone")
    assert [r.id for r in await store.load()] == ["a"]
    lines = store.path.read_bytes().splitlines()
    assert [msgspec.json.decode(line)["id"] for line in lines] == ["a"]


def test_event_batches_cut_by_count_and_bytes() -> None:
    def ev(seq: int, size: int) -> SessionEvent:
        return SessionEvent(session_id="s", seq=seq, event=b"x" * size)

    budget = batch_budget(BusSettings().max_message_bytes)
    small = [ev(i, 10) for i in range(1100)]
    assert [len(b.events) for b in event_batches(small, budget)] == [512, 512, 76]
    big = [ev(0, 600 * 1024), ev(1, 600 * 1024), ev(2, 2 * 1024 * 1024), ev(3, 10)]
    assert [[e.seq for e in b.events] for b in event_batches(big, budget)] == [[0], [1], [2], [3]]
    assert event_batches([], budget) == []
    # A bus with a small message limit gets smaller messages: every one fits under it.
    limit = 64 * 1024
    cut = event_batches([ev(i, 300) for i in range(500)], batch_budget(limit))
    assert len(cut) > 1 and [e.seq for b in cut for e in b.events] == list(range(500))
    assert all(len(msgspec.msgpack.encode(b)) < limit for b in cut)


def _table() -> dict[str, str]:
    """The rows of the protocol module's ``Message → reply:`` table: type name → reply."""
    doc = messages_module.__doc__ or ""
    section = doc.split("Message → reply:\n", 1)[1].split("\n\n", 1)[0]
    return dict(re.findall(r"^    (\w+)\s+→ (\S+)", section, flags=re.M))


def test_the_handles_table_is_what_the_actor_handles() -> None:
    handled = set(DispatchActor._handlers)
    documented = set(members(*(getattr(messages_module, name) for name in _table())))
    assert {t.__name__ for t in documented} == {t.__name__ for t in handled}


async def test_d27_history_media_is_fetched_from_the_session_of_the_upload() -> None:
    """The 0.19.1 server serves an upload only at /v1/sessions/{sid}/resources/files/{fid}
    /content (issue #13): the history rebuild asks for it there."""
    server = FakeOmnigentServer()
    session = server.add_session(server.add_agent("name: a\n"))
    sid = session["id"]
    server.add_item(
        sid,
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_image", "file_id": "file_1", "filename": "p.png"}],
        },
    )
    server.add_file("file_1", b"\x89PNG", "image/png")
    async with trio.open_nursery() as nursery:
        await server.start(nursery)
        client = ServerClient(server.base_url)
        # The part alone: the history needs nothing of the actor but its server client and
        # the setup's wait for an unavailable server (which asks once of one that answers).
        actor = cast(
            Any,
            SimpleNamespace(
                _server=lambda _session: client, sessions={}, options=DispatchOptions()
            ),
        )
        actor._while_unavailable = functools.partial(TurnSetup._while_unavailable, actor)
        try:
            content = await TurnFlow._history(actor, Session(SessionRecord(id=sid)), [])
        finally:
            await client.aclose()
        nursery.cancel_scope.cancel()
    url = "data:image/png;base64," + base64.b64encode(b"\x89PNG").decode()
    assert content[0]["content"][0] == {"type": "input_image", "image_url": url}
    assert server.received("GET", rf"/v1/sessions/{sid}/resources/files/file_1/content")
    assert not server.received("GET", r"/v1/files/.*")


def test_every_part_says_what_it_holds_and_the_public_names_stay() -> None:
    import importlib
    import pkgutil

    import corral.actors.dispatch as package

    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"corral.actors.dispatch.{info.name}")
        assert (module.__doc__ or "").strip(), info.name
        assert len(inspect.getsource(module).splitlines()) < 400, info.name
    for name in ("DispatchActor", "DispatchOptions", "SessionRecord", "Turn", "parse_event"):
        assert hasattr(package, name), name
    assert package.runner_tools({}) and package.BadEvent and package.MessageEvent


async def test_a_turn_start_the_broker_is_slow_to_take_goes_again_and_is_not_failed() -> None:
    """Under a flood the broker (the host's own process) took more than the bus's 10 s to
    store a turn's start: dispatch failed the turn (``runner_error``), and the harness actor
    ran it all the same once the broker had it, its output ignored. A timed-out start is now
    sent again, marked ``again`` (the harness actor runs a turn once, whichever copy it
    takes first), and the record keeps the messages until one is with the broker."""
    casts: list[Any] = []

    class Peer:
        name = "dispatch"

        async def cast(self, to: str, msg: Any, **kw: Any) -> str:
            await trio.lowlevel.checkpoint()
            casts.append(msg)
            if len(casts) == 1:
                raise CallTimeout("no reply from 'harness' to harness.turn within 10.0s")
            return "id"

    async def no_spec(session: Session, agent_id: str | None) -> dict[str, Any]:
        return {}

    async def no_history(session: Session, messages: list[Any]) -> list[Any]:
        return []

    async def failed(session: Session, turn: Turn, exc: Exception) -> None:
        raise AssertionError(f"the turn was failed: {exc}")

    jobs: list[Any] = []
    actor = cast(
        Any,
        SimpleNamespace(
            peer=Peer(),
            options=DispatchOptions(),
            _resolve_spec=no_spec,
            _history=no_history,
            _server=lambda _session: None,
            _setup_failed=failed,
            in_order=lambda _key, job: jobs.append(job),
        ),
    )
    actor._launch = functools.partial(TurnFlow._launch, actor)
    actor._restart = functools.partial(TurnFlow._restart, actor)
    message = {"type": "message", "role": "user", "content": "hi"}
    session = Session(SessionRecord(id="s"))
    session.turn = turn = Turn(turn_id="turn_1")
    session.record.starting = [message]
    response = await TurnFlow._launch(actor, session, turn, [message], None, continuation=False)
    assert response is not None and response.status == 202
    assert session.record.starting == [message]  # not with the broker yet: kept
    (job,) = jobs
    await job()
    assert [(c.turn_id, c.again) for c in casts] == [("turn_1", False), ("turn_1", True)]
    assert session.record.starting is None


async def test_a_worker_that_answers_a_resend_late_keeps_its_gap() -> None:
    """Events 100..119 are missing and 120 waits. A resend that times out (the worker alive,
    its answer behind a flood) leaves the gap for the events it queued again; only a worker
    that cannot answer (gone: the call fails at once) has its gap skipped and logged lost.
    Skipping on a timeout lost 1,024 events of three turns with 50 floods at once."""
    drained: list[int | None] = []

    async def drain(session: Session, turn: Turn) -> None:
        drained.append(turn.next_k)

    async def resend_failing(exc: Exception) -> Turn:
        class Peer:
            async def call(self, *args: Any, **kw: Any) -> Any:
                await trio.lowlevel.checkpoint()
                raise exc

        actor = cast(Any, SimpleNamespace(peer=Peer(), _drain=drain))
        session = Session(SessionRecord(id="s"))
        session.turn = turn = Turn(turn_id="t", next_k=100)
        turn.early[120] = cast(Any, (None, 0.0, None))
        await StreamOrder._resend(actor, session, turn)
        assert not turn.resending  # the next gap check may ask again
        return turn

    late = await resend_failing(CallTimeout("no reply from 'harness/s' within 5.0s"))
    assert late.next_k == 100 and drained == []
    gone = await resend_failing(Unreachable("peer 'harness/s' has gone away"))
    assert gone.next_k == 120 and drained == [120]


async def test_a_workers_deltas_are_each_taken_as_if_they_came_alone() -> None:
    """A :class:`Deltas` pack: each of its deltas goes the way a delta sent alone goes, in
    order; one of another turn (or of a session dispatch does not hold) is dropped."""
    taken: list[tuple[str, int]] = []

    async def worker_event(session: Session, turn: Turn, msg: Any, incoming: Any) -> None:
        taken.append((turn.turn_id, msg.sequence_number))

    session = Session(SessionRecord(id="s"))
    session.turn = Turn(turn_id="t2")
    actor = cast(Any, SimpleNamespace(sessions={"s": session}, _worker_event=worker_event))

    def pack(session_id: str, *turns: str) -> tuple[Deltas, Incoming]:
        events = [
            OutputTextDelta(turn_id=t, sequence_number=k, delta="x") for k, t in enumerate(turns)
        ]
        env = Envelope(
            id="m",
            sender="harness/s",
            recipient="dispatch",
            type="harness.deltas",
            body=msgspec.Raw(b""),
            session_id=session_id,
        )
        return Deltas(events=events), Incoming(env, Deltas(events=events))

    await DispatchActor.deltas(actor, *pack("s", "t2", "t1", "t2", "t2"))
    assert taken == [("t2", 0), ("t2", 2), ("t2", 3)]
    await DispatchActor.deltas(actor, *pack("gone", "t2"))
    assert len(taken) == 3


class _Rounds:
    """Stands in for the peer under the fan-out: when each round reached the broker."""

    bus = BusSettings()

    def __init__(self) -> None:
        self.rounds: list[tuple[float, int]] = []

    async def cast_many(self, to: str, msgs: list[Any], **_: Any) -> list[str]:
        self.rounds.append((trio.current_time(), sum(len(m.events) for m in msgs)))
        await trio.lowlevel.checkpoint()
        return []


async def _rounds_of_a_paced_stream(gap_s: float) -> list[tuple[float, int]]:
    """When each round went, counted from the first event, and how many events it held."""
    peer = _Rounds()
    fanout = Fanout(cast(Any, peer), subscribers=["gateway"], journal=None, gap_s=gap_s)
    records = [SessionRecord(id=f"s{i}") for i in range(10)]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(fanout.run_events)
        await trio.sleep(1)
        first = trio.current_time()
        for k in range(50):  # 10 sessions, an event every millisecond between them
            fanout.publish(records[k % 10], {"type": "response.output_text.delta"})
            await trio.sleep(0.001)
        await fanout.sent()
        nursery.cancel_scope.cancel()
    return [(t - first, n) for t, n in peer.rounds]


async def test_rounds_to_the_subscribers_keep_their_gap_and_a_lone_event_does_not_wait(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Many sessions at a model's pace cost a durable round (a commit, an fsync, a gateway
    write) per event; with ``publish_gap_ms`` a round starts at least that long after the
    last, and the events published meanwhile share it. The first event after a quiet spell
    goes at once."""
    every = await _rounds_of_a_paced_stream(0.0)
    assert len(every) == 50
    gapped = await _rounds_of_a_paced_stream(0.005)
    assert sum(n for _, n in gapped) == 50
    assert len(gapped) <= 11
    starts = [t for t, _ in gapped]
    assert all(b - a >= 0.005 - 1e-9 for a, b in itertools.pairwise(starts))
    assert starts[0] == 0, "the first event waited"
