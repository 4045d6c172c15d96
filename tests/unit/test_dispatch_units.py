"""Dispatch pieces without processes: event parsing, approval flattening, history assembly."""

from __future__ import annotations

import base64

import msgspec
import pytest

from corral.actors.dispatch import (
    ApprovalEvent,
    BadEvent,
    MessageEvent,
    SessionRecord,
    Turn,
    flatten_approval,
    parse_event,
)
from corral.actors.dispatch import _history as history


def test_d02_message_event_fields_are_all_optional_but_type() -> None:
    event = parse_event(b'{"type": "message"}')
    assert isinstance(event, MessageEvent) and event.role == "user"
    full = parse_event(
        b'{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}],'
        b'"model":"agent","agent_id":"a1","harness":"scripted","instructions":"x",'
        b'"connection_params":{"api_key":"k"},"persisted_item_id":"it1",'
        b'"harness_override":"pi","model_override":"m","has_mcp_servers":false}'
    )
    assert isinstance(full, MessageEvent)
    assert (full.agent_id, full.persisted_item_id, full.harness_override) == ("a1", "it1", "pi")


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"nope", 400),
        (b"[]", 400),
        (b'{"no": "type"}', 400),
        (b'{"type": "warp"}', 422),
        (b'{"type": "message", "content": 1, "agent_id": 2}', 422),
    ],
)
def test_bad_events_are_typed_4xx(body: bytes, status: int) -> None:
    with pytest.raises(BadEvent) as info:
        parse_event(body)
    assert info.value.status == status


def test_e01_e03_approval_is_flattened() -> None:
    nested = parse_event(
        b'{"type":"approval","data":{"elicitation_id":"elicit_x","action":"accept","content":{"note":"ok"}}}'
    )
    assert isinstance(nested, ApprovalEvent)
    flat = msgspec.json.decode(msgspec.json.encode(flatten_approval(nested, "s")))
    assert flat == {
        "type": "harness.approval",
        "session_id": "s",
        "elicitation_id": "elicit_x",
        "action": "accept",
        "content": {"note": "ok"},
    }
    declined = parse_event(b'{"type":"approval","data":{"elicitation_id":"e2","action":"decline"}}')
    flat = msgspec.json.decode(msgspec.json.encode(flatten_approval(declined, "s")))
    assert "content" not in flat, "no content, no content key (E-02)"
    with pytest.raises(BadEvent):
        flatten_approval(ApprovalEvent(data={"action": "maybe"}), "s")


def _user(text: str, item_id: str) -> dict:
    return {
        "id": item_id,
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": text}],
    }


def test_d24_d26_rehydrate_drops_exactly_the_persisted_item() -> None:
    stored = [
        _user("prior", "i1"),
        {
            "id": "i2",
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "answer"}],
        },
        _user("new", "i3"),
    ]
    assert history.texts(history.rehydrate(stored, "i3")) == ["prior", "answer"]
    assert history.texts(history.rehydrate(stored, None)) == ["prior", "answer", "new"]
    resource = {"type": "resource_event", "event_type": "session.resource.created"}
    assert history.rehydrate([resource, *stored], "zzz")[0]["role"] == "user"


def test_d24_a_user_message_stored_after_the_turn_s_own_is_not_in_its_history() -> None:
    """Two wakes posted close together: the first one's cold-cache turn reads the second
    back from the server, which has not forwarded it yet; it joins the history when it
    arrives, not twice. What came before the turn's message stays."""
    stored = [_user("go", "i1"), _user("wake 1", "i2"), _user("wake 2", "i3")]
    kept = history.undelivered_dropped(stored, {"i2"})
    assert history.texts(history.rehydrate(kept, None)) == ["go"]
    both = history.undelivered_dropped(stored, {"i2", "i3"})
    assert history.texts(history.rehydrate(both, None)) == ["go"]
    assert history.undelivered_dropped(stored, {"zzz"}) == stored  # D-26: not stored yet


def test_d23_tool_calls_and_outputs_come_back_as_omnigent_s_runner_gives_them() -> None:
    stored = [
        _user("go", "i1"),
        {"id": "i2", "type": "function_call", "call_id": "c1", "name": "sh", "arguments": "{}"},
        {"id": "i3", "type": "function_call_output", "call_id": "c1", "output": "ok"},
    ]
    assert history.rehydrate(stored, None)[1:] == [
        {"type": "function_call", "call_id": "c1", "name": "sh", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
    ]


def test_d33_a_turn_is_cached_as_the_server_saves_it() -> None:
    """Text, a call, its output, a whole message, text: the draft becomes a message before
    the call and at the end; a whole message replaces the deltas streamed for it; the call's
    action_required copy is not saved. An interrupted turn keeps what it saved, not its draft."""
    items: list = []
    draft: list[str] = []
    draft += ["Let me ", "look. "]
    call = {"type": "function_call", "call_id": "c1", "name": "sh", "arguments": "{}"}
    history.take_item(items, draft, {**call, "status": "action_required"})
    history.take_item(items, draft, {**call, "status": "completed", "agent": "a"})
    history.take_item(
        items, draft, {"type": "function_call_output", "call_id": "c1", "output": "ok"}
    )
    draft += ["Do", "ne"]
    whole = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "Done"}],
    }
    history.take_item(items, draft, whole)
    draft += ["tail"]
    assert history.texts(history.commit(items, draft, keep_draft=True)) == [
        "Let me look. ",
        "",
        "",
        "Done",
        "tail",
    ]
    assert [i["type"] for i in history.commit(items, draft, keep_draft=False)] == [
        "message",
        "function_call",
        "function_call_output",
        "message",
    ]
    assert history.commit(items, draft, keep_draft=True)[1] == call


