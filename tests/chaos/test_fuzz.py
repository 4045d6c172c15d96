"""Hypothesis-driven fuzzing of a real host at its boundaries (issue #15, item 7).

What a server, an agent author or a user can hand corral, generated: tunnel frames (any text,
frames of every kind with fields of any type, requests to any path), session-event bodies
(at the runner's tunnel and at the control plane's client API),
agent specs (scripted scripts with steps of any shape, executors of any harness), tool
arguments (every runner tool, and names of none), and CLI input (every inspecting verb with
any options). The host is the one of ``test_bad_input.py``: the gateway tunnelled to the fake
tunnel server, dispatch fetching specs from the fake omnigent server; the control plane the
one of ``test_control_plane_bad_input.py``, with its fake runner. For each input: an
answer within its deadline (no hang), never a 5xx (a request's refusal is a typed 4xx
``{"error": {"code", "message"}}``), a turn that starts ends with exactly one terminal edge,
and no actor restarts; the CLI exits with a usage or typed error, never a traceback.

``CORRAL_FUZZ_EXAMPLES`` sets the examples per test (default 25; docs/benchmarks.md records a
run of 1,000).
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

import pytest
import trio
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.cli import cli
from tests.conftest import FAST_LIVENESS, HostProcess
from tests.fake_tunnel_server import FakeTunnelServer, Tunnel
from tests.integration import test_control_plane_bad_input
from tests.integration._gateway import scripted_yaml
from tests.integration.test_control_plane import bound, make_settings
from tests.integration.test_control_plane import running as plane_running
from tests.integration.test_gateway import bind, host_config, message, running

#: The fixture of the control plane's bad-input tests (an agents dir with one agent), shared
#: rather than copied (the fake tunnel server is the ``tunnels`` of tests/conftest.py).
agents_dir = test_control_plane_bad_input.agents_dir

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.timeout(600)]

EXAMPLES = int(os.environ.get("CORRAL_FUZZ_EXAMPLES", "25"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=os.environ.get("CORRAL_FUZZ_RANDOM") is None,
    suppress_health_check=list(HealthCheck),
)
RUNNER = "fuzz"

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)


def with_fields(required: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """A mapping with ``required`` keys (values from their strategies) and junk ones."""
    return st.builds(
        lambda fixed, extra: {**extra, **fixed},
        st.fixed_dictionaries(required),
        st.dictionaries(st.text(max_size=10), json_values, max_size=3),
    )


# --- the tunnel: frames and session-event bodies -------------------------------------------------

FRAME_KINDS = ["request", "ping", "pong", "hello", "request.cancel", "event.ack", "ack", "ws.open"]
METHODS = st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH"]) | st.text(max_size=8)


def paths(sid: str) -> st.SearchStrategy[str]:
    """Request paths; never a session's ``/stream``, whose answer has no end to wait for."""
    return (
        st.sampled_from(
            [
                f"/v1/sessions/{sid}/events",
                f"/v1/sessions/{sid}",
                "/v1/sessions",
                f"/v1/sessions/{sid}/elicitations/e1/resolve",
                "/v1/nothing",
            ]
        )
        | st.text(max_size=40).map(lambda p: "/" + p)
    ).filter(lambda p: not p.rstrip("/").endswith("/stream"))


class Raw(bytes):
    """A request body sent as these bytes, not encoded as JSON."""


def raw_bodies(wrap: Callable[[bytes], bytes]) -> st.SearchStrategy[Raw]:
    """Bodies no JSON encoder makes: any bytes, ``content`` nested up to 200,000 deep, text
    with lone surrogate escapes, NULs and broken escapes. ``wrap`` puts a ``content`` value
    into a message of the receiver's shape."""
    pieces = st.sampled_from(
        [r"\ud800", r"\udfff", r"\ud83d\ude00", r"\u0000", "x", "\\", '"', "\\q"]
    )
    text = st.lists(pieces, max_size=5).map(
        lambda ps: b'[{"type": "input_text", "text": "' + "".join(ps).encode() + b'"}]'
    )
    # The depths at the limit (128) and those that break recursive parsers, more often than
    # integers alone would draw them.
    depths = st.sampled_from([127, 128, 129, 1_000, 10_000, 200_000]) | st.integers(1, 200_000)
    nested = depths.map(lambda n: b"[" * n + b"]" * n)
    return st.one_of(st.binary(max_size=200), text.map(wrap), nested.map(wrap)).map(Raw)


