"""The server's file browser over corral's workspace (PROTOCOL_0_19.md §H, #13).

The client asks the server; the server proxies to the runner and reads its error bodies as
``{"error": {"code", "message"}}`` — a string ``error`` crashed its proxy (client 500).
"""

from __future__ import annotations

from ._stack import Client

ENV = "resources/environments/default"


async def _get(client: Client, session: str, path: str, **params: object):
    return await client.http.get(f"/v1/sessions/{session}/{path}", params=params)


async def test_the_default_environment_is_listed_and_described(client: Client, stack) -> None:
    session = await client.session("tool")
    r = await _get(client, session, "resources/environments")
    assert r.status_code == 200, r.text
    assert [e["id"] for e in r.json()["data"]] == ["default"]
    r = await _get(client, session, ENV)
    assert r.status_code == 200, r.text
    env = r.json()
    assert (env["id"], env["type"]) == ("default", "environment")
    assert env["metadata"]["root"] == str(stack.workspace)


async def test_an_agent_without_os_env_still_lists_default(client: Client) -> None:
    session = await client.session("plain")
    r = await _get(client, session, "resources/environments")
    assert r.status_code == 200, r.text
    assert [e["id"] for e in r.json()["data"]] == ["default"]


async def test_list_read_and_search_the_workspace(client: Client) -> None:
    session = await client.session("tool")
    r = await _get(client, session, f"{ENV}/filesystem/.")
    assert r.status_code == 200, r.text
    assert "hello.txt" in [e["name"] for e in r.json()["data"]]
    r = await _get(client, session, f"{ENV}/filesystem/hello.txt")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["content"] == "hello from the workspace file\n"
    assert body["encoding"] == "utf-8" and body["truncated"] is False
    r = await _get(client, session, f"{ENV}/search", q="hello")
    assert r.status_code == 200, r.text
    assert any(e["name"] == "hello.txt" for e in r.json()["data"])
    r = await _get(client, session, f"{ENV}/changes")
    assert r.status_code == 200, r.text
    assert r.json()["object"] == "list"


async def test_a_missing_file_is_a_404_not_a_server_crash(client: Client) -> None:
    session = await client.session("tool")
    r = await _get(client, session, f"{ENV}/filesystem/no-such-file.txt")
    assert r.status_code == 404, r.text
    r = await _get(client, session, f"{ENV}/filesystem/..%2F..%2Fetc%2Fpasswd")
    assert 400 <= r.status_code < 500, r.text
    # The connection survives: the next request on it is answered.
    r = await _get(client, session, "resources/environments")
    assert r.status_code == 200


async def test_the_shell_route_runs_in_the_workspace(client: Client, stack) -> None:
    session = await client.session("tool")
    r = await client.http.post(
        f"/v1/sessions/{session}/{ENV}/shell", json={"command": "cat hello.txt; pwd"}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["exit_code"] == 0
    assert body["stdout"] == f"hello from the workspace file\n{stack.workspace}\n"


async def test_a_failing_mutation_answers_the_server_s_error_shape(client: Client) -> None:
    """Non-GET routes are where a string ``error`` crashed the server's proxy into a client
    500 and reset the connection (§H.2); corral's 4xx with ``error.message`` reaches the
    client as the same status."""
    session = await client.session("tool")
    r = await client.http.patch(
        f"/v1/sessions/{session}/{ENV}/filesystem/hello.txt",
        json={"old_text": "text that is not in the file", "new_text": "x"},
    )
    assert 400 <= r.status_code < 500, r.text
    r = await client.http.put(
        f"/v1/sessions/{session}/{ENV}/filesystem/new/deep/file.txt",
        json={"content": "made through the server", "create_parents": True},
    )
    assert r.status_code < 300, r.text
    r = await _get(client, session, f"{ENV}/filesystem/new/deep/file.txt")
    assert r.json()["content"] == "made through the server"
