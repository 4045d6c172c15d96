"""The TypedDicts of the journal's and the OS tools' answers say exactly which keys they
have: each answer, produced for real (journal files, files and a shell in a temporary
directory), has every required key of its type, and no key the type does not name.

mypy checks the dicts built as literals; this checks the ones built otherwise (spreads,
``update``, decoded lines), which is where a type and its value drift apart.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NotRequired, get_origin, get_type_hints, is_typeddict

import pytest

from corral.journal import (
    Listing,
    Malformed,
    Replay,
    RunJournal,
    RunRow,
    SessionPayload,
    SessionRow,
    Snapshot,
    StoredRecord,
    Summary,
)
from corral.tools._replies import EditResult, ReadResult, ShellResult, WriteResult
from corral.tools.os_tools import TOOLS
from tests._tool_context import tool_context

_TOOLS = {tool.name: tool for tool in TOOLS}


def assert_shape(value: Mapping[str, Any], shape: type) -> None:
    """``value`` has ``shape``'s required keys and no others than its optional ones.

    The keys are read from the evaluated hints: with postponed annotations, 3.11's
    ``__required_keys__`` counts a ``NotRequired`` key as required.
    """
    assert is_typeddict(shape)
    hints = get_type_hints(shape, include_extras=True)
    optional = {k for k, hint in hints.items() if get_origin(hint) is NotRequired}
    required = set() if not shape.__total__ else set(hints) - optional
    keys = set(value)
    assert required <= keys, f"{shape.__name__} misses {sorted(required - keys)}"
    assert keys <= set(hints), f"{shape.__name__} does not name {sorted(keys - set(hints))}"


def test_journal_answers_have_the_keys_of_their_types_j01_j16(tmp_path: Path) -> None:
    """J-01 (the stored record), J-16 (the snapshot by run id), summaries, reads, listings."""
    with RunJournal(tmp_path) as journal:
        stored = journal.append("s1", "r1", "token", {"text": "hi"})
        keyed = journal.append("s1", "r1", "done", None, key="m/0", session_seq=2)
        assert_shape(stored, StoredRecord)
        assert_shape(keyed, StoredRecord)
        assert_shape(journal.summary("s1", "r1"), Summary)
        replay = journal.read("s1", "r1")
        assert_shape(replay, Replay)
        snapshot = journal.snapshot("r1")
        assert snapshot is not None
        assert_shape(snapshot, Snapshot)
        assert_shape(journal.session_payload(snapshot), SessionPayload)
        sessions = journal.listing()
        assert_shape(sessions, Listing)
        assert_shape(sessions["sessions"][0], SessionRow)
        runs = journal.listing("s1")
        assert_shape(runs, Listing)
        assert_shape(runs["runs"][0], RunRow)


def test_a_strict_read_reports_malformed_lines_in_their_shape(tmp_path: Path) -> None:
    with RunJournal(tmp_path) as journal:
        journal.append("s1", "r1", "token", {"text": "a"})
        path = journal.path("s1", "r1")
    with path.open("ab") as f:
        f.write(b"not json\n")
    with RunJournal(tmp_path) as journal:
        replay = journal.read("s1", "r1", strict=True)
    assert replay["malformed"]
    for entry in replay["malformed"]:
        assert_shape(entry, Malformed)


@pytest.mark.parametrize(
    ("tool", "args", "shape"),
    [
        ("sys_os_write", {"path": "a.txt", "content": "one\ntwo\nthree\n"}, WriteResult),
        ("sys_os_read", {"path": "a.txt"}, ReadResult),
        ("sys_os_read", {"path": "a.txt", "limit": 1}, ReadResult),
        ("sys_os_edit", {"path": "a.txt", "oldText": "two", "newText": "2"}, EditResult),
        ("sys_os_shell", {"command": "echo hi"}, ShellResult),
    ],
)
async def test_os_tool_outputs_have_the_keys_of_their_types_t01_t04(
    tmp_path: Path, tool: str, args: dict[str, Any], shape: type
) -> None:
    """T-01 to T-04: the JSON each OS tool answers with is its reply type's."""
    ctx = tool_context(tmp_path, workspace=tmp_path)
    (tmp_path / "a.txt").write_text("one\ntwo\nthree\n")
    assert_shape(json.loads(await _TOOLS[tool].run(ctx, args)), shape)
