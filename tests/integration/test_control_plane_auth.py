"""The control plane's client credential (issue #16): every route needs one, on loopback too.

A real ``corral up`` host with its embedded control plane on 127.0.0.1, probed over HTTP by
its route table (not a hand-picked few), by the real CLI, and by another uid (``nobody``,
through ``setpriv`` or ``su``). The host's state dir lives in a world-traversable directory
and is opened up to 0755 itself, so what keeps another user out is corral's own file modes,
not pytest's private temporary directory. Secrets never reach a log line or an error body
(D-13..D-15).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import trio
from starlette.routing import Route
from trio_websocket import ConnectionClosed, open_websocket_url

from corral.server._http import build_app
from tests.conftest import FAST_LIVENESS, HostProcess, corral, plain_up
from tests.integration.test_e2e import _start, _stop

S = "/v1/sessions/{session_id}"
#: Every route of the plane and who may call it; the route table must match it exactly.
ACCESS: dict[tuple[str, str], str] = {
    ("GET", "/api/version"): "open",
    ("GET", "/healthz"): "any",
    # The runner's session tools list agents and sessions too (T-26).
    ("GET", "/v1/agents"): "any",
    ("POST", "/v1/runners/{runner_id}/token"): "runner",
    ("GET", "/v1/runners/{runner_id}/status"): "any",
    ("GET", "/v1/sessions"): "any",
    # Narrowed by the body: a client's session, the runner's child session (sys_session_create,
    # sys_session_send: PROTOCOL_0_19 §J).
    ("POST", "/v1/sessions"): "any",
    ("GET", S): "any",
    ("PATCH", S): "runner",
    ("DELETE", S): "client",
    ("GET", f"{S}/agent"): "any",
    ("GET", f"{S}/agent/contents"): "runner",
    ("GET", f"{S}/child_sessions"): "any",
    ("GET", f"{S}/items"): "any",
    ("GET", f"{S}/labels"): "any",
    ("POST", f"{S}/policies/evaluate"): "runner",
    ("POST", f"{S}/mcp"): "runner",
    # Narrowed by the event's type: the runner's item, a client's verdicts and controls
    # (below; the runner's control only to a child session); a message is either's (a
    # sub-agent's work, a parent's wake, §J).
    ("POST", f"{S}/events"): "any",
    # sys_session_share's grants.
    ("GET", f"{S}/permissions"): "any",
    ("PUT", f"{S}/permissions"): "any",
    ("POST", f"{S}/elicitations/{{elicitation_id}}/resolve"): "client",
    ("GET", f"{S}/stream"): "client",
}
RUNNER_HEADER = "x-omnigent-runner-tunnel-token"
#: A wrong credential that looks like a real one: it must not be echoed anywhere either.
WRONG = "wrongAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"


def _route_table() -> list[tuple[str, str]]:
    """(method, path) of every HTTP route the app serves (only the table is read)."""
    app = build_app(SimpleNamespace(options=None))  # type: ignore[arg-type]
    return sorted(
        (method, route.path)
        for route in app.routes
        if isinstance(route, Route)
        for method in (route.methods or set()) - {"HEAD"}
    )


@pytest.fixture(scope="module")
def auth_host() -> Iterator[HostProcess]:
    """One host for the module; its state dir is opened to 0755 (server/ stays 0700)."""
    base = Path(tempfile.mkdtemp(prefix="corral-auth-"))
    base.chmod(0o755)
    host = HostProcess(base / "state", FAST_LIVENESS + "[server]\n")
    try:
        _start(host)
        host.state_dir.chmod(0o755)
        yield host
    finally:
        _stop(host)
        shutil.rmtree(base, ignore_errors=True)


def _http(info: dict[str, Any]) -> httpx.Client:
    """A client of the plane opening a connection per request: a kept-alive one that the
    server closes after its idle timeout (a loaded machine can pause that long) would fail a
    request that has nothing to do with credentials."""
    limits = httpx.Limits(max_keepalive_connections=0)
    return httpx.Client(base_url=info["url"], timeout=10, limits=limits)


def _info(host: HostProcess) -> dict[str, Any]:
    return json.loads((host.state_dir / "server" / "server.json").read_text())


def _client_token(host: HostProcess) -> str:
    return (host.state_dir / "server" / "client_token").read_text().strip()


def _fill(path: str, session_id: str, runner_id: str) -> str:
    return path.format(session_id=session_id, runner_id=runner_id, elicitation_id="elicit_x")


def _body(method: str, path: str, side: str) -> dict[str, Any] | None:
    """A body each route would take; for events, one of ``side``'s own event types."""
    if method not in ("POST", "PATCH"):
        return None
    if path.endswith("/events"):
        if side == "runner":
            return {"type": "external_conversation_item", "data": {"source_id": "x"}}
        return {"type": "interrupt"}
    return {"agent": "demo", "action": "accept", "event": {"type": "PHASE_TOOL_CALL"}}