def runner_message(content: bytes) -> bytes:
    return b'{"type": "message", "role": "user", "content": ' + content + b"}"


def plane_message(content: bytes) -> bytes:
    return b'{"type": "message", "data": {"content": ' + content + b"}}"


def event_bodies() -> st.SearchStrategy[Any]:
    kinds = st.sampled_from(["message", "approval", "interrupt", "stop_session", "compact"])
    return (
        with_fields({"type": kinds | st.text(max_size=12), "content": json_values})
        | with_fields({"type": st.just("approval"), "data": json_values})
        | with_fields(
            {
                "type": st.just("message"),
                "role": st.sampled_from(["user", "assistant", "system"]) | st.text(max_size=6),
                "content": st.lists(
                    with_fields(
                        {"type": st.sampled_from(["input_text", "message"]), "text": json_values}
                    ),
                    max_size=3,
                ),
            }
        )
        | json_values
        | raw_bodies(runner_message)
    )


def frames(sid: str) -> st.SearchStrategy[tuple[str, Any]]:
    """``("raw", text)`` frames that may not even be JSON, or ``("request", (method, path,
    body))`` requests that must be answered."""
    raw = (
        st.text(max_size=200)
        | json_values.map(json.dumps)
        | with_fields({"kind": st.sampled_from(FRAME_KINDS) | st.text(max_size=10)}).map(json.dumps)
        | with_fields(
            {
                "kind": st.just("request"),
                "id": json_values,
                "method": json_values,
                "path": json_values,
                "headers": json_values,
                "body": json_values,
            }
        ).map(json.dumps)
    )
    requests = st.tuples(METHODS, paths(sid), st.none() | json_values | event_bodies())
    return st.tuples(st.just("raw"), raw) | st.tuples(st.just("request"), requests)


def fuzz_host_config(tunnels: FakeTunnelServer, server: Any, extra: str = "") -> str:
    """test_gateway's host config with the default liveness: an actor restart here must be
    the input's doing, not a loaded VM missing the tests' 0.6 s heartbeat window."""
    text = host_config(tunnels, [{"id": RUNNER}], server=server)
    return text.replace(FAST_LIVENESS, "") + extra


def restarts(host: HostProcess) -> dict[str, int]:
    return {a["name"]: a["restarts"] for a in host.status()["actors"] if a["restarts"]}


JSON_TYPE = {"content-type": "application/json"}


def shown(body: Any) -> str:
    """A body for a failure's message, cut short (a nested one is 400,000 bytes)."""
    return repr(bytes(body)[:200]) if isinstance(body, Raw) else json.dumps(body)[:200]


def typed_refusal(status: int | None, body: bytes) -> str | None:
    """Why an answer breaks the rule (None: a 2xx/3xx, or a 4xx with a typed error)."""
    if status is None or status >= 500:
        return f"status {status}: {body[:300]!r}"
    if status < 400:
        return None
    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return f"{status} without a typed error: {body[:300]!r}"
    if not (isinstance(error, dict) and error.get("code") and error.get("message")):
        return f"{status} without a typed error: {body[:300]!r}"
    return None


def fuzz_in_thread(
    strategy: st.SearchStrategy[Any], example: Callable[[Any], Awaitable[None]]
) -> Any:
    """Run hypothesis over ``strategy`` in a worker thread, each example's ``example`` back in
    the test's trio loop (hypothesis drives sync functions; the host's ends are async)."""

    @FUZZ
    @given(strategy)
    def each(value: Any) -> None:
        trio.from_thread.run(example, value)

    return trio.to_thread.run_sync(each)


async def live_tunnel(
    tunnels: FakeTunnelServer, sid: str, agent_id: str, old: Tunnel | None
) -> Tunnel:
    """The runner's tunnel: ``old`` while open, else the one the gateway reconnects (bound)."""
    if old is not None and not old.closed.is_set():
        return old
    t = await tunnels.wait_tunnel(RUNNER)
    await bind(t, sid, agent_id)
    return t


