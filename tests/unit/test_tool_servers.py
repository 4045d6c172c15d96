"""The tools actor asks the server of the call's runner id: sessions bound through runner ids
of different servers reach their own (T-26; docs/security.md, runner isolation)."""

from __future__ import annotations

from corral.config import RunnerSettings
from corral.tools.servers import Servers


async def test_each_runner_id_reaches_its_own_server() -> None:
    servers = Servers(
        [
            RunnerSettings(server="http://one.invalid", id="r1", token="t1"),
            RunnerSettings(server="http://two.invalid/prefix", id="r2", token="t2"),
        ]
    )
    try:
        one, two = servers.for_runner("r1"), servers.for_runner("r2")
        assert one is not None and one.base_url == "http://one.invalid"
        assert two is not None and two.base_url == "http://two.invalid/prefix"
        # A runner id of no server known here, among several: no server rather than a guess.
        assert servers.for_runner("r3") is None and servers.for_runner(None) is None
    finally:
        await servers.aclose()


async def test_the_only_runner_s_server_and_an_explicit_one() -> None:
    only = Servers([RunnerSettings(server="http://one.invalid", id="r1")])
    explicit = Servers(
        [RunnerSettings(server="http://one.invalid", id="r1")], server_url="http://x.invalid"
    )
    try:
        assert only.for_runner(None) is only.for_runner("r1") is not None
        chosen = explicit.for_runner("r1")
        assert chosen is not None and chosen.base_url == "http://x.invalid"
        assert Servers([]).for_runner("r1") is None
    finally:
        await only.aclose()
        await explicit.aclose()