def test_every_route_refuses_no_credential_a_wrong_one_and_the_other_sides(
    auth_host: HostProcess,
) -> None:
    routes = _route_table()
    assert set(routes) == set(ACCESS), "a route without an access rule here, or one gone"
    info = _info(auth_host)
    client, runner = _client_token(auth_host), info["runner_token"]
    assert client != runner
    as_client = {"authorization": f"Bearer {client}"}
    as_runner = {RUNNER_HEADER: runner, "origin": "omnigent://internal"}
    with _http(info) as http:
        sid = http.post("/v1/sessions", json={"agent": "demo"}, headers=as_client).json()["id"]
        refusals: list[httpx.Response] = []
        for method, template in routes:
            path = _fill(template, sid, info["runner_id"])
            access = ACCESS[(method, template)]
            if access == "open":
                assert http.request(method, path).status_code == 200
                continue
            # (what, headers, whose body): each must be refused.
            attempts = [
                ("none", {}, "client"),
                ("a wrong bearer", {"authorization": f"Bearer {WRONG}"}, "client"),
                ("a wrong runner token", {RUNNER_HEADER: WRONG}, "runner"),
                ("the runner token as bearer", {"authorization": f"Bearer {runner}"}, "client"),
            ]
            if access == "client" or template.endswith("/events"):
                attempts.append(("the runner's header on a client's call", as_runner, "client"))
            if access == "runner" or template.endswith("/events"):
                attempts.append(("the client token on the runner's call", as_client, "runner"))
            for what, headers, side in attempts:
                body = _body(method, path, side)
                answer = http.request(method, path, json=body, headers=headers)
                assert answer.status_code == 401, (method, template, what, answer.text)
                assert answer.json()["error"] == "unauthorized"
                assert answer.headers["www-authenticate"].startswith("Bearer")
                refusals.append(answer)
        # The right credential passes (the GETs: they change nothing).
        for method, template in routes:
            access = ACCESS[(method, template)]
            if method != "GET" or template.endswith("/stream") or access == "open":
                continue
            headers = as_runner if access == "runner" else as_client
            answer = http.get(_fill(template, sid, info["runner_id"]), headers=headers)
            assert answer.status_code == 200, (template, answer.text)
    for answer in refusals:
        for secret in (client, runner, WRONG):
            assert secret not in answer.text


async def test_the_client_token_cannot_open_the_runner_tunnel(auth_host: HostProcess) -> None:
    info = _info(auth_host)
    url = info["url"].replace("http://", "ws://") + f"/v1/runners/{info['runner_id']}/tunnel"
    headers = [
        (b"origin", b"omnigent://internal"),
        (RUNNER_HEADER.encode(), _client_token(auth_host).encode()),
    ]
    with trio.fail_after(10):
        async with open_websocket_url(url, extra_headers=headers) as ws:
            with pytest.raises(ConnectionClosed) as closed:
                await ws.get_message()
    reason = closed.value.reason
    assert reason is not None
    assert (reason.code, reason.reason) == (4004, "unauthenticated")


def test_the_token_file_is_the_owners_alone(auth_host: HostProcess) -> None:
    server = auth_host.state_dir / "server"
    assert stat.S_IMODE(os.stat(server).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(server / "client_token").st_mode) == 0o600
    assert os.stat(server / "client_token").st_uid == os.getuid()
    assert len(_client_token(auth_host)) >= 40


def _as_nobody() -> list[str]:
    """A command prefix that runs a shell as ``nobody`` (we are root in this sandbox)."""
    if os.getuid() != 0:
        pytest.skip("switching to another uid needs root")
    if shutil.which("curl") is None:
        pytest.skip("no curl to make the other user's requests with")
    if shutil.which("setpriv"):
        return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "sh", "-c"]
    if shutil.which("su"):
        return ["su", "nobody", "-s", "/bin/sh", "-c"]
    pytest.skip("neither setpriv nor su is here to run a request as nobody")


def test_another_uid_gets_401_from_every_route_and_cannot_read_the_token(
    auth_host: HostProcess,
) -> None:
    prefix = _as_nobody()
    info = _info(auth_host)
    token_file = auth_host.state_dir / "server" / "client_token"
    with _http(info) as http:
        auth = auth_host.client_headers()
        sid = http.post("/v1/sessions", json={"agent": "demo"}, headers=auth).json()["id"]
    lines = []
    probed = [(m, t) for m, t in _route_table() if ACCESS[(m, t)] != "open"]
    for method, template in probed:
        url = info["url"] + _fill(template, sid, info["runner_id"])
        body = json.dumps(_body(method, template, "client") or {})
        for header in ("", f"-H 'authorization: Bearer {WRONG}'"):
            lines.append(
                f"curl -s -o /dev/null -w '%{{http_code}}\\n' -X {method} {header} "
                f"-H 'content-type: application/json' -d '{body}' '{url}'"
            )
    script = "\n".join(
        [
            f"id -u; cat '{token_file}' 2>/dev/null && echo READ-TOKEN",
            f"cat '{auth_host.state_dir / 'server' / 'server.json'}' 2>/dev/null && echo READ",
            *lines,
        ]
    )
    done = subprocess.run([*prefix, script], capture_output=True, text=True, timeout=60)
    out = done.stdout.split()
    assert out[0] == "65534", done
    assert "READ-TOKEN" not in out and "READ" not in out, "nobody read the state"
    assert out[1:] == ["401"] * len(lines), list(zip(lines, out[1:], strict=False))
    assert auth_host.state_dir.stat().st_mode & 0o005, "the state dir itself was open"


