"""The CLI's plumbing on its own: picking an id by its prefix, telling a failure once, and
the colours of the states ``corral status`` shows."""

from __future__ import annotations

import json

import click
import pytest

from corral.cli._errors import CliError, NoHost, report, wants_json
from corral.cli._inspect import styled
from corral.cli._output import pick

IDS = ["0a1b-1", "0a1b-2", "ff00-9"]


def test_pick_takes_a_whole_id_or_a_unique_prefix() -> None:
    assert pick("0a1b-1", IDS, "dead letter") == "0a1b-1"
    assert pick("ff", IDS, "dead letter") == "ff00-9"
    # An id that is also the prefix of another is itself.
    assert pick("ab", ["ab", "abc"], "session") == "ab"


def test_pick_an_ambiguous_prefix_exits_2_naming_the_candidates() -> None:
    with pytest.raises(CliError) as caught:
        pick("0a1b", IDS, "dead letter")
    assert caught.value.exit_code == 2 and caught.value.code == "ambiguous_id"
    assert caught.value.message == "dead letter '0a1b' is ambiguous: it begins 0a1b-1, 0a1b-2"


def test_pick_an_unknown_id_exits_1_naming_it_and_what_exists() -> None:
    with pytest.raises(CliError) as caught:
        pick("zz", IDS, "dead letter")
    assert caught.value.exit_code == 1 and caught.value.code == "not_found"
    assert caught.value.message == "no dead letter 'zz' (dead letters here: " + ", ".join(IDS) + ")"
    with pytest.raises(CliError, match=r"^no mailbox 'x' \(mailboxes here: none\)$"):
        pick("x", [], "mailbox", "mailboxes")
    with pytest.raises(CliError, match=r"^no session ''"):
        pick("", IDS, "session")


def test_wants_json_stops_at_a_double_dash() -> None:
    assert wants_json(["status", "--json"])
    assert not wants_json(["send", "--", "--json"])
    assert not wants_json(["status"])


def test_report_is_one_line_and_under_json_one_document(
    capsys: pytest.CaptureFixture[str],
) -> None:
    long = "no running host found on /" + "x" * 200
    report(NoHost(long, document={"sessions": []}), as_json=True)
    out, err = capsys.readouterr()
    assert json.loads(out) == {"sessions": [], "error": {"code": "no_host", "message": long}}
    assert err == f"error: {long}\n"
    report(click.ClickException("boom"), as_json=False)
    out, err = capsys.readouterr()
    assert (out, err) == ("", "error: boom\n")


def test_states_have_their_colours() -> None:
    assert styled("running").style == "green"
    assert styled("reconnecting").style == "yellow"
    assert styled("failed").style == "bold red"
    assert str(styled(None)) == "-"
