"""What a process imports: lazy package exports (corral/_lazy.py) give an actor's messages
without the actor, and no corral process imports httpx's command-line tool."""

from __future__ import annotations

import subprocess
import sys

import pytest

import corral.actors.dispatch as dispatch
from corral.actors.dispatch._actor import DispatchActor


def _loaded_after(statement: str, prefix: str = "corral") -> set[str]:
    """The modules under ``prefix`` a fresh interpreter has loaded after ``statement``."""
    out = subprocess.run(
        [sys.executable, "-c", f"{statement}; import sys; print(*sorted(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return {m for m in out.stdout.split() if m.split(".")[0] == prefix}


@pytest.mark.parametrize(
    ("statement", "not_loaded"),
    [
        ("import corral.actors.tools", "corral.actors.dispatch._actor"),
        ("import corral.actors.policy._actor", "corral.actors.dispatch._actor"),
        ("import corral.actors.dispatch.messages", "corral.actors.gateway._tunnel"),
    ],
)
def test_importing_an_actors_messages_does_not_load_the_actor(
    statement: str, not_loaded: str
) -> None:
    loaded = _loaded_after(statement)
    assert not_loaded not in loaded
    assert loaded  # the statement did run


@pytest.mark.parametrize("statement", ["import corral.server_client", "import corral.actors.host"])
def test_speaking_http_does_not_import_httpxs_command_line_tool(statement: str) -> None:
    """httpx imports its CLI (with rich and pygments) when click is installed; every actor
    process that speaks HTTP paid ~70 ms of CPU for it."""
    assert _loaded_after(statement, "httpx")  # httpx itself is loaded
    assert not _loaded_after(statement, "rich")
    assert not _loaded_after(statement, "pygments")


def test_a_lazy_name_is_the_submodules_and_unknown_names_are_attribute_errors() -> None:
    assert dispatch.DispatchActor is DispatchActor
    assert "DispatchActor" in dir(dispatch) and "Session" in dir(dispatch)
    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        dispatch.__getattr__("Nope")
