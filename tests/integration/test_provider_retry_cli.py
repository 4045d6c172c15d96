"""A provider retried, as a user sees it: the openai worker's ``response.retry`` event (the
real server's shape) reaches ``corral send`` through the host and the control plane, which
prints a status line with the attempt count while the turn waits."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import trio

from tests.conftest import FAST_LIVENESS, HostProcess, corral
from tests.fake_openai import FakeOpenAI, Reply, error, responses_events
from tests.integration.test_e2e import _start, _stop


async def test_send_shows_each_retry_of_the_model_call(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    llm = FakeOpenAI()
    await llm.start(nursery)
    agents = tmp_path / "agents"
    agents.mkdir()
    (agents / "flaky.yaml").write_text(
        textwrap.dedent(f"""\
            name: flaky
            executor:
              harness: openai-agents
              model: m
              auth: {{type: api_key, api_key: k, base_url: {llm.base_url}}}
              max_attempts: 3
            prompt: terse
            """)
    )
    llm.queue(
        error(429, "slow down", **{"retry-after": "0.2"}),
        error(503, "busy", **{"retry-after": "0.1"}),
        Reply(frames=responses_events("m", ["fine ", "now"])),
    )
    host = HostProcess(
        tmp_path / "state", FAST_LIVENESS + f"[server]\nagents_dirs = [{json.dumps(str(agents))}]\n"
    )
    try:
        await trio.to_thread.run_sync(_start, host)
        state = str(host.state_dir)
        out = await trio.to_thread.run_sync(
            lambda: corral("send", "--agent", "flaky", "hi", "--state-dir", state)
        )
        assert out.returncode == 0, out
        assert out.stdout == "fine now\n"
        lines = [line for line in out.stderr.splitlines() if "retrying" in line]
        assert lines == [
            "retrying the model call in 0.2s (attempt 2 of 3): 127.0.0.1 returned HTTP 429: "
            "slow down",
            "retrying the model call in 0.1s (attempt 3 of 3): 127.0.0.1 returned HTTP 503: busy",
        ]
        llm.queue(error(500, "down"), Reply(frames=responses_events("m", ["ok"])))
        doc = json.loads(
            (
                await trio.to_thread.run_sync(
                    lambda: corral(
                        "send", "--agent", "flaky", "again", "--json", "--state-dir", state
                    )
                )
            ).stdout
        )
        [retry] = [e for e in doc["events"] if e["type"] == "response.retry"]
        assert (retry["source"], retry["attempt"], retry["max_attempts"]) == ("llm", 2, 3)
        assert retry["error"] == {
            "code": "provider_retry",
            "message": "127.0.0.1 returned HTTP 500: down",
        }
    finally:
        await trio.to_thread.run_sync(_stop, host)
