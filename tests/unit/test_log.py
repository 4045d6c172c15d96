"""The mailbox log: torn tails are cut off, never swallow the next record; compaction."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.bus._log import MAGIC, Acked, DeadLettered, MailboxLog, Put, frame_record, replay


def _puts(n: int) -> list[Put]:
    return [Put(id=f"m{i}", recipient="echo", frame=b"x" * (i % 7)) for i in range(n)]


def test_roundtrip(tmp_path: Path) -> None:
    log = MailboxLog(tmp_path / "mb.log")
    assert log.open() == []
    records = [*_puts(3), Acked(ids=["m0"]), DeadLettered("m1", "echo", "t", 2, "boom", 1.0)]
    log.write(b"".join(frame_record(r) for r in records))
    log.sync()
    log.close()
    assert replay(tmp_path / "mb.log")[0] == records


@settings(max_examples=60, deadline=None)
@given(cut=st.integers(min_value=0, max_value=400), garbage=st.binary(max_size=20))
def test_torn_tail_is_repaired_and_the_next_append_survives(
    tmp_path_factory, cut: int, garbage: bytes
) -> None:
    path = tmp_path_factory.mktemp("log") / "mb.log"
    log = MailboxLog(path)
    log.open()
    records = _puts(10)
    data = b"".join(frame_record(r) for r in records)
    log.write(data)
    log.close()
    # A crash mid-write: the file ends somewhere inside the last records, maybe with junk.
    full = path.read_bytes()
    torn = full[: max(len(MAGIC), len(full) - cut)] + garbage
    path.write_bytes(torn)
    log = MailboxLog(path)
    recovered = log.open()
    assert recovered == records[: len(recovered)], "an intact prefix, nothing invented"
    extra = Put(id="after", recipient="echo", frame=b"new")
    log.write(frame_record(extra))
    log.sync()
    log.close()
    assert replay(path)[0] == [*recovered, extra]


def test_rewrite_replaces_atomically(tmp_path: Path) -> None:
    log = MailboxLog(tmp_path / "mb.log")
    log.open()
    log.write(b"".join(frame_record(r) for r in _puts(100)))
    before = log.size
    log.rewrite(_puts(2))
    assert log.size < before
    log.write(frame_record(Acked(ids=["m0"])))
    log.close()
    assert replay(tmp_path / "mb.log")[0] == [*_puts(2), Acked(ids=["m0"])]
    assert not (tmp_path / "mb.compact").exists()


def test_not_a_log_is_refused(tmp_path: Path) -> None:
    import pytest

    path = tmp_path / "mb.log"
    path.write_bytes(b"something else entirely")
    with pytest.raises(ValueError, match="not a corral mailbox log"):
        MailboxLog(path).open()