def test_the_cli_sends_the_token_and_says_clearly_when_it_has_none(
    auth_host: HostProcess, tmp_path: Path
) -> None:
    state = str(auth_host.state_dir)
    token, url = _client_token(auth_host), _info(auth_host)["url"]
    agents = corral("agents", "--json", "--state-dir", state)
    assert agents.returncode == 0, agents.stderr
    assert "demo" in [a["name"] for a in json.loads(agents.stdout)["agents"]]
    # From elsewhere (a state dir this user cannot read): the URL and CORRAL_TOKEN.
    elsewhere = ["--state-dir", str(tmp_path / "nothing-here"), "--url", url]
    ok = corral("agents", "--json", *elsewhere, env={"CORRAL_TOKEN": token})
    assert ok.returncode == 0, ok.stderr
    # No token anywhere: exit 1, a typed error, one JSON document.
    none = corral("agents", "--json", *elsewhere, env={"CORRAL_TOKEN": ""})
    assert none.returncode == 1, none.stderr
    assert json.loads(none.stdout)["error"]["code"] == "no_credential"
    assert "CORRAL_TOKEN" in none.stderr and "Traceback" not in none.stderr
    # A wrong one: refused, said so, the send document's shape kept.
    wrong = corral("send", "hi", "--json", *elsewhere, env={"CORRAL_TOKEN": WRONG})
    assert wrong.returncode == 1, wrong.stderr
    doc = json.loads(wrong.stdout)
    assert (doc["status"], doc["error"]["code"], doc["events"]) == ("failed", "unauthorized", [])
    assert WRONG not in wrong.stdout + wrong.stderr
    printed = corral("token", "--json", "--state-dir", state)
    assert printed.returncode == 0
    assert json.loads(printed.stdout) == {
        "token": token,
        "path": str(auth_host.state_dir / "server" / "client_token"),
    }


def test_rotate_refuses_the_old_token_at_once_and_the_host_keeps_serving(
    auth_host: HostProcess,
) -> None:
    state = str(auth_host.state_dir)
    info = _info(auth_host)
    old = corral("token", "--state-dir", state).stdout.strip()
    assert old == _client_token(auth_host)
    with _http(info) as http:
        auth = {"authorization": f"Bearer {old}"}
        sid = http.post("/v1/sessions", json={"agent": "demo"}, headers=auth).json()["id"]
        # Silence past the read timeout (10 s, less than the plane's 15 s keepalive) fails.
        path = f"/v1/sessions/{sid}/stream"
        with http.stream("GET", path, headers=auth, timeout=10) as stream:
            assert stream.status_code == 200
            rotated = corral("token", "rotate", "--json", "--state-dir", state)
            assert rotated.returncode == 0, rotated.stderr
            new = json.loads(rotated.stdout)["token"]
            assert new != old and new == _client_token(auth_host)
            refused = http.get("/v1/agents", headers=auth)
            assert refused.status_code == 401
            # The stream opened with the old token ends (the refusal woke it).
            for _ in stream.iter_raw():
                pass
        assert http.get("/v1/agents", headers={"authorization": f"Bearer {new}"}).is_success
    assert stat.S_IMODE(os.stat(auth_host.state_dir / "server" / "client_token").st_mode) == 0o600
    plane = auth_host.status()["server"]
    assert (plane["pid"], plane["state"], plane["restarts"]) == (info["pid"], "running", 0)
    again = corral("agents", "--json", "--state-dir", state)  # reads the new file
    assert again.returncode == 0, again.stderr
    log = auth_host.log()
    for secret in (old, new, info["runner_token"], WRONG):
        assert secret not in log, "a credential in the host's log"


def test_a_fresh_config_asks_before_any_sys_os_tool_runs(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with plain_up(state):
        config = (state / "corral.toml").read_text()
        assert 'tool = "sys_os_*"' in config and 'action = "ask"' in config
        assert stat.S_IMODE(os.stat(state / "corral.toml").st_mode) == 0o600
        # It logs to <state dir>/corral.log too, which `corral logs` finds with no flag.
        logged = corral("logs", "--actor", "host", "--state-dir", str(state))
        assert "corral host up" in logged.stdout, logged
        assert (state / "corral.log").exists()
        sent = corral("send", "--agent", "demo", "hi", "--json", "--state-dir", str(state))
        doc = json.loads(sent.stdout)
        asked = [e for e in doc["events"] if e["type"] == "response.elicitation_request"]
        assert asked[0]["params"]["message"] == (
            "The agent wants to use this machine's shell or files. OK?"
        ), "the first prompt is not the fresh config's rule"
        [output] = [
            e["item"]["output"]
            for e in doc["events"]
            if e.get("item", {}).get("type") == "function_call_output"
        ]
        # send declines by default: the shell never ran.
        assert json.loads(output) == {"error": "The user declined this tool call."}