def test_d28_items_are_normalised() -> None:
    item = history.user_item("plain text")
    assert item == {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "plain text"}],
    }
    assert history.assistant_item("done")["content"] == [{"type": "output_text", "text": "done"}]


async def test_d27_media_blocks_become_data_urls_and_file_ids_vanish() -> None:
    items = [
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "look"},
                {"type": "input_image", "file_id": "file_img", "filename": "photo.png"},
            ],
        }
    ]

    async def fetch(file_id: str) -> tuple[bytes, str]:
        assert file_id == "file_img"
        return b"\x89PNG", "image/png"

    resolved = await history.resolve_media(items, fetch)
    block = resolved[0]["content"][1]
    assert block["type"] == "input_image"
    assert block["image_url"] == "data:image/png;base64," + base64.b64encode(b"\x89PNG").decode()
    assert "file_id" not in msgspec.json.encode(resolved).decode()


def test_runner_tools_offer_the_runner_local_table_in_the_iv1_shape() -> None:
    from corral.actors.dispatch import runner_tools

    plain = {t["function"]["name"]: t for t in runner_tools({})}
    assert {"sys_os_read", "sys_os_write", "sys_os_edit", "sys_os_shell"} <= set(plain)
    assert not any(name.startswith("sys_terminal_") for name in plain), "P-27"
    assert "list_tasks" not in plain, "T-27"
    shell = plain["sys_os_shell"]
    assert shell["type"] == "function" and "type" not in shell["function"]
    assert shell["function"]["parameters"]["type"] == "object"
    with_terminals = {t["function"]["name"] for t in runner_tools({"terminals": {"sh": {}}})}
    assert "sys_terminal_launch" in with_terminals


def test_a_resumed_turn_knows_the_calls_it_has_in_flight() -> None:
    line = (
        b'{"id":"s","turn_id":"t1","tool_calls":["c1","c2","c3"],"answered":["c1","c3"],'
        b'"seq":7,"status":"running"}'
    )
    turn = Turn.resume(msgspec.json.decode(line, type=SessionRecord))
    assert turn.turn_id == "t1"
    assert turn.waiting == {"c2"}, "sent and not answered: the idle watchdog spares the turn"
    assert turn.answered == {"c1", "c3"}, "a redelivered outcome of these is dropped"
    assert not turn.spec_resolved, "the spec is fetched again before the next tool call"


def test_a_record_written_before_calls_were_recorded_still_resumes() -> None:
    old = b'{"id":"s","turn_id":"t1","buffer":[],"seq":3,"status":"running"}'
    record = msgspec.json.decode(old, type=SessionRecord)
    assert (record.tool_calls, record.answered) == ([], [])
    turn = Turn.resume(record)
    assert (turn.waiting, turn.answered) == (set(), set())


def test_a_resumed_turn_keeps_its_age_and_its_streaming_caller() -> None:
    """turn_timeout_s counts from the turn's real start, not from dispatch's restart; a
    ``?stream=true`` caller still gets the rest of the turn and its end."""
    import time

    started = time.time() - 100
    line = msgspec.json.encode(
        {
            "id": "s",
            "turn_id": "t1",
            "turn_started_at": started,
            "stream_to": ["gateway", "r1/req-7"],
            "status": "running",
        }
    )
    turn = Turn.resume(msgspec.json.decode(line, type=SessionRecord))
    assert 99 < time.monotonic() - turn.started < 110
    assert turn.stream_to == ("gateway", "r1/req-7")
    old = Turn.resume(SessionRecord(id="s", turn_id="t1"))
    assert time.monotonic() - old.started < 5, "a record without a start: counted from now"
    assert old.stream_to is None


def test_e4_a_resumed_turn_knows_it_was_interrupted() -> None:
    """The interrupt is in the record, so a restarted dispatch still ends the turn as an
    interruption (no terminal upstream, a note) when the worker's cancelled arrives."""
    record = SessionRecord(id="s", turn_id="t1")
    record.interrupted = True
    line = msgspec.json.encode(record)
    assert Turn.resume(msgspec.json.decode(line, type=SessionRecord)).interrupted
    record.end_turn()
    assert not record.interrupted, "the next turn starts uninterrupted"


@pytest.mark.parametrize(
    "body",
    [
        b'{"type":"cost_approval_popup","elicitation_id":"e1","message":"m","policy_name":"p"}',
        b'{"type":"policy_blocked_notice","message":"m","policy_name":"p"}',
        b'{"type":"clear"}',
        b'{"type":"effort_change","effort":"low","rollback_on_refusal":true}',
        b'{"type":"model_change","model":"m"}',
        b'{"type":"permission_mode_change","permission_mode":"plan"}',
        b'{"type":"plan_mode_change","enabled":false}',
        b'{"type":"codex_approval_mode_change","approval_mode":"never"}',
        b'{"type":"btw_dismiss"}',
        b'{"type":"external_session_status","data":{"status":"idle"}}',
    ],
)
def test_c3_control_events_decode_to_their_struct(body: bytes) -> None:
    event = parse_event(body)
    assert event.__struct_config__.tag == msgspec.json.decode(body)["type"]


def test_c3_control_events_are_decoded_strictly() -> None:
    with pytest.raises(BadEvent) as info:
        parse_event(b'{"type":"cost_approval_popup","elicitation_id":7}')
    assert (info.value.status, info.value.code) == (422, "invalid_event")
    assert str(info.value) == "Expected `str | null`, got `int` - at `$.elicitation_id`"


def test_e4_the_interrupt_note_is_a_user_message_with_omnigents_marker() -> None:
    note = history.interrupt_note()
    assert (note["type"], note["role"]) == ("message", "user")
    assert history.texts([note])[0].startswith("[System: interrupted]\n")
