"""How ``corral bench`` ends when a run cannot go on: a typed error, never a traceback."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from corral.bench import relay
from corral.bench._tunnel_peer import PeerError
from corral.cli._bench import bench_command
from corral.cli._errors import CliError


def test_a_run_the_server_breaks_off_is_a_typed_error_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A benchmark that cannot go on (a server answering 503 to a session's binding, say)
    ends with ``bench_failed`` and what the server said, exit 1, never a traceback."""

    def broken(params: dict[str, Any]) -> Any:
        raise PeerError("binding s1 to r1: 503 runner_unavailable")

    monkeypatch.setattr(relay, "run", broken)
    out = CliRunner().invoke(bench_command, ["relay", "--json"], standalone_mode=False)
    assert isinstance(out.exception, CliError), out.output
    assert out.exception.code == "bench_failed" and out.exception.exit_code == 1
    assert "503 runner_unavailable" in out.exception.message
