"""Every CLI command of the foundation against a live host, JSON parsed and checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from corral import __version__
from corral.bus import open_peer
from corral.config import BUILTIN_ACTORS, LivenessSettings
from tests._echo import EchoRecord, EchoSleep
from tests.conftest import HostProcess, corral

#: These tests talk to the test-only echo actor (tests/_echo.py); their hosts run it.
RUNS_ECHO = True
#: The tests that only look at a host share one (tests/conftest.py).
SHARE_HOST = True

FAST = LivenessSettings(interval_s=0.2, liveness=3)


def test_version() -> None:
    out = corral("--version")
    assert out.returncode == 0
    assert __version__ in out.stdout


@pytest.mark.fresh_host  # it checks the host's uptime and the echo actor's restart count
def test_status_json(host: HostProcess) -> None:
    out = corral("status", "--json", "--state-dir", str(host.state_dir))
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["host"]["pid"] == host.proc.pid  # type: ignore[union-attr]
    assert data["host"]["state_dir"] == str(host.state_dir)
    assert data["host"]["version"] == __version__
    assert data["host"]["uptime_s"] > 0
    names = [a["name"] for a in data["actors"]]
    # The built-ins in start order, then the configured extras: here the test-only echo.
    assert names == [*BUILTIN_ACTORS, "echo"]
    echo = data["actors"][-1]
    assert echo["state"] == "running"
    assert echo["restarts"] == 0
    assert echo["last_exit"] is None
    assert isinstance(echo["pid"], int) and echo["uptime_s"] >= 0
    # The actors are forked from the host's zygote (#20); one it cannot fork is exec'd.
    zygote = data["host"]["zygote"]
    assert isinstance(zygote["pid"], int) and not zygote["gave_up"]
    assert zygote["forked"] >= 1 and zygote["forked"] + zygote["exec"] >= len(names)


def test_a_default_host_runs_no_echo_actor(host_factory) -> None:
    h = host_factory(echo=False).start()
    try:
        out = corral("status", "--json", "--state-dir", str(h.state_dir))
        assert out.returncode == 0, out.stderr
        assert [a["name"] for a in json.loads(out.stdout)["actors"]] == list(BUILTIN_ACTORS)
        assert "echo" not in BUILTIN_ACTORS
    finally:
        h.stop()


def test_status_table_for_humans(host: HostProcess) -> None:
    out = corral("status", env={"CORRAL_STATE_DIR": str(host.state_dir)})
    assert out.returncode == 0, out.stderr
    assert "echo" in out.stdout and "running" in out.stdout
    assert "zygote pid " in out.stdout and "forked " in out.stdout


@pytest.mark.fresh_host  # it leaves durable work queued on the echo actor
async def test_mailboxes_json_with_peek(host: HostProcess) -> None:
    async with open_peer("client", host.endpoint, liveness=FAST) as peer:
        await peer.cast("echo", EchoSleep(seconds=5), durable=True, session_id="s1")
        await peer.cast("echo", EchoRecord(key="a"), durable=True, session_id="s1")
    out = await trio.to_thread.run_sync(
        lambda: corral(
            "mailboxes", "echo", "--peek", "5", "--json", "--state-dir", str(host.state_dir)
        )
    )
    assert out.returncode == 0, out.stderr
    (row,) = json.loads(out.stdout)["mailboxes"]
    assert row["actor"] == "echo"
    assert row["queued"] + row["in_flight"] == 2
    assert row["parked"] == 0 and row["dead_letters"] == 0
    assert row["oldest_age_s"] >= 0
    assert [p["type"] for p in row["peek"]] == ["echo.sleep", "echo.record"]
    assert all(p["session_id"] == "s1" and p["attempts"] == 1 for p in row["peek"])


def test_dead_letters_json(host: HostProcess) -> None:
    out = corral("dead-letters", "--json", "--state-dir", str(host.state_dir))
    assert out.returncode == 0
    assert json.loads(out.stdout) == {"dead_letters": []}


def test_no_host_exits_3(tmp_path: Path) -> None:
    """Nothing on stdout but, under --json, the one error document (#19)."""
    for args in (["status", "--json"], ["mailboxes"], ["dead-letters", "--json"]):
        out = corral(*args, "--state-dir", str(tmp_path / "nothing"))
        assert out.returncode == 3, (args, out)
        assert "no running host found" in out.stderr
        if "--json" in args:
            assert json.loads(out.stdout)["error"]["code"] == "no_host"
        else:
            assert out.stdout == ""


def test_invalid_config_exits_2_naming_the_key(tmp_path: Path) -> None:
    cfg = tmp_path / "corral.toml"
    cfg.write_text("[liveness]\ninterval_s = -1\n")
    out = corral("up", "--config", str(cfg), "--state-dir", str(tmp_path / "s"))
    assert out.returncode == 2
    assert "liveness.interval_s" in out.stderr
    cfg.write_text("[bus]\nhwm = 'lots'\n")
    out = corral("up", "--config", str(cfg), "--state-dir", str(tmp_path / "s"))
    assert out.returncode == 2
    assert "Expected `int`, got `str` - at `$.bus.hwm`" in out.stderr
    cfg.write_text("[bus]\nhwn = 1\n")
    out = corral("up", "--config", str(cfg), "--state-dir", str(tmp_path / "s"))
    assert out.returncode == 2
    assert "unknown field `hwn`" in out.stderr


@pytest.mark.parametrize(
    ("actor", "typo"),
    [
        ("journal", "fsnyc"),
        ("harness", "idle_timout_s"),
        ("tools", "timout_s"),
        ("policy", "ask_timout_s"),
        ("dispatch", "turn_timout_s"),
        ("gateway", "heartbeat"),
    ],
)
def test_a_typo_in_an_actors_options_exits_2_naming_the_key_before_anything_starts(
    tmp_path: Path, actor: str, typo: str
) -> None:
    """``corral up`` decodes every built-in actor's options itself: no crash-looping child."""
    cfg = tmp_path / "corral.toml"
    cfg.write_text(f"[actors.{actor}.options]\n{typo} = 5\n")
    state = tmp_path / "s"
    out = corral("up", "--config", str(cfg), "--state-dir", str(state))
    error = " ".join(out.stderr.split())  # as one line, however the terminal wrapped it
    assert out.returncode == 2, out.stderr
    assert f"invalid config: Object contains unknown field `{typo}`" in error
    assert f"- at `$.actors.{actor}.options`" in error
    assert not state.exists(), "nothing was started, not even the state dir"


def test_a_bad_option_value_names_its_key(tmp_path: Path) -> None:
    cfg = tmp_path / "corral.toml"
    cfg.write_text("[actors.dispatch.options]\nturn_timeout_s = 'soon'\n")
    out = corral("up", "--config", str(cfg), "--state-dir", str(tmp_path / "s"))
    assert out.returncode == 2, out.stderr
    error = " ".join(out.stderr.split())
    assert "Expected `float`, got `str` - at `$.actors.dispatch.options.turn_timeout_s`" in error


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ("max_buffered_events = 1024", "max_buffered_events"),
        ("recycle_min_s = 5.0\nrecycle_max_s = 1.0", "recycle_min_s"),
    ],
)
def test_gateway_options_at_odds_stop_corral_up_before_anything_starts(
    tmp_path: Path, options: str, key: str
) -> None:
    """Two gateway options each valid alone, not together (the buffer's bound at or below
    the replay window it must hold; a recycle range upside down): ``corral up`` names the key
    and starts nothing, where the gateway used to crash-loop under a host that was up."""
    cfg = tmp_path / "corral.toml"
    cfg.write_text(f"[actors.gateway.options]\n{options}\n")
    state = tmp_path / "s"
    out = corral("up", "--config", str(cfg), "--state-dir", str(state))
    assert out.returncode == 2, out.stderr
    assert f"invalid gateway options: {key}" in " ".join(out.stderr.split())
    assert not state.exists(), "nothing was started, not even the state dir"


def test_control_socket_is_private(host: HostProcess) -> None:
    assert host.instance.control_path.stat().st_mode & 0o777 == 0o600