async def test_fuzzed_tunnel_frames_and_event_bodies_are_answered_typed_and_nothing_restarts(
    host_factory, tunnels, server
) -> None:
    agent_id = server.add_agent(scripted_yaml("a", "{text: ok}"))
    sid = server.add_session(agent_id)["id"]
    host = host_factory(fuzz_host_config(tunnels, server))
    bad: list[str] = []
    async with running(host):
        t = await live_tunnel(tunnels, sid, agent_id, None)

        async def example(value: tuple[str, Any]) -> None:
            nonlocal t
            t = await live_tunnel(tunnels, sid, agent_id, t)
            kind, payload = value
            if kind == "raw":
                await t.send(payload)
                # A frame has no answer of its own: the tunnel (or its replacement) still does.
                t = await live_tunnel(tunnels, sid, agent_id, t)
                await t.ping(timeout=15)
                return
            method, path, body = payload
            if isinstance(body, Raw):
                answer = await t.request(
                    str(method), path, raw=bytes(body), encoding="base64", timeout=20
                )
            else:
                answer = await t.request(str(method), path, body, timeout=20)
            if (why := typed_refusal(answer.status, answer.body)) is not None:
                bad.append(f"{method} {path} {shown(body)}: {why}")

        await fuzz_in_thread(
            frames(sid)
            | event_bodies().map(lambda b: ("request", ("POST", f"/v1/sessions/{sid}/events", b))),
            example,
        )
        # The runner goes on: a good message runs a turn to its end (in a new session: the
        # fuzz may have deleted or stopped the first).
        t = await live_tunnel(tunnels, sid, agent_id, t)
        after = server.add_session(agent_id)["id"]
        await bind(t, after, agent_id)
        answer = await t.request(
            "POST", f"/v1/sessions/{after}/events", message("after", agent_id, "a")
        )
        assert answer.status == 202, answer.body
        await tunnels.until_status(after, timeout=30)
        assert restarts(host) == {}
        # The fuzz reached the gateway's frame parser (it counts what it refused).
        [tunnel] = host.status()["tunnels"]
        assert tunnel["malformed"] > 0 or EXAMPLES < 10, tunnel
    assert bad == []
    assert "Traceback" not in host.log()


# --- the control plane's client API ------------------------------------------------------------


def plane_requests(sid: str) -> st.SearchStrategy[tuple[str, str, Any]]:
    """Requests a client may send the control plane: event bodies above all (its own shape,
    ``{"type", "data"}``), new sessions and verdicts; any path under its session routes."""
    data_bodies = with_fields(
        {
            "type": st.sampled_from(["message", "approval", "interrupt", "stop_session"])
            | st.text(max_size=12),
            "data": json_values
            | with_fields({"content": json_values, "elicitation_id": json_values}),
        }
    )
    return st.one_of(
        st.tuples(
            st.just("POST"),
            st.just(f"/v1/sessions/{sid}/events"),
            data_bodies | json_values | raw_bodies(plane_message),
        ),
        st.tuples(st.just("POST"), st.just("/v1/sessions"), with_fields({"agent": json_values})),
        st.tuples(
            st.just("POST"),
            st.text(max_size=20).map(
                lambda e: f"/v1/sessions/{sid}/elicitations/{quote(e, safe='')}/resolve"
            ),
            with_fields({"action": st.sampled_from(["accept", "decline", "cancel"]) | json_values}),
        ),
        # A client's URL is printable ASCII: the odd characters go percent-encoded.
        st.tuples(
            st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH"]),
            paths(sid).map(lambda p: quote(p, safe="/%")),
            st.none() | json_values,
        ),
    )


