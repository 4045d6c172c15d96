"""What the journal actor keeps of a complete durable message: its seqs, in as little memory
as they fit — it keeps them for the last 1,024 messages of up to 4,096 runs (#20)."""

from __future__ import annotations

import sys
from array import array

from corral.actors.journal._actor import _compact, _known_at


def test_consecutive_seqs_are_a_range_whatever_their_number() -> None:
    kept = _compact(list(range(7, 100_007)))
    assert kept == range(7, 100_007) and sys.getsizeof(kept) < 100
    assert [_known_at(kept, i) for i in (0, 99_999, 100_000)] == [7, 100_006, None]


def test_seqs_with_a_replay_among_them_are_an_array_of_8_bytes_each() -> None:
    seqs = [0, 0, *range(40, 100_040)]
    kept = _compact(seqs)
    assert isinstance(kept, array) and list(kept) == seqs
    assert sys.getsizeof(kept) < 8 * len(seqs) + 100
    assert [_known_at(kept, i) for i in (0, 2, len(seqs))] == [0, 40, None]


def test_a_message_still_being_applied_is_a_dict_of_what_is_known() -> None:
    assert _known_at({0: 5, 2: 7}, 2) == 7 and _known_at({0: 5}, 1) is None
    assert _compact([]) == array("q")
