"""``while_unavailable``: asking an unavailable server again, bounded and cancellable (#15).

On trio's autojump clock: the waits are the helper's own, and the times are its schedule.
"""

from __future__ import annotations

import itertools

import httpx
import pytest
import trio
import trio.testing

from corral._exceptions import ServerRejected, ServerTimeout, ServerUnavailable
from corral.server_client import ServerClient
from corral.server_wait import SERVER_WAIT_S, WAIT_FIRST_S, WAIT_MAX_S, while_unavailable

EVENT = {"event": {"type": "PHASE_TOOL_CALL", "data": {"name": "x", "arguments": {}}}}


class _Failing:
    """An ``ask`` that always raises ``error``, counting its calls."""

    def __init__(self, error: Exception) -> None:
        self.error, self.asks = error, 0

    async def __call__(self) -> None:
        self.asks += 1
        raise self.error


def _evaluator(statuses: list[int]) -> tuple[ServerClient, list[float]]:
    """A client whose server answers the evaluations with ``statuses`` in turn (then 200), and
    when each one came."""
    asked: list[float] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(trio.current_time())
        status = statuses.pop(0) if statuses else 200
        return httpx.Response(status, json={"result": "POLICY_ACTION_ALLOW"})

    return ServerClient("http://server", transport=httpx.MockTransport(answer)), asked


async def test_an_evaluation_met_by_a_503_is_asked_again_with_backoff_until_answered(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # A 503 on a POST is raised by the client at once (it may have acted): the wait is here.
    client, asked = _evaluator([503, 502, 504, 503])
    async with client:
        answer = await while_unavailable(
            lambda: client.evaluate_policy("s1", EVENT), what="eval", wait_s=SERVER_WAIT_S
        )
    assert answer == {"result": "POLICY_ACTION_ALLOW"}
    gaps = [round(b - a, 3) for a, b in itertools.pairwise(asked)]
    assert gaps == [WAIT_FIRST_S, 0.5, 1.0, WAIT_MAX_S]


async def test_a_server_that_never_comes_back_is_given_up_on_within_the_bound(
    autojump_clock: trio.testing.MockClock,
) -> None:
    client, asked = _evaluator([503] * 1000)
    async with client:
        with pytest.raises(ServerUnavailable) as raised:
            await while_unavailable(
                lambda: client.evaluate_policy("s1", EVENT), what="eval", wait_s=SERVER_WAIT_S
            )
    assert raised.value.status == 503
    # It stops short of an ask past the bound, and asks over most of it.
    assert SERVER_WAIT_S - WAIT_MAX_S < asked[-1] - asked[0] <= SERVER_WAIT_S


@pytest.mark.parametrize("status", [400, 404, 500])
async def test_an_answer_that_refuses_is_not_asked_again(
    autojump_clock: trio.testing.MockClock, status: int
) -> None:
    client, asked = _evaluator([status])
    async with client:
        with pytest.raises(ServerRejected):
            await while_unavailable(
                lambda: client.evaluate_policy("s1", EVENT), what="eval", wait_s=SERVER_WAIT_S
            )
    assert len(asked) == 1


async def test_a_timed_out_held_call_is_not_asked_again_when_timeouts_are_off(
    autojump_clock: trio.testing.MockClock,
) -> None:
    ask = _Failing(ServerTimeout("POST /x: no answer in time", method="POST", path="/x"))
    with pytest.raises(ServerTimeout):
        await while_unavailable(ask, what="held", wait_s=SERVER_WAIT_S, timeouts=False)
    assert ask.asks == 1
    ask.asks = 0
    with pytest.raises(ServerTimeout):
        await while_unavailable(ask, what="held", wait_s=SERVER_WAIT_S)
    assert ask.asks > 1


async def test_the_wait_stops_once_nobody_wants_the_answer_and_is_cancellable(
    autojump_clock: trio.testing.MockClock,
) -> None:
    ask = _Failing(ServerUnavailable("GET /x: ConnectError", method="GET", path="/x"))
    # Wanted after the first failure, not after the second: asked twice, one wait between.
    with pytest.raises(ServerUnavailable):
        await while_unavailable(ask, what="gone", wait_s=SERVER_WAIT_S, wanted=lambda: ask.asks < 2)
    assert ask.asks == 2
    assert trio.current_time() == pytest.approx(WAIT_FIRST_S)
    start = trio.current_time()
    with trio.move_on_after(1.0) as scope:
        await while_unavailable(ask, what="cancelled", wait_s=SERVER_WAIT_S)
    assert scope.cancelled_caught
    assert trio.current_time() - start == pytest.approx(1.0)
