"""The Codex app-server client (harnesses/codex/_rpc.py) against a stand-in app-server: a
small Python program on the other end of real pipes, so bad input and an unknown server
request can be sent on purpose (the real CLI never sends them; tests/integration has it)."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from corral.harnesses._cli_process import CliExited, open_cli
from corral.harnesses.codex._harness import INITIALIZE
from corral.harnesses.codex._relay import Relay, Usage
from corral.harnesses.codex._rpc import (
    METHOD_NOT_FOUND,
    AppServer,
    Notification,
    ProtocolError,
    RpcFailed,
    ServerRequest,
    ThreadOpened,
    result_as,
)

#: Answers ``probe`` by asking something of its own first and answering with what it got.
_STAND_IN = textwrap.dedent(
    """
    import json, sys

    def send(obj):
        print(json.dumps(obj), flush=True)

    pending = {}
    for line in sys.stdin:
        msg = json.loads(line)
        method = msg.get("method")
        if method == "initialize":
            send({"id": msg["id"], "result": {"userAgent": "stand-in"}})
        elif method == "refuse":
            send({"id": msg["id"], "error": {"code": -32600, "message": "no such thing"}})
        elif method == "probe":
            send("not an object")
            send({"id": "x", "result": 1})
            send({"method": "item/agentMessage/delta", "params": {"itemId": 3}})
            send({"id": 99, "method": msg["params"]["ask"], "params": {}})
            pending[99] = msg["id"]
        elif method == "exit":
            sys.exit(3)
        elif "id" in msg and msg["id"] in pending:
            send({"id": pending.pop(msg["id"]), "result": msg})
            send({"method": "answered", "params": msg})
    """
)


class _Ask(msgspec.Struct):
    """The stand-in's ``probe``: the server request to send back first."""

    ask: str


#: Every wait of these tests: a refusal that never comes fails the test, not hangs it.
DEADLINE_S = 10


async def _serve(tmp_path: Path) -> Any:
    script = tmp_path / "app_server.py"
    script.write_text(_STAND_IN)
    return open_cli([sys.executable, str(script)], env=dict(os.environ), cwd=tmp_path)


async def test_requests_get_their_results_and_an_error_is_a_typed_failure(tmp_path: Path) -> None:
    async with await _serve(tmp_path) as cli, trio.open_nursery() as nursery:
        server = AppServer(cli)
        nursery.start_soon(server.read)
        info = INITIALIZE
        assert await server.request("initialize", info) == {"userAgent": "stand-in"}
        with pytest.raises(RpcFailed, match=r"^codex app-server refused refuse: no such thing"):
            await server.request("refuse", info)
        nursery.cancel_scope.cancel()


async def test_a_server_request_with_no_turn_listening_is_refused_at_once(tmp_path: Path) -> None:
    """Bad lines and an unexpected answer are skipped; the server request is answered with
    a JSON-RPC error, so the app-server never waits on it."""
    async with await _serve(tmp_path) as cli, trio.open_nursery() as nursery:
        server = AppServer(cli)
        nursery.start_soon(server.read)
        with trio.fail_after(DEADLINE_S):
            answer = await server.request("probe", _Ask(ask="item/tool/call"))
        assert answer["id"] == 99
        assert answer["error"]["code"] == METHOD_NOT_FOUND
        nursery.cancel_scope.cancel()


async def test_an_unknown_server_request_during_a_turn_is_refused_and_the_turn_goes_on(
    tmp_path: Path,
) -> None:
    async with await _serve(tmp_path) as cli, trio.open_nursery() as nursery:
        server = AppServer(cli)
        nursery.start_soon(server.read)
        with server.listen() as events:
            relay = Relay(
                _StubTurn(),  # type: ignore[arg-type]
                server,
                served="m",
                provider="p",
                usage=Usage(),
                idle_timeout_s=10,
            )
            nursery.start_soon(server.request, "probe", _Ask(ask="mystery/ask"))
            seen: list[Notification | ServerRequest] = []
            with trio.fail_after(DEADLINE_S):
                async for message in events:
                    seen.append(message)
                    if isinstance(message, ServerRequest):
                        await relay._answer(message)
                    elif message.method == "answered":
                        break
        assert [type(m).__name__ for m in seen] == ["Notification", "ServerRequest", "Notification"]
        # The malformed delta is the relay's to skip (typed, with msgspec's path).
        with pytest.raises(ProtocolError, match=r"\$\.itemId"):
            await relay._on(seen[0])  # type: ignore[arg-type]
        answered = seen[-1].params
        assert answered["error"]["code"] == METHOD_NOT_FOUND
        assert "mystery/ask" in answered["error"]["message"]
        nursery.cancel_scope.cancel()


async def test_the_cli_ending_wakes_a_waiting_request_and_ends_the_listener(
    tmp_path: Path,
) -> None:
    async with await _serve(tmp_path) as cli, trio.open_nursery() as nursery:
        server = AppServer(cli)

        async def read() -> None:
            with pytest.raises(CliExited):
                await server.read()

        nursery.start_soon(read)
        with server.listen() as events:
            with pytest.raises(CliExited, match="exit code 3"), trio.fail_after(DEADLINE_S):
                await server.request("exit", _Ask(ask=""))
            assert [m async for m in events] == []
        with pytest.raises(CliExited):
            await server.request("initialize", _Ask(ask=""))


def test_a_result_of_the_wrong_shape_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match=r"^the result of thread/start: .*\$\.thread"):
        result_as({"thread": "no", "model": "m"}, ThreadOpened, "thread/start")


class _StubTurn:
    """What the relay touches of a turn before any output: nothing but ``serve``."""

    def serve(self, model: str | None, provider: str | None) -> None:
        pass
