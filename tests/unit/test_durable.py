"""The broker's durable store on its own: mailboxes, attempts, dead letters, the log.

No sockets and no peers: what the store answers a sender is collected from its ``reply``.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from corral.bus import Accepted, Envelope, ErrorReply, Message, Nack, encode_body, new_id
from corral.bus._codec import encode_envelope
from corral.bus._durable import DurableStore
from corral.config import BusSettings


class Job(Message, tag="test.durable_job"):
    n: int


def _durable(n: int, *, wants_reply: bool = False) -> tuple[Envelope, bytes]:
    env = Envelope(
        id=new_id(),
        sender="client",
        recipient="worker",
        type="test.durable_job",
        body=encode_body(Job(n=n)),
        durability="durable",
        wants_reply=wants_reply,
    )
    return env, encode_envelope(env)


async def _store(path: Path, replies: list[tuple[str, str | None, Message]]) -> DurableStore:
    store = DurableStore(
        path, BusSettings(max_attempts=2), reply=lambda *answer: replies.append(answer)
    )
    await store.open()
    return store


def _deliver(store: DurableStore) -> None:
    """What the broker's pump does, without a socket: queued → in flight."""
    box = store.mailbox("worker")
    while box.queued:
        entry = box.queued.popleft()
        box.in_flight[entry.id] = entry


async def test_accepted_only_after_the_commit_and_once_per_sender(tmp_path: Path) -> None:
    replies: list[tuple[str, str | None, Message]] = []
    store = await _store(tmp_path / "mb.log", replies)
    store.register("worker")
    ids = []
    for env, frame in (_durable(1), _durable(2)):
        store.put(env, frame)
        ids.append(env.id)
    assert store.mailboxes("worker")[0]["queued"] == 2
    assert replies == [], "nothing is durable before the fsync"
    await store.commit_once()
    assert replies == [("client", None, Accepted(ids=ids))]
    store.close()


async def test_a_nacked_message_is_dead_lettered_past_max_attempts(tmp_path: Path) -> None:
    replies: list[tuple[str, str | None, Message]] = []
    store = await _store(tmp_path / "mb.log", replies)
    env, frame = _durable(1, wants_reply=True)
    store.put(env, frame)
    _deliver(store)
    assert store.nack("worker", Nack(id=env.id, error="boom")) is not None
    assert store.mailbox("worker").queued[0].attempt == 2
    _deliver(store)
    store.nack("worker", Nack(id=env.id, error="boom again"))
    assert store.mailboxes("worker")[0]["queued"] == 0
    (dead,) = store.dead_letters()
    assert dead["id"] == env.id
    assert dead["error"] == "boom again; gave up after 2 attempts"
    assert replies[-1] == (
        "client",
        env.id,
        ErrorReply(code="dead_letter", message="boom again; gave up after 2 attempts"),
    )
    store.close()


async def test_the_log_brings_back_what_was_not_acked(tmp_path: Path) -> None:
    path = tmp_path / "mb.log"
    store = await _store(path, [])
    kept, acked, parked = (_durable(n) for n in range(3))
    for env, frame in (kept, acked, parked):
        store.put(env, frame)
    _deliver(store)
    assert store.ack("worker", [acked[0].id]) is not None
    assert store.park("worker", parked[0].id) is not None
    assert store.nack("worker", Nack(id=kept[0].id, error="retry")) is not None
    await store.commit_once()
    store.close()

    again = await _store(path, [])
    box = again.mailbox("worker")
    assert [e.id for e in box.queued] == [kept[0].id]
    assert box.queued[0].attempt == 2, "the attempt was logged"
    assert list(box.parked) == [parked[0].id]
    assert "worker" in again.known
    (row,) = (r for r in again.parked() if r["state"] == "parked")
    assert msgspec.msgpack.decode(row["frame"], type=Envelope).id == parked[0].id
    again.close()


async def _handled(store: DurableStore, env: Envelope) -> None:
    """The worker takes ``env`` and acks it; the ack's round is committed alone."""
    _deliver(store)
    store.ack("worker", [env.id])
    await store.commit_once()


async def test_a_round_of_acks_alone_is_written_but_not_forced_to_disk(tmp_path: Path) -> None:
    """Acks cost a round of their own when nothing else arrives with them (sessions at a
    model's pace, #20): such a round is written, which any process crash leaves in the page
    cache, and forced to disk only with the next round that holds anything else, or at an
    orderly stop."""
    path = tmp_path / "mb.log"
    store = await _store(path, [])
    first, second = _durable(1), _durable(2)
    store.put(*first)
    await store.commit_once()
    assert store.stats == {"commits": 1, "syncs": 1, "compactions": 0}
    await _handled(store, first[0])
    assert store.stats == {"commits": 2, "syncs": 1, "compactions": 0}
    # The written ack is in the file at once: a broker killed now does not deliver it again.
    again = await _store(path, [])
    assert not again.mailbox("worker").queued
    again.close()
    store.put(*second)
    await store.commit_once()
    assert store.stats == {"commits": 3, "syncs": 2, "compactions": 0}
    await _handled(store, second[0])
    assert store.stats == {"commits": 4, "syncs": 2, "compactions": 0}
    # An orderly stop forces what no commit did.
    store.close()
    assert store.stats == {"commits": 4, "syncs": 3, "compactions": 0}
