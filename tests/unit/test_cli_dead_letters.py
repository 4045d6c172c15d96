"""The mailbox side of ``corral dead-letters requeue|purge``: the broker's durable store on
its own (no sockets), and what its log brings back after a restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.bus import Envelope, Nack, encode_body, new_id
from corral.bus._codec import encode_envelope
from corral.bus._durable import DurableStore
from corral.config import BusSettings
from tests.unit.test_durable import Job


def _message(durability: str = "durable") -> tuple[Envelope, bytes]:
    env = Envelope(
        id=new_id(),
        sender="client",
        recipient="worker",
        type="test.durable_job",
        body=encode_body(Job(n=1)),
        durability=durability,  # type: ignore[arg-type]
    )
    return env, encode_envelope(env)


async def _store(path: Path) -> DurableStore:
    store = DurableStore(path, BusSettings(max_attempts=1), reply=lambda *answer: None)
    await store.open()
    store.register("worker")
    return store


def _kill(store: DurableStore) -> str:
    """Put one message, deliver it, and have its one attempt fail: a dead letter."""
    env, frame = _message()
    store.put(env, frame)
    box = store.mailbox("worker")
    entry = box.queued.popleft()
    box.in_flight[entry.id] = entry
    store.nack("worker", Nack(id=env.id, error="boom"))
    return env.id


async def test_requeue_puts_it_back_with_a_fresh_attempt_and_the_log_agrees(
    tmp_path: Path,
) -> None:
    path = tmp_path / "mb.log"
    store = await _store(path)
    requeued, purged, kept = _kill(store), _kill(store), _kill(store)
    assert store.mailboxes("worker")[0]["dead_letters"] == 3
    box = store.requeue_dead(requeued)
    assert [(e.id, e.attempt) for e in box.queued] == [(requeued, 1)]
    assert store.purge_dead([purged, "nosuch"]) == [purged]
    assert [d["id"] for d in store.dead_letters()] == [kept]
    assert store.mailboxes("worker")[0]["dead_letters"] == 1
    with pytest.raises(KeyError):
        store.requeue_dead(purged)
    await store.commit_once()
    store.close()

    again = await _store(path)
    assert [d["id"] for d in again.dead_letters()] == [kept]
    assert [(e.id, e.attempt) for e in again.mailbox("worker").queued] == [(requeued, 1)]
    # Compaction keeps the dead letter's message, so it can still be requeued after it.
    await again._compact()
    again.close()
    third = await _store(path)
    assert [e.id for e in third.requeue_dead(kept).queued] == [requeued, kept]
    third.close()


async def test_what_cannot_be_delivered_again_stays_a_dead_letter(tmp_path: Path) -> None:
    store = await _store(tmp_path / "mb.log")
    env, frame = _message("stream")
    store.record_dead(env.id, "worker", env.type, 1, "refused", frame)
    store.record_dead("gone", "worker", "x", 1, "not kept", b"")
    stranger, frame = _message()
    store.record_dead(
        stranger.id, "nobody", stranger.type, 1, "unknown", frame.replace(b"worker", b"nobody")
    )
    with pytest.raises(ValueError, match="stream message"):
        store.requeue_dead(env.id)
    with pytest.raises(ValueError, match="not kept whole"):
        store.requeue_dead("gone")
    with pytest.raises(ValueError, match="no actor named 'nobody'"):
        store.requeue_dead(stranger.id)
    assert len(store.dead_letters()) == 3
    store.close()
