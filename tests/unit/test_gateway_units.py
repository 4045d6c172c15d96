"""The gateway's pure parts for the 0.19 protocol (PROTOCOL_0_19.md): hello and server frames,
recycle delays, the stream vocabulary, the resources fallback, the buffer's skip and forget,
harness availability, and the fake tunnel server's item rules."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral import clis, harnesses
from corral.actors.gateway import (
    FATAL_CLOSE_CODES,
    RECYCLE_CLOSE_CODES,
    RECYCLE_HTTP_STATUSES,
    SERVER_STREAM_TYPES,
    EventAckFrame,
    EventReadyFrame,
    HelloFrame,
    StreamBuffer,
    decode_frame,
    encode_frame,
    recycle_delay,
    resources_fallback,
    spaced_json,
    stream_type,
)
from tests.fake_tunnel_server import ACCEPTED_STREAM_TYPES, item_violation, stream_violation

# --- hello and the server's frames (§A.2, §A.3) ------------------------------------------------


def test_hello_carries_capabilities_and_connection_id_in_wire_order() -> None:
    hello = HelloFrame(
        runner_version="0.1.0",
        frame_protocol_version=1,
        harnesses=["scripted"],
        envs=[],
        telemetry_opt_out=True,
        capabilities=["session-event-ingest-v1"],
        connection_id="6436b7545c1243cbac83a855a1c50ee5",
    )
    assert encode_frame(hello) == (
        b'{"kind":"hello","runner_version":"0.1.0","frame_protocol_version":1,'
        b'"harnesses":["scripted"],"envs":[],"telemetry_opt_out":true,'
        b'"capabilities":["session-event-ingest-v1"],'
        b'"connection_id":"6436b7545c1243cbac83a855a1c50ee5"}'
    )
    # Empty capabilities and no id are left out, as omnigent's runner does.
    bare = msgspec.structs.replace(hello, capabilities=[], connection_id=None)
    assert set(json.loads(encode_frame(bare))) == {
        "kind",
        "runner_version",
        "frame_protocol_version",
        "harnesses",
        "envs",
        "telemetry_opt_out",
    }


def test_event_ready_and_event_ack_decode_and_unknown_kinds_do_not() -> None:
    assert decode_frame(b'{"kind": "event.ready"}') == EventReadyFrame()
    ack = decode_frame(
        b'{"kind": "event.ack", "id": "ab", "applied": 2, "error": null, "retryable": false}'
    )
    assert ack == EventAckFrame(id="ab", applied=2)
    assert decode_frame(b'{"kind": "event.ack", "id": "ab", "applied": 0}') == EventAckFrame(
        id="ab", applied=0
    )
    for bad in (b'{"kind": "event.batch", "id": "x"}', b'{"kind": "event.ack", "id": "x"}'):
        with pytest.raises(msgspec.ValidationError):
            decode_frame(bad)


# --- close codes (§K.1, §K.4) -----------------------------------------------------------------


def test_close_code_sets_match_omnigents_runner() -> None:
    assert set(FATAL_CLOSE_CODES) == {4001, 4002, 4004, 4500}
    assert set(RECYCLE_CLOSE_CODES) == {1001, 1012}
    assert set(RECYCLE_HTTP_STATUSES) == {502}


def test_recycle_delay_is_uniform_between_its_bounds() -> None:
    assert recycle_delay(0.5, 3.0, rand=lambda: 0.0) == 0.5
    assert recycle_delay(0.5, 3.0, rand=lambda: 0.5) == 1.75
    assert recycle_delay(0.5, 3.0, rand=lambda: 1.0) == 3.0
    assert all(0.5 <= recycle_delay(0.5, 3.0) <= 3.0 for _ in range(1000))


# --- the stream vocabulary (§D.2) -------------------------------------------------------------


def test_server_stream_types_are_the_55_tags_of_the_union() -> None:
    assert len(SERVER_STREAM_TYPES) == 55
    for tag in ("session.status", "response.output_text.delta", "response.completed"):
        assert tag in SERVER_STREAM_TYPES
    for tag in ("runtime_model", "injection.consumed", "warning", "policy_evaluation.requested"):
        assert tag not in SERVER_STREAM_TYPES
    assert ACCEPTED_STREAM_TYPES == SERVER_STREAM_TYPES, "the fake and corral agree"


def test_stream_type_reads_only_a_string_type() -> None:
    assert stream_type(b'{"type": "session.status", "status": "idle"}') == "session.status"
    assert stream_type(b'{"status": "idle"}') is None
    assert stream_type(b'{"type": 5}') is None
    assert stream_type(b"[1]") is None
    assert stream_type(b"not json") is None


# --- the resources fallback (tools actor down) ------------------------------------------------


@pytest.mark.parametrize(
    "rest",
    [["resources"], ["resources", "terminals"], ["resources", "environments"]],
)
def test_a_list_of_resources_is_empty_while_the_tools_are_down(rest: list[str]) -> None:
    answer = resources_fallback("GET", rest)
    assert answer.status == 200
    assert json.loads(answer.body) == {
        "object": "list",
        "data": [],
        "first_id": None,
        "last_id": None,
        "has_more": False,
    }


@pytest.mark.parametrize(
    ("method", "rest"),
    [
        ("GET", ["resources", "environments", "default"]),
        ("GET", ["resources", "environments", "default", "filesystem", "a.txt"]),
        ("GET", ["resources", "environments", "default", "search"]),
        ("GET", ["resources", "environments", "default", "changes"]),
        ("POST", ["resources", "environments", "default", "shell"]),
        ("PUT", ["resources", "environments", "default", "filesystem", "a.txt"]),
        ("PATCH", ["resources", "environments", "default", "filesystem", "a.txt"]),
        ("DELETE", ["resources", "environments", "default", "filesystem", "a.txt"]),
        ("DELETE", ["resources"]),
        ("POST", ["resources", "terminals"]),
    ],
)
def test_anything_else_is_503_runner_unavailable(method: str, rest: list[str]) -> None:
    answer = resources_fallback(method, rest)
    assert answer.status == 503
    body = json.loads(answer.body)
    assert body["error"]["code"] == "runner_unavailable"
    assert body["error"]["message"]


# --- the buffer: events left out, sessions forgotten --------------------------------------------


def test_skipped_seqs_count_as_seen_and_write_nothing(tmp_path: Path) -> None:
    buf = StreamBuffer(tmp_path / "streams.log", max_events=10, compact_bytes=1 << 20)
    buf.load()
    assert buf.add("s", 1, b"{}")
    assert buf.skip("s", 2), "a new seq"
    assert not buf.skip("s", 2), "a redelivery is a duplicate"
    assert not buf.add("s", 2, b"{}"), "so is an event with that seq"
    assert buf.add("s", 3, b"{}")
    assert [seq for seq, _ in buf.take("s", 10, 1 << 20)] == [1, 3]
    buf.delivered("s", 3)
    assert buf.pending_count() == 0
    assert buf.stats["duplicates"] == 2
    buf.close()


def test_forget_drops_a_sessions_pending_events_for_good(tmp_path: Path) -> None:
    path = tmp_path / "streams.log"
    buf = StreamBuffer(path, max_events=10, compact_bytes=1 << 20)
    buf.load()
    for seq in (1, 2, 3):
        buf.add("gone", seq, b"{}")
    buf.add("kept", 1, b"{}")
    assert buf.forget("gone") == 3
    assert buf.forget("never-seen") == 0
    assert not buf.has_pending("gone") and buf.has_pending("kept")
    buf.delivered("gone", 2)  # a frame that was in flight: nothing changes
    assert buf.stats["forgotten"] == 3
    buf.close()
    again = StreamBuffer(path, max_events=10, compact_bytes=1 << 20)
    again.load()
    assert again.pending_count() == 1, "forgotten across a restart too"
    assert not again.add("gone", 3, b"{}")
    again.close()


# --- harness availability (§L) ----------------------------------------------------------------


def test_built_in_harness_kinds_are_all_available_where_their_clis_are(
    cli_bin: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(clis.CLI_PATH_ENV, str(cli_bin))
    assert harnesses.availability() == dict.fromkeys(harnesses.HARNESSES)


def test_a_cli_kind_is_unavailable_without_its_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(clis.CLI_PATH_ENV, str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    why = harnesses.availability()
    for kind, cli in clis.KIND_CLI.items():
        if kind in harnesses.HARNESSES:
            assert why[kind] == (
                f"it needs the {cli!r} CLI, which is not installed "
                f"(install: {clis.CLIS[cli].install})"
            ), kind
    assert why["scripted"] is None
    assert why["openai"] is None


def test_availability_says_why_a_kind_cannot_run() -> None:
    harnesses.register("gw-missing-module", "corral.harnesses.no_such_worker:Kind")
    harnesses.register(
        "gw-missing-package",
        "corral.harnesses.scripted:ScriptedHarness",
        requires=("json", "surely_not_installed_pkg_x"),
    )
    harnesses.register("gw-bad-target", "no-colon-here")
    try:
        why = harnesses.availability(
            ["scripted", "gw-missing-module", "gw-missing-package", "gw-bad-target", "gw-unknown"]
        )
    finally:
        for name in ("gw-missing-module", "gw-missing-package", "gw-bad-target"):
            harnesses.unregister(name)
    assert why == {
        "scripted": None,
        "gw-missing-module": "its module corral.harnesses.no_such_worker is not installed",
        "gw-missing-package": "it needs the Python module surely_not_installed_pkg_x",
        "gw-bad-target": "its target 'no-colon-here' is not module:Class",
        "gw-unknown": "not a harness kind registered on this host",
    }
    assert "gw-missing-package" not in harnesses.REQUIRES


# --- the fake server's rules (§E.1) ----------------------------------------------------------


def test_the_fake_rejects_items_the_server_could_not_persist() -> None:
    call = {"type": "function_call", "status": "completed", "name": "f", "arguments": "{}"}
    assert (
        item_violation({**call, "call_id": "c"})
        == "a completed function_call needs a string 'agent'"
    )
    assert item_violation({**call, "call_id": "c", "agent": "a"}) is None
    assert item_violation({**call, "status": "in_progress", "call_id": "c"}) is None
    message = {"type": "message", "role": "assistant", "content": []}
    assert item_violation(message) == "an assistant message needs a string 'agent'"
    assert item_violation({**message, "agent": "plain"}) is None
    assert item_violation({**message, "role": "user"}) is None
    assert item_violation({"type": "function_call_output", "call_id": "c", "output": 1})
    assert stream_violation({"type": "runtime_model"}) == (
        "stream event type 'runtime_model' is not in the server's union"
    )
    assert stream_violation({"type": "response.output_item.done", "item": message})


def test_events_an_older_gateway_buffered_are_left_out_on_load(tmp_path: Path) -> None:
    path = tmp_path / "streams.log"
    old = StreamBuffer(path, max_events=10, compact_bytes=1 << 20)
    old.load()
    old.add("s", 1, b'{"type": "response.output_text.delta", "delta": "a"}')
    old.add("s", 2, b'{"type": "runtime_model", "model": "m"}')
    old.add("s", 3, b'{"type": "session.status", "status": "idle"}')
    old.close()
    new = StreamBuffer(path, max_events=10, compact_bytes=1 << 20)
    new.load(lambda event: stream_type(event) in SERVER_STREAM_TYPES)
    assert [seq for seq, _ in new.take("s", 10, 1 << 20)] == [1, 3]
    assert not new.add("s", 2, b'{"type": "runtime_model"}'), "its seq still counts"
    new.close()


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(_JSON)
def test_a_relayed_event_is_written_exactly_as_json_dumps_writes_it(value: object) -> None:
    """The gateway re-serialises each event with json.dumps's separators and escapes (§ii.6),
    through the C encoder fed by msgspec (~1 µs a delta instead of ~5): the same text."""
    for event in (msgspec.json.encode(value), json.dumps(value).encode()):
        assert spaced_json(event) == json.dumps(json.loads(event))


def test_what_only_the_stdlib_reads_is_still_written_as_json_dumps_writes_it() -> None:
    for event in (b"[NaN, Infinity]", b'{"a": "\\ud800"}', b"1e400"):
        assert spaced_json(event) == json.dumps(json.loads(event))
    with pytest.raises(ValueError):
        spaced_json(b"not json")