async def test_fuzzed_control_plane_requests_are_answered_typed(
    tmp_path,
    agents_dir,  # the fixture of test_control_plane_bad_input.py
) -> None:
    bad: list[str] = []
    async with plane_running(tmp_path / "state", make_settings(agents_dir)) as ctx:
        runner = await ctx.runner()
        sid = (await ctx.create())["id"]
        await bound(runner, sid)

        async def example(value: tuple[str, str, Any]) -> None:
            method, path, body = value
            with trio.fail_after(20):
                if isinstance(body, Raw):
                    answer = await ctx.client.request(
                        method, path, content=bytes(body), headers=JSON_TYPE
                    )
                else:
                    answer = await ctx.client.request(method, path, json=body)
            if answer.status_code >= 500:
                bad.append(f"{method} {path} {shown(body)}: {answer.status_code}")
            elif answer.status_code >= 400:
                try:
                    payload = answer.json()
                    typed = bool(payload.get("error")) and bool(payload.get("detail"))
                except (ValueError, AttributeError):
                    typed = False
                if not typed:
                    bad.append(f"{method} {path}: {answer.status_code} {answer.text[:200]}")

        await fuzz_in_thread(plane_requests(sid), example)
        # Still serving: a good message is taken (in a new session: the fuzz may have
        # deleted the first).
        after = (await ctx.create())["id"]
        answer = await ctx.client.post(
            f"/v1/sessions/{after}/events", json={"type": "message", "data": {"content": "after"}}
        )
        assert answer.status_code == 202, answer.text
    assert bad == []


# --- agent specs and tool arguments ------------------------------------------------------------

TOOLS = [
    "sys_os_read", "sys_os_write", "sys_os_edit", "sys_os_shell", "sys_terminal_launch",
    "sys_terminal_send", "sys_terminal_read", "sys_terminal_list", "sys_terminal_close",
    "sys_call_async", "sys_cancel_async", "sys_read_inbox",
]  # fmt: skip
ARG_KEYS = ["command", "path", "content", "old", "new", "timeout", "terminal_id", "text",
            "id", "task_id", "name", "args", "offset", "limit", "keys"]  # fmt: skip


