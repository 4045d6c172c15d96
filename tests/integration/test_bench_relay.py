"""``corral bench relay`` on tiny workloads: its SSE reading, its checks, a real run's shape."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from corral.bench import _omnigent, _omnigent_relay, relay
from corral.bench._tunnel_peer import PeerError, SessionStream
from tests.conftest import corral


def _delta(seq: int, turn: str = "t1") -> str:
    event = {
        "type": "response.output_text.delta",
        "delta": "x",
        "turn_id": turn,
        "sequence_number": seq,
    }
    return f"data: {json.dumps(event)}\n\n"


def test_a_stream_reads_several_events_per_frame_and_events_split_across_frames() -> None:
    stream = SessionStream("s")
    stream.feed('data: {"type": "session.heartbeat"}\n\n', 1.0)
    assert stream.ready.is_set() and stream.deltas == []
    two = _delta(3) + _delta(4)
    stream.feed(two[:40], 2.0)
    assert stream.deltas == []  # half an event waits for the rest
    stream.feed(two[40:], 3.0)
    stream.feed('data: {"type": "session.status", "status": "idle"}\n\n', 4.0)
    assert stream.deltas == [(3.0, "t1", 3), (3.0, "t1", 4)]
    assert stream.ends == [("idle", None)]
    assert stream.frames == 4 and stream.events == 4


def test_check_turn_refuses_missing_reordered_and_mixed_deltas() -> None:
    good = [(0.1, "t1", 3), (0.2, "t1", 4), (0.3, "t1", 5)]
    assert relay.check_turn(good, 3) == good
    with pytest.raises(PeerError, match=r"^session s: 2 of 3 deltas arrived$"):
        relay.check_turn(good[:2], 3, "s")
    with pytest.raises(PeerError, match=r"^session s: sequence number 4 arrived after 5$"):
        relay.check_turn([good[0], good[2], good[1]], 3, "s")
    with pytest.raises(PeerError, match="several turns"):
        relay.check_turn([*good[:2], (0.3, "t2", 5)], 3, "s")


def test_the_host_config_gives_the_runner_to_the_gateway_only() -> None:
    text = relay.host_config("http://127.0.0.1:9", [[{"text": "x", "repeat": 2}]], tap=True)
    assert 'subscribers = ["gateway", "bench-tap"]' in text
    assert 'script = {turns = [[{text = "x", repeat = 2}]]}' in text
    assert "[[actors.gateway.options.runners]]" in text and "[[runners]]" not in text


@pytest.mark.chaos
@pytest.mark.timeout(240)
async def test_deltas_reach_the_server_complete_and_in_order() -> None:
    deltas = 300
    turns = [relay.WARM_TURN, [{"text": "x", "repeat": deltas}]]
    async with relay.relay_host(turns) as host:
        ids = ["session-a", "session-b"]
        await relay.bind_all(host.peer, ids)
        await relay.run_turn(host.peer, ids, relay.WARM_DELTAS, 60)
        flooded = await relay.run_turn(host.peer, ids, deltas, 60)
    for sid in ids:
        seqs = [seq for _, _, seq in flooded[sid]]
        assert seqs == list(range(seqs[0], seqs[0] + deltas)), sid
        arrivals = [arrival for arrival, _, _ in flooded[sid]]
        assert arrivals == sorted(arrivals)


@pytest.mark.chaos
@pytest.mark.timeout(240)
async def test_a_tiny_run_has_the_cli_result_shape() -> None:
    sizes = relay.Sizes(
        baseline_frames=500,
        one_session_deltas=200,
        sessions=2,
        deltas_per_session=50,
        cold_sessions=2,
        paced_deltas=5,
        paced_delay_ms=20,
        single_paced_deltas=10,
        single_paced_delay_ms=5,
    )
    doc = await relay.measure(sizes)
    assert set(doc) == {"benchmark", "baseline", "results", "params"}
    assert doc["benchmark"] == "relay"
    assert set(doc["baseline"]) == {"name", "value", "unit"} and doc["baseline"]["value"] > 0
    names = [r["name"] for r in doc["results"]]
    assert len(names) == len(set(names)) == 12
    for row in doc["results"]:
        assert set(row) == {"name", "value", "unit", "ratio_to_baseline"}
        assert math.isfinite(row["value"]) and row["value"] > 0, row
    rates = [r for r in doc["results"] if r["unit"] == "msgs/s"]
    assert len(rates) == 2 and all(r["ratio_to_baseline"] > 0 for r in rates)
    assert doc["params"]["sessions"] == 2 and doc["params"]["cold_sessions"] == 2
    json.dumps(doc)  # the CLI prints it as JSON


def test_against_without_omnigent_fails_with_a_typed_error(tmp_path: Path) -> None:
    """No omnigent venv: ``--against`` says what is missing and how to install it."""
    env = {"CORRAL_OMNIGENT_VENV": str(tmp_path / "no-venv")}
    out = corral("bench", "relay", "--against", "--quick", "--json", env=env)
    assert out.returncode == 1, out.stderr
    doc = json.loads(out.stdout)
    assert doc["benchmark"] == "relay"
    assert doc["error"]["code"] == "not_runnable"
    assert "omnigent 0.19.1 is not installed" in doc["error"]["message"]
    assert str(tmp_path / "no-venv") in doc["error"]["message"]
    assert out.stderr.startswith("error: omnigent 0.19.1 is not installed")
    # A command of its own needs the server all the same.
    out = corral("bench", "relay", "--against", "my-runner --fast", env=env)
    assert out.returncode == 1 and "not installed" in out.stderr and out.stdout == ""


def test_against_is_an_option_of_relay_only() -> None:
    out = corral("bench", "bus", "--against", "omnigent", "--json")
    assert out.returncode == 2 and "--against is an option of relay only" in out.stderr


def test_deltas_is_an_option_of_relay_alone() -> None:
    for args in (["bus"], ["relay", "--against", "omnigent"]):
        out = corral("bench", *args, "--deltas", "5", "--json")
        assert out.returncode == 2, args
        assert "--deltas is an option of relay only (without --against)" in out.stderr


def test_deltas_sizes_the_one_sessions_flood(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[relay.Sizes] = []

    async def measure(sizes: relay.Sizes) -> dict[str, object]:
        seen.append(sizes)
        return {}

    monkeypatch.setattr(relay, "measure", measure)
    relay.run({"quick": True, "deltas": 1_000_000})
    relay.run({"quick": True})
    assert [s.one_session_deltas for s in seen] == [1_000_000, 20_000]
    assert seen[0] == dataclasses.replace(seen[1], one_session_deltas=1_000_000)


def test_the_other_runner_gets_omnigents_runner_environment(tmp_path: Path) -> None:
    """What CMD is started with: the four variables ``omnigent run --server`` sets, omnigent's
    files under a HOME of its own, and none of the caller's OMNIGENT_/CORRAL_ settings."""
    env = _omnigent.runner_env("http://127.0.0.1:9", "tok", tmp_path / "ws", tmp_path / "home")
    assert env["RUNNER_SERVER_URL"] == "http://127.0.0.1:9"
    assert env["OMNIGENT_RUNNER_ID"] == _omnigent.runner_id_for("tok")
    assert env["OMNIGENT_RUNNER_ID"].startswith("runner_token_")
    assert env["OMNIGENT_RUNNER_TUNNEL_BINDING_TOKEN"] == "tok"
    assert env["OMNIGENT_RUNNER_WORKSPACE"] == str(tmp_path / "ws")
    assert env["HOME"] == str(tmp_path / "home")
    assert env["OMNIGENT_CONFIG_HOME"] == str(tmp_path / "home" / ".omnigent")
    assert not [k for k in env if k.startswith("CORRAL_")]
    names = [c.name for c in _omnigent_relay.contenders("", tmp_path)]
    assert names == ["corral", "omnigent 0.19.1 runner"]
    assert [c.name for c in _omnigent_relay.contenders("./run.sh -v", tmp_path)][1] == "./run.sh -v"


def test_against_needs_two_cold_sessions_for_its_per_session_memory() -> None:
    """The PSS per added session is the growth from the first cold session to the last."""
    assert _omnigent_relay.AgainstSizes.quick().cold_sessions >= 2
    assert _omnigent_relay.AgainstSizes.full().cold_sessions >= 2
    with pytest.raises(ValueError, match="two cold sessions"):
        dataclasses.replace(_omnigent_relay.AgainstSizes.quick(), cold_sessions=1)
