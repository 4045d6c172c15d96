"""``sys_session_send`` through the real omnigent 0.19.1 server (#17, PROTOCOL_0_19.md §J): a
parent on corral hands work to its sub-agent, the server creates the child and binds it to
corral, the child's answer reaches the parent's inbox, and the server's wake starts the
parent's turn that drains it (S-02, S-04..S-06, S-14, S-15)."""

from __future__ import annotations

import json

import trio

from ._stack import Client


def _outputs(items: list[dict]) -> list[str]:
    return [i["output"] for i in items if i["type"] == "function_call_output"]


async def _drained(client: Client, parent: str) -> list[str]:
    """The parent's tool outputs once its woken turn has drained its inbox (§J step 7)."""
    with trio.fail_after(60):
        while len(outputs := _outputs(await client.items(parent))) < 2:
            await trio.sleep(0.1)  # polling the server: nothing to wait on
    return outputs


async def test_s14_a_parent_gets_its_child_s_answer_through_the_real_server(
    client: Client,
) -> None:
    parent = await client.session("delegator")
    stream = await client.open_stream(parent)
    _, end = await client.turn(stream, "go")
    assert stream.events[end]["status"] == "idle", stream.events[end]
    # S-04: the handle at once, launching; the child is the server's, bound to corral.
    with trio.fail_after(30):
        while not (outputs := _outputs(await client.items(parent))):
            await trio.sleep(0.05)  # polling the server: nothing to wait on
    handle = json.loads(outputs[0])
    assert (handle["status"], handle["kind"], handle["agent"], handle["title"]) == (
        "launching",
        "sub_agent",
        "child",
        "t1",
    )
    child = handle["conversation_id"]
    # S-05: the parent's viewers learn of the child (the server relays corral's events).
    _, launching = await stream.wait(
        lambda e: (
            e.get("type") == "session.child_session.updated"
            and e.get("child", {}).get("current_task_status") == "launching"
        )
    )
    assert launching["child_session_id"] == child
    # §J step 7: woken by the result, the parent drains it from its inbox.
    outputs = await _drained(client, parent)
    assert outputs[1] == (
        f"[System: sub-agent task {child} completed — child:t1 returned: w0 w1 w2 w3 w4]"
    )
    # §J step 6, S-22, S-23: the child's work mirrored on the parent's stream, busy then done.
    _, busy = await stream.wait(
        lambda e: e.get("type") == "session.child_session.updated" and e["child"].get("busy")
    )
    assert busy["child"]["current_task_status"] == "in_progress"
    assert busy["child"]["last_task_error"] is None
    _, done = await stream.wait(
        lambda e: (
            e.get("type") == "session.child_session.updated"
            and e["child"].get("current_task_status") == "completed"
        )
    )
    assert (done["child"]["busy"], done["child"]["last_message_preview"]) == (
        False,
        "w0 w1 w2 w3 w4",
    )
    # §J step 8: the server lists the child under the parent, with its sub-agent and label.
    page = (await client.http.get(f"/v1/sessions/{parent}/child_sessions")).json()
    (row,) = page["data"]
    assert (row["id"], row["title"], row["tool"], row["session_name"]) == (
        child,
        "child:t1",
        "child",
        "t1",
    )
    assert row["labels"]["omnigent.subagent.dispatch_id"].startswith("subagent_")
    child_items = await client.items(child)
    texts = [
        c.get("text")
        for i in child_items
        if i["type"] == "message" and i["role"] == "assistant"
        for c in i["content"]
    ]
    assert texts == ["w0 w1 w2 w3 w4"]


async def test_p01_p02_the_parent_s_policy_withholds_its_child_s_answer(client: Client) -> None:
    """The server's tool-result policy sees the child's answer when the parent drains it, and
    its DENY replaces it (the body corral sends is one the real server evaluates)."""
    parent = await client.session("guardeddelegator")
    stream = await client.open_stream(parent)
    await client.turn(stream, "go")
    outputs = await _drained(client, parent)
    child = json.loads(outputs[0])["conversation_id"]
    assert outputs[1] == (
        f"[System: sub-agent task {child} completed — child:t1 returned: "
        "[Result suppressed by policy: interop: sub-agent output withheld]]"
    )


async def test_s14_two_children_at_once_each_answer_reaches_the_parent_once(
    client: Client,
) -> None:
    """The parent gives two children work in one turn; both work at once, and each answer is
    drained from the parent's inbox exactly once, whichever wake drains it."""
    parent = await client.session("fanout")
    stream = await client.open_stream(parent)
    _, end = await client.turn(stream, "go")
    assert stream.events[end]["status"] == "idle", stream.events[end]
    handles = [json.loads(o) for o in _outputs(await client.items(parent))[:2]]
    titles = [(h["title"], h["status"]) for h in handles]
    assert titles == [("t1", "launching"), ("t2", "launching")]
    children = {h["conversation_id"] for h in handles}
    assert len(children) == 2
    with trio.fail_after(60):
        while True:
            drains = _outputs(await client.items(parent))[2:]
            joined = "\n".join(drains)
            if all(f"sub-agent task {c} completed" in joined for c in children):
                break
            await trio.sleep(0.1)  # polling the server: nothing to wait on
    for child in children:
        assert joined.count(f"sub-agent task {child} completed") == 1, drains


async def test_a_child_s_approval_is_answered_from_the_parent_s_stream(client: Client) -> None:
    """The child's tool call waits on a person; the server mirrors its prompt onto the
    parent's stream (``params.target_session_id`` = the child), the parent's viewer answers
    it at the child, the child's command runs and its answer reaches the parent."""
    parent = await client.session("asksub")
    stream = await client.open_stream(parent)
    await client.turn(stream, "go")
    _, ask = await stream.wait(lambda e: e.get("type") == "response.elicitation_request")
    child = ask["params"]["target_session_id"]
    assert child != parent
    r = await client.resolve(child, ask["elicitation_id"], "accept")
    assert r.status_code < 300, r.text
    outputs = await _drained(client, parent)
    assert f"sub-agent task {child} completed" in outputs[1]
    assert "hello-from-tool" in outputs[1]


async def test_s51_the_real_server_takes_a_runner_s_cancel_of_a_running_child(
    client: Client,
) -> None:
    """``sys_cancel_task`` on a child that is still working: corral interrupts it through the
    real server (a control event the runner posts to the child), the child's turn ends
    cancelled, and that — never its answer — reaches the parent's inbox once."""
    parent = await client.session("canceller")
    stream = await client.open_stream(parent)
    send = {"agent": "child", "title": "c1", "args": "take your time"}
    await client.turn(stream, json.dumps({"tool": "sys_session_send", "arguments": send}))
    handle = json.loads(_outputs(await client.items(parent))[0])
    child = handle["conversation_id"]
    child_stream = await client.open_stream(child)
    await child_stream.wait(lambda e: e.get("type") == "response.output_text.delta")
    cancel = {"tool": "sys_cancel_task", "arguments": {"task_id": child}}
    await client.turn(stream, json.dumps(cancel))
    asked = json.loads(_outputs(await client.items(parent))[1])
    assert asked["cancel_requested"] is True and asked["task_id"] == child, asked
    # The server shows the child's interrupted turn as its own event, then the idle edge.
    await child_stream.wait(lambda e: e.get("type") == "session.interrupted", timeout=30)
    with trio.fail_after(60):
        while len(outputs := _outputs(await client.items(parent))) < 3:
            await trio.sleep(0.1)  # polling the server: nothing to wait on
    assert outputs[2] == f"[System: sub-agent task {child} cancelled — child:c1]"
    assert "s39" not in "".join(outputs)