def _harmless(tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """Keep fuzzed tool calls from doing real harm on this machine: a shell or terminal
    command that is a string only ever echoes it, and writes stay under ``fuzz/`` (the
    containment of paths has tests of its own)."""
    out = dict(arguments)
    for key in ("command", "text", "keys"):
        if isinstance(out.get(key), str):
            out[key] = "echo " + shlex.quote(out[key])
    if tool in ("sys_os_write", "sys_os_edit") and isinstance(out.get("path"), str):
        out["path"] = "fuzz/" + out["path"].replace("..", "_").lstrip("/")
    if isinstance(out.get("timeout"), (int, float)):
        out["timeout"] = max(0, min(out["timeout"], 5))
    return out


tool_steps = st.builds(
    lambda tool, args: {
        "tool": tool,
        "arguments": _harmless(tool, args) if isinstance(args, dict) else args,
    },
    st.sampled_from(TOOLS) | st.text(max_size=20),
    st.dictionaries(st.sampled_from(ARG_KEYS) | st.text(max_size=8), json_values, max_size=4)
    | json_values,
)
#: Steps of any shape, but none that waits for someone (``elicit``: no one answers here),
#: hangs or crashes on purpose (their own tests), or sleeps long.
other_steps = (
    with_fields({"text": json_values})
    | with_fields({"text": st.text(max_size=20), "repeat": json_values, "chunk": json_values})
    | with_fields({"reasoning": json_values})
    | with_fields({"fail": json_values})
    | with_fields({"status": json_values})
    | with_fields({"serve": json_values})
    | with_fields({"sleep_ms": st.integers(min_value=-5, max_value=50) | st.text(max_size=5)})
    | st.dictionaries(
        st.text(max_size=10).filter(
            lambda k: k not in ("elicit", "hang", "crash", "sleep_ms", "delay_ms")
        ),
        json_values,
        max_size=2,
    )
)
scripts = st.lists(st.lists(tool_steps | other_steps, max_size=4), min_size=1, max_size=2)
scripted = with_fields(
    {"harness": st.just("scripted"), "script": st.fixed_dictionaries({"turns": scripts})}
)
executors = scripted | with_fields(
    {
        "harness": st.sampled_from(["scripted", "openai", "nope"]) | json_values,
        "script": json_values,
    }
)
#: Mostly specs that run (their scripts and tool calls are what is fuzzed), some that do not.
specs = st.one_of(
    scripted.map(lambda executor: json.dumps({"name": "fuzzed", "executor": executor})),
    scripted.map(lambda executor: json.dumps({"name": "fuzzed", "executor": executor})),
    st.builds(
        lambda executor, extra: json.dumps({**extra, "name": "fuzzed", "executor": executor}),
        executors,
        st.dictionaries(
            st.sampled_from(["prompt", "os_env", "policies", "tools", "model"]),
            json_values,
            max_size=2,
        ),
    ),
    st.text(max_size=300),
)


async def test_fuzzed_agent_specs_and_tool_arguments_end_each_turn_once(
    host_factory, tunnels, server
) -> None:
    # Fuzzed scripts crash their workers at will: no worker crash loop may refuse a turn.
    harness = "[actors.harness.options]\nworker_intensity = 10000\n"
    host = host_factory(fuzz_host_config(tunnels, server, harness))
    bad: list[str] = []
    turns: list[str] = []
    async with running(host):
        t = await tunnels.wait_tunnel(RUNNER)

        async def example(spec: str) -> None:
            nonlocal t
            if t.closed.is_set():
                t = await tunnels.wait_tunnel(RUNNER)
            agent_id = server.add_agent(spec, name="fuzzed")
            sid = server.add_session(agent_id)["id"]
            init = await t.request(
                "POST",
                "/v1/sessions",
                {"session_id": sid, "agent_id": agent_id, "sub_agent_name": None},
                timeout=20,
            )
            if (why := typed_refusal(init.status, init.body)) is not None or init.status != 201:
                bad.append(f"init for {spec[:300]}: {why or init.status}")
                return
            tunnels.bind(t.runner_id, sid, agent_id)
            await t.open_stream(sid)
            answer = await t.request(
                "POST", f"/v1/sessions/{sid}/events", message("go", agent_id, "fuzzed"), timeout=20
            )
            if (why := typed_refusal(answer.status, answer.body)) is not None:
                bad.append(f"message for {spec[:300]}: {why}")
                return
            if answer.status != 202:
                return  # refused, typed: no turn to end
            try:
                await tunnels.until(
                    lambda: any(s in ("idle", "failed") for s in tunnels.statuses(sid)), 30
                )
            except AssertionError:
                bad.append(f"no terminal edge within 30s for {spec[:300]}")
                return
            ends = [s for s in tunnels.statuses(sid) if s in ("idle", "failed")]
            turns.append(ends[0])
            if len(ends) != 1:
                bad.append(f"{len(ends)} terminal edges for {spec[:300]}")

        await fuzz_in_thread(specs, example)
        assert restarts(host) == {}
    assert bad == []
    # Fuzzing that refused every spec would test only the spec parser.
    assert "idle" in turns or EXAMPLES < 10, turns
    assert "Traceback" not in host.log()


# --- CLI input ---------------------------------------------------------------------------------

VERBS = [["status"], ["mailboxes"], ["dead-letters"], ["elicitations"], ["journal", "ls"],
         ["journal", "show"], ["journal", "summary"], ["agents"], ["send"]]  # fmt: skip
OPTIONS = ["--json", "--session", "--agent", "--timeout", "--approve", "--limit", "--after",
           "--actor", "-h", "--x"]  # fmt: skip
argvs = st.tuples(
    st.sampled_from(VERBS),
    st.lists(st.sampled_from(OPTIONS) | st.text(max_size=30), max_size=4),
)


def test_fuzzed_cli_input_exits_with_a_usage_or_typed_error(host_factory) -> None:
    host = host_factory("").start()
    runner = CliRunner()
    bad: list[str] = []

    @FUZZ
    @given(argvs)
    def each(value: tuple[list[str], list[str]]) -> None:
        verb, rest = value
        argv = [*verb, "--state-dir", str(host.state_dir), *rest]
        result = runner.invoke(cli, argv, catch_exceptions=True)
        crashed = result.exception is not None and not isinstance(result.exception, SystemExit)
        if crashed or result.exit_code not in (0, 1, 2, 3) or "Traceback" in result.output:
            bad.append(f"corral {shlex.join(argv)}: exit {result.exit_code} {result.exception!r}")

    each()
    assert bad == []
    assert restarts(host) == {}
